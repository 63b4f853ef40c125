"""Batch axes found on load (issue #38): time-major models batch along axis 1, a graph with no
common batch axis is served whole (``max_batch_size`` 0), ``batch_axis`` in config.json, and a
probe that settles input ranks so that a model MXNet runs has its test inference run."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine
from engine import sym
from engine.errors import InputError
from engine.serving.batcher import BatchingPolicy, DynamicBatcher
from engine.serving.config import ModelConfig, parse_config
from engine.serving.errors import InvalidModel
from engine.serving.probe import probe
from engine.serving.repository import ModelRepository
from engine.serving.validate import (
    Validated,
    as_graph,
    checks_of,
    complete_inputs,
    default_loader,
    load_and_validate,
)
from tests.conformance.fixtures import assert_close, model_files, model_io_sets, serving_names
from tests.engine.serving.helpers import run

TOLERANCE = {"rtol": 1e-3, "atol": 1e-5}  # RNN models need 1e-3 (see tests/conformance)
LSTM, GRU = "gluonnlp_lstm_lm_tnc", "gluonnlp_gru_lm_tnc"
BERT, TRANSFORMER = "gluonnlp_bert_masked", "gluonnlp_transformer_small"


def _validate(name: str, config: ModelConfig | None = None) -> Validated:
    symbol, params = model_files(name)

    def loader(_symbol: Path, _params: Path, *, device: str) -> Any:
        return default_loader(symbol, params, device=device)

    return load_and_validate(Path("unused"), config or ModelConfig(), loader=loader,
                             device="cpu", where=f"upload of {name}")


def _symbol_model(symbol: Any, **params: np.ndarray) -> Any:
    return engine.load_model(symbol, params, keep_batch=True)


def _validate_symbol(symbol: Any, config: ModelConfig | None = None,
                     **params: np.ndarray) -> Validated:
    def loader(_symbol: Path, _params: Path, *, device: str) -> Any:
        return engine.load_model(symbol, params, device=device, keep_batch=True)

    return load_and_validate(Path("unused"), config or ModelConfig(), loader=loader,
                             device="cpu", where="upload")


def _axes(validated: Validated) -> tuple[list[int], list[int]]:
    config = validated.config
    assert config.inputs is not None and config.outputs is not None
    return ([tensor.axis for tensor in config.inputs],
            [tensor.axis for tensor in config.outputs])


def test_the_serving_fixtures_are_the_four_of_the_issue() -> None:
    assert serving_names() == sorted([BERT, GRU, LSTM, TRANSFORMER])


@pytest.mark.parametrize("name, inputs, outputs", [
    (GRU, [1], [1, 1]), (LSTM, [1, 1, 1], [1, 1, 1]),
    (BERT, [0, 0, 0, 0], [0, 0, 0, 0]), (TRANSFORMER, [0, 0, 0, 0], [0])])
def test_batch_axes_follow_the_graph(name: str, inputs: list[int], outputs: list[int]) -> None:
    validated = _validate(name)
    assert validated.config.max_batch_size == 32
    assert _axes(validated) == (inputs, outputs)
    config = validated.config
    assert config.inputs is not None and config.outputs is not None
    for tensor in (*config.inputs, *config.outputs):
        assert tensor.shape is not None and tensor.shape[tensor.axis] == -1, tensor
    checks = checks_of(validated.model)
    assert checks is not None and checks.sample is not None
    recorded = checks.as_dict()["batch_axes"]
    assert recorded["batched"] is True
    assert list(recorded["inputs"].values()) == inputs


def test_a_time_major_model_keeps_its_fixed_dimensions_and_opens_the_batch() -> None:
    config = _validate(LSTM).config
    assert config.inputs is not None and config.outputs is not None
    assert [tensor.shape for tensor in config.inputs] == [(-1, -1), (2, -1, 32), (2, -1, 32)]
    assert [tensor.shape for tensor in config.outputs] == [(-1, -1, 100), (2, -1, 32),
                                                           (2, -1, 32)]


def test_the_masked_positions_take_the_rank_that_runs() -> None:
    """Shape inference accepts BERT's masked positions at rank 1, but then leaves a slice of
    their shape_array without a shape; the probe tries them longer and the test run runs."""
    validated = _validate(BERT)
    config = validated.config
    assert config.inputs is not None
    assert [tensor.shape for tensor in config.inputs] == [(-1, -1), (-1, -1), (-1,), (-1, -1)]
    assert config.outputs is not None  # the decoder's vocabulary, known at the settled rank
    assert [tensor.shape for tensor in config.outputs] == [(-1, -1, 64), (-1, 64), (-1, 2),
                                                           (-1, -1, 100)]
    checks = checks_of(validated.model)
    assert checks is not None and checks.skipped is None
    assert checks.sample == {"data0": (1, 1), "data1": (1, 1), "data2": (1,), "data3": (1, 1)}


def test_the_rank_found_first_leaves_a_shape_unknown() -> None:
    """The premise of the test above: at the rank shape inference gives, no plan compiles."""
    symbol, params = model_files(BERT)
    model = default_loader(symbol, params)
    inputs = as_graph(complete_inputs(None, model, "here"))
    assert inputs[3].shape == (-1,)
    found = probe(model, inputs)  # no input may grow: nothing runs
    assert found.sample is None and found.skipped is not None
    assert "bertmodel0_slice1" in found.skipped and "unknown" in found.skipped
    unknown = model.unknown_shape({"data0": (1, 4), "data1": (1, 4), "data2": (1,),
                                   "data3": (1,)})
    assert unknown is not None and unknown.inputs == ("data3",)


@pytest.mark.parametrize("name", [GRU, LSTM, BERT, TRANSFORMER])
def test_served_in_batches_of_1_and_4_with_mxnets_outputs(tmp_path: Path, name: str) -> None:
    """Through the repository and its batcher: MXNet's batch of 4 as one request, and as four
    requests of one row joined by the batcher along the batch axis and split back."""
    async def main() -> None:
        symbol, params = model_files(name)
        config = {"dynamic_batching": {"max_queue_delay_us": 5_000_000,
                                       "preferred_batch_sizes": [4]}}
        repo = ModelRepository(tmp_path / "repo")
        await repo.start()
        try:
            await repo.add_version(name, symbol.read_bytes(), params.read_bytes(), config=config)
            handle = repo.get(name)
            in_axes = {tensor.name: tensor.axis for tensor in handle.config.inputs}
            out_axes = [tensor.axis for tensor in handle.config.outputs]
            for inputs, expected in model_io_sets(name):
                outputs = await handle.infer(inputs)
                for got, want in zip(outputs.values(), expected):
                    assert_close(got, want, TOLERANCE, name)
            inputs, expected = model_io_sets(name)[1]
            batches_before = handle.batcher.stats.batches
            rows = [{key: np.take(array, [row], axis=in_axes[key])
                     for key, array in inputs.items()} for row in range(4)]
            answers = await asyncio.gather(*(handle.infer(row) for row in rows))
            assert handle.batcher.stats.batches == batches_before + 1  # joined: one batch
            for row, answer in enumerate(answers):
                for got, want, axis in zip(answer.values(), expected, out_axes):
                    assert_close(got, np.take(want, [row], axis=axis), TOLERANCE,
                                 f"{name} row {row}")
        finally:
            await repo.close()

    run(main())


def _no_common_axis() -> Any:
    """An output reduced over axis 0 beside one that keeps it: no axis follows the batch in
    both (the sum's rows are all of the inputs' first dimension)."""
    data = sym.var("data")
    return sym.Group([data * 2, sym.sum(data, axis=0, keepdims=True)])


def test_without_a_common_batch_axis_the_model_is_served_whole() -> None:
    validated = _validate_symbol(_no_common_axis())
    config = validated.config
    assert config.max_batch_size == 0 and config.inputs is not None
    assert all(tensor.batch_axis is None for tensor in (*config.inputs, *(config.outputs or ())))
    checks = checks_of(validated.model)
    assert checks is not None and checks.sample is not None
    recorded = checks.as_dict()["batch_axes"]
    assert recorded["batched"] is False and "share no batch axis" in recorded["reason"]


def test_without_a_common_batch_axis_a_stated_max_batch_size_is_refused() -> None:
    with pytest.raises(InvalidModel, match=r"share no batch axis .* max_batch_size 8; set "
                                           r"max_batch_size 0"):
        _validate_symbol(_no_common_axis(), ModelConfig(max_batch_size=8))


def test_max_batch_size_0_serves_whole_shapes_one_request_at_a_time(tmp_path: Path) -> None:
    async def main() -> None:
        repo = ModelRepository(tmp_path / "repo")
        await repo.start()
        try:
            symbol, params = model_files(GRU)
            await repo.add_version(GRU, symbol.read_bytes(), params.read_bytes(),
                                   config={"max_batch_size": 0})
            handle = repo.get(GRU)
            assert handle.config.inputs[0].shape == (-1, -1)
            inputs, expected = model_io_sets(GRU)[1]
            outputs = await handle.infer(inputs, rows=1)
            for got, want in zip(outputs.values(), expected):
                assert_close(got, want, TOLERANCE, GRU)
        finally:
            await repo.close()

    run(main())


def test_batch_axis_stated_in_the_config_is_served() -> None:
    """A graph that batches along either axis takes the one config.json states."""
    data = sym.var("data")
    config = parse_config({"inputs": [{"name": "data", "batch_axis": 1}],
                           "outputs": [{"name": "out", "source": "relu0_output",
                                        "batch_axis": 1}]}, "config.json")
    validated = _validate_symbol(sym.relu(data * 3, name="relu0"), config)
    assert _axes(validated) == ([1], [1])
    assert validated.config.inputs[0].shape == (-1, -1)
    assert validated.model.batch_axes == {"data": 1, "relu0_output": 1}


def test_batch_axis_is_checked_against_the_shape() -> None:
    with pytest.raises(InvalidModel, match=r"inputs.0.batch_axis 2 is not a dimension of shape"):
        parse_config({"inputs": [{"name": "x", "shape": [4, -1], "batch_axis": 2}]}, "c")
    with pytest.raises(InvalidModel, match=r"inputs.0.shape \[4, -1\] must have -1 at axis 0"):
        parse_config({"inputs": [{"name": "x", "shape": [4, -1], "batch_axis": 0}]}, "c")
    with pytest.raises(InvalidModel, match=r"max_batch_size 0 means no batch dimension"):
        parse_config({"max_batch_size": 0, "inputs": [{"name": "x", "batch_axis": 1}]}, "c")
    assert parse_config({"max_batch_size": 0, "inputs": [{"name": "x", "shape": [4, 2]}]},
                        "c").batch_axes() is None


def test_a_request_keeps_the_batch_at_its_axis_in_the_model() -> None:
    """`keep_batch` reads the batch axes: a time-major request is no longer refused for having
    fewer rows in its state output than steps in its tokens."""
    symbol, params = model_files(GRU)
    model = default_loader(symbol, params)
    tokens = model_io_sets(GRU)[1][0]["data"]
    with pytest.raises(InputError, match="keep the inputs' batch dimension first"):
        model.infer({"data": tokens})
    model.batch_axes = {"data": 1, **{name: 1 for name in model.output_names}}
    assert model.infer({"data": tokens})[model.output_names[1]].shape == (2, 4, 32)


def test_the_batcher_joins_and_splits_along_the_batch_axis() -> None:
    def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        calls.append(inputs["x"].shape)
        return {"y": inputs["x"][..., None] * 10.0}

    calls: list[tuple[int, ...]] = []
    policy = BatchingPolicy(max_batch_size=8, max_queue_delay_s=5.0, preferred_batch_sizes=(3,))

    async def main() -> None:
        async with DynamicBatcher(infer, policy, batch_axes={"x": 1, "y": 1}) as batcher:
            columns = [np.full((5, 1), row, np.float32) for row in range(3)]
            answers = await asyncio.gather(*(batcher.submit({"x": column})
                                             for column in columns))
        assert calls == [(5, 3)]
        for row, answer in enumerate(answers):
            np.testing.assert_array_equal(answer["y"], np.full((5, 1, 1), row * 10.0))

    run(main())


def test_the_batcher_refuses_requests_disagreeing_along_their_axes() -> None:
    async def main() -> None:
        async with DynamicBatcher(lambda inputs: inputs, BatchingPolicy(),
                                  batch_axes={"a": 1}) as batcher:
            with pytest.raises(InputError, match=r"disagree on the batch size \(batch axes\): "
                                                 r"a 3, b 2"):
                await batcher.submit({"a": np.zeros((2, 3)), "b": np.zeros((2, 4))})

    run(main())


def test_without_a_batch_dimension_requests_never_join() -> None:
    calls: list[tuple[int, ...]] = []

    def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        calls.append(inputs["x"].shape)
        return {"y": inputs["x"].sum(keepdims=True)}

    policy = BatchingPolicy.from_config(ModelConfig(max_batch_size=0))
    assert policy.max_batch_size == 1

    async def main() -> None:
        async with DynamicBatcher(infer, policy, batch_axes=None) as batcher:
            answers = await asyncio.gather(*(batcher.submit({"x": np.ones((2, 3))})
                                             for _ in range(3)))
        assert calls == [(2, 3)] * 3
        assert all(answer["y"].shape == (1, 1) for answer in answers)

    run(main())


def test_a_completed_time_major_config_loads_again_the_same_way() -> None:
    first = _validate(LSTM)
    again = parse_config(first.config.to_json(), "config.json")
    assert again.inputs == first.config.inputs and again.outputs == first.config.outputs
    assert _axes(_validate(LSTM, again)) == _axes(first)


def test_a_test_run_failing_in_the_engine_is_skipped_and_said(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that loads is served even when its synthetic run fails in the engine; the
    checks carry the failure."""
    from engine.errors import ExecutionError
    from engine.runtime.model import Model

    def fail(model: Model, inputs: Any) -> Any:
        raise ExecutionError("node 'slice1' (slice): begin 3 is past the end on purpose")

    monkeypatch.setattr(Model, "infer", fail)
    validated = _validate(TRANSFORMER)
    checks = checks_of(validated.model)
    assert checks is not None and checks.sample is None
    test = checks.as_dict()["test_inference"]
    assert test["ran"] is False
    assert "test inference on synthetic input (data0 (1, 1) float32" in test["reason"]
    assert "begin 3 is past the end on purpose" in test["reason"]
    assert validated.config.max_batch_size == 32


def test_batch_buckets_are_refused_for_a_later_batch_axis() -> None:
    with pytest.raises(InvalidModel, match=r"batch_buckets pad the batch along axis 0, but "
                                           r"'data' has its batch at axis 1"):
        _validate(GRU, ModelConfig(max_batch_size=4, batch_buckets=(1, 2, 4)))


def test_max_batch_size_0_serves_outputs_whose_rows_the_data_sets() -> None:
    """What `max_batch_size` 1 must refuse (an output whose row count is the data's: no row
    per request to answer with), whole shapes serve as they come."""
    from tests.conformance.fixtures import op_cases

    case = next(case for case in op_cases() if case["id"] == "npi_unique_counts")

    def loader(_symbol: Path, _params: Path, *, device: str) -> Any:
        return engine.load_model(case["symbol"], device=device, keep_batch=True)

    validated = load_and_validate(Path("unused"), ModelConfig(max_batch_size=0), loader=loader,
                                  device="cpu", where="upload")
    assert validated.config.max_batch_size == 0
    checks = checks_of(validated.model)
    assert checks is not None
    assert checks.as_dict()["batch_axes"] == {"batched": False,
                                              "reason": "config.json sets max_batch_size 0"}
    data = np.array([3.0, 1.0, 3.0, 2.0], np.float32)
    outputs = validated.model.infer({validated.model.input_names[0]: data})
    np.testing.assert_array_equal(outputs["op_output0"], [1.0, 2.0, 3.0])


def test_a_graph_writing_fixed_rows_of_the_batch_is_served_whole() -> None:
    """A request's rows 1:2 overwritten: joined with another request's rows, row 1 of the batch
    would belong to the first request only, so no two requests may share a run."""
    data = sym.var("data")
    marked = sym._slice_assign_scalar(data, scalar=7.0, begin=(1,), end=(2,))
    validated = _validate_symbol(marked * 2)
    assert validated.config.max_batch_size == 0
    recorded = checks_of(validated.model).as_dict()["batch_axes"]
    assert recorded["batched"] is False
    assert "assigns a fixed region of axis 0" in recorded["reason"]


def test_a_graph_writing_whole_rows_keeps_its_batch() -> None:
    data = sym.var("data")
    marked = sym._slice_assign_scalar(data, scalar=7.0, begin=(None, 1), end=(None, 2))
    assert _validate_symbol(marked * 2).config.max_batch_size > 0
