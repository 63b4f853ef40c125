"""`load_and_validate` without config.json, or with a partial one: completion and its checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine
from engine import sym
from engine.serving.config import ModelConfig, TensorConfig
from engine.serving.errors import InvalidModel
from engine.serving.loaded import LoadedVersion
from engine.serving.probe import CANDIDATE_SIZES
from engine.serving.repository import ModelRepository
from engine.serving.validate import (
    Validated,
    checks_of,
    default_batch_buckets,
    default_loader,
    load_and_validate,
)
from tests.conformance.fixtures import (
    DEFAULT_TOLERANCE,
    assert_close,
    model_files,
    model_io_sets,
    model_names,
)
from tests.engine.runtime.test_input_completion import output_metadata
from tests.engine.serving.helpers import run
from tests.engine.serving.test_repository import write_version

RNG = np.random.default_rng(11)


def _validate(name: str, config: ModelConfig | None = None, **kwargs: Any) -> Validated:
    symbol, params = model_files(name)

    def loader(_symbol: Path, _params: Path, *, device: str) -> Any:
        return default_loader(symbol, params, device=device)

    return load_and_validate(Path("unused"), config or ModelConfig(), loader=loader,
                             device="cpu", where=f"upload of {name}", **kwargs)


def _validate_symbol(symbol: Any, data_shape: tuple[int, ...],
                     config: ModelConfig | None = None) -> Validated:
    args, _, _ = symbol.infer_shape(data=data_shape)
    params = {name: RNG.normal(size=shape).astype(np.float32)
              for name, shape in zip(symbol.list_arguments(), args) if name != "data"}

    def loader(_symbol: Path, _params: Path, *, device: str) -> Any:
        return engine.load_model(symbol, params, device=device)

    return load_and_validate(Path("unused"), config or ModelConfig(), loader=loader,
                             device="cpu", where="upload", memory_cap_bytes=1 << 30)


@pytest.mark.parametrize("name", model_names())
def test_every_fixture_is_completed_and_its_test_inference_runs(name: str) -> None:
    validated = _validate(name, memory_cap_bytes=1 << 30)
    inputs, expected = model_io_sets(name)[0]
    config = validated.config
    assert config.inputs is not None and config.outputs is not None
    for tensor in config.inputs:
        given = inputs[tensor.name].shape
        assert len(tensor.shape) == len(given) and tensor.shape[0] == -1
        assert all(dim in (-1, got) for dim, got in zip(tensor.shape, given)), (tensor, given)
    assert [tensor.shape for tensor in config.outputs] == [
        output_metadata(name, index, reference.shape) for index, reference in enumerate(expected)]
    checks = checks_of(validated.model)
    assert checks is not None and checks.sample is not None and checks.skipped is None
    for tensor in config.inputs:
        sample = checks.sample[tensor.name]
        assert sample[0] == 1 and all(dim in (-1, got) for dim, got in
                                      zip(tensor.shape[1:], sample[1:])), (tensor, sample)
    # The sample fits the graph; real inputs of every shape the io sets use fit the config.
    validated.model.output_shapes(checks.sample)
    report = checks.as_dict()
    assert report["test_inference"] == {"ran": True, "inputs": {
        key: list(shape) for key, shape in checks.sample.items()}}
    assert report["memory_estimate"]["ran"] and report["memory_estimate"]["estimated_bytes"] > 0


def test_lenet_test_inference_finds_28_by_28() -> None:
    checks = checks_of(_validate("lenet").model)
    assert checks is not None and checks.sample == {"data": (1, 1, 28, 28)}
    assert checks.variable_dims == {"data": [2, 3]}


def test_partial_config_is_completed_the_same_way() -> None:
    validated = _validate("resblock", ModelConfig(max_batch_size=4))
    full = _validate("resblock")
    assert validated.config.max_batch_size == 4
    assert validated.config.inputs == full.config.inputs
    assert validated.config.outputs == full.config.outputs
    given = (TensorConfig(name="data", datatype="FP32", shape=(-1, 1, -1, -1)),)
    only_inputs = _validate("lenet", ModelConfig(inputs=given))
    assert only_inputs.config.inputs == given
    assert [tensor.shape for tensor in only_inputs.config.outputs or ()] == [(-1, 10)]


def test_config_conflicting_with_a_known_dimension_is_refused() -> None:
    given = (TensorConfig(name="data", datatype="FP32", shape=(-1, 2, -1, -1)),)
    with pytest.raises(InvalidModel, match=r"inputs\.0\.shape \[-1, 2, -1, -1\] has 2 at "
                                           r"dimension 1; the graph gives input 'data'"):
        _validate("lenet", ModelConfig(inputs=given))


def test_memory_estimate_uses_the_sample_shape_at_max_batch_size() -> None:
    with pytest.raises(InvalidModel, match=r"activations at max_batch_size 32"):
        _validate("lenet", memory_cap_bytes=200_000)


def test_no_fitting_sample_skips_the_test_inference_and_says_why() -> None:
    # Flattened height x width must be 1021, a prime: no square side in the candidates fits.
    data = sym.var("data")
    conv = sym.Convolution(data, kernel=(1, 1), num_filter=1, name="conv")
    symbol = sym.FullyConnected(sym.Flatten(conv), num_hidden=2, name="fc")
    validated = _validate_symbol(symbol, (1, 1, 1, 1021))
    assert [tensor.shape for tensor in validated.config.inputs or ()] == [(-1, 1, -1, -1)]
    assert [tensor.shape for tensor in validated.config.outputs or ()] == [(-1, 2)]
    checks = checks_of(validated.model)
    assert checks is not None and checks.sample is None
    report = checks.as_dict()["test_inference"]
    assert report["ran"] is False and "no small input shape" in report["reason"]
    assert all(size * size != 1021 for size in CANDIDATE_SIZES)  # the premise
    assert checks.as_dict()["memory_estimate"] == {
        "ran": False, "reason": "no input shape known to fit the graph to estimate at"}
    out = validated.model.infer({"data": np.ones((2, 1, 1, 1021), np.float32)})["fc_output"]
    assert out.shape == (2, 2)
    # Serving it: the largest plan (32 rows of 1x1) cannot exist, so it holds no memory.
    version = LoadedVersion("odd", 1, validated.model, validated.config,
                            batcher=None,  # type: ignore[arg-type]
                            manifest_digest=None, config_digest=None)
    assert version.memory().activation_bytes > 0  # the (2, 1, 1, 1021) plan run above


def test_input_no_rank_fits_names_the_field_to_write() -> None:
    data = sym.var("data")
    planar = sym.Convolution(data, kernel=(3, 3), num_filter=2, name="planar")
    linear = sym.Convolution(data, kernel=(3,), num_filter=2, name="linear")
    symbol = sym.Group([planar, linear])

    def loader(_symbol: Path, _params: Path, *, device: str) -> Any:
        params = {"planar_weight": np.zeros((2, 1, 3, 3), np.float32),
                  "planar_bias": np.zeros(2, np.float32),
                  "linear_weight": np.zeros((2, 1, 3), np.float32),
                  "linear_bias": np.zeros(2, np.float32)}
        return engine.load_model(symbol, params, device=device)

    with pytest.raises(InvalidModel, match=r"inputs\.0\.shape \(input 'data'\) cannot be "
                                           r"inferred .*write it in config.json"):
        load_and_validate(Path("unused"), ModelConfig(), loader=loader, device="cpu",
                          where="upload")


def test_loaded_version_plans_its_largest_batch_at_the_sample_shape() -> None:
    validated = _validate("lenet")
    version = LoadedVersion("lenet", 1, validated.model, validated.config,
                            batcher=None,  # type: ignore[arg-type]
                            manifest_digest=None, config_digest=None)
    assert version.largest_plan == (("data", (32, 1, 28, 28)),)


def test_repository_folder_without_config_json_serves_on_start(tmp_path: Path) -> None:
    symbol, params = model_files("lenet")
    write_version(tmp_path, "lenet", 1, symbol.read_bytes(), params.read_bytes())
    inputs, expected = model_io_sets("lenet")[0]

    async def main() -> None:
        repo = ModelRepository(tmp_path)
        await repo.start()
        try:
            handle = repo.get("lenet")
            assert [t.shape for t in handle.config.inputs or ()] == [(-1, 1, -1, -1)]
            assert checks_of(handle.model) is not None
            outputs = await repo.infer("lenet", inputs)
            assert_close(outputs["lenet_dense2_fwd_output"], expected[0], DEFAULT_TOLERANCE)
        finally:
            await repo.close()

    run(main())
    assert not (tmp_path / "lenet" / "config.json").exists()


def test_config_may_choose_another_rank_the_graph_accepts() -> None:
    # The seed MLP flattens its input: [-1, 16, 32] is as good as the inferred [-1, 512].
    given = (TensorConfig(name="data", datatype="FP32", shape=(-1, 16, 32)),)
    validated = _validate("seed_mlp", ModelConfig(inputs=given))
    assert validated.config.inputs == given
    checks = checks_of(validated.model)
    assert checks is not None and checks.sample == {"data": (1, 16, 32)}
    conv = (TensorConfig(name="data", datatype="FP32", shape=(-1, 1, 28)),)
    with pytest.raises(InvalidModel, match=r"inputs\.0\.shape \[-1, 1, 28\] has 3 dimensions; "
                                           r"the graph gives input 'data' 4: .*Convolution"):
        _validate("lenet", ModelConfig(inputs=conv))


def test_a_graph_that_fixes_its_batch_is_served_one_row_at_a_time() -> None:
    validated = _validate("gluoncv_faster_rcnn_tiny")
    assert validated.config.max_batch_size == 1
    for name in model_names():  # every other fixture keeps the default and batches
        assert _validate(name).config.max_batch_size == 32, name


def test_a_config_asking_a_fixed_batch_graph_for_batches_is_refused() -> None:
    with pytest.raises(InvalidModel, match="takes one row per request only .* max_batch_size 4"):
        _validate("gluoncv_faster_rcnn_tiny", ModelConfig(max_batch_size=4))
    assert _validate("gluoncv_faster_rcnn_tiny",
                     ModelConfig(max_batch_size=1)).config.max_batch_size == 1


def test_batch_buckets_from_the_config_pad_batches_to_few_plans() -> None:
    validated = _validate("seed_mlp", ModelConfig(max_batch_size=8, batch_buckets=(2, 8)))
    model = validated.model
    assert model.batch_buckets == (2, 8) and validated.config.batch_buckets == (2, 8)
    inputs, expected = model_io_sets("seed_mlp")[0]
    rows = np.repeat(inputs["data"], 3, axis=0)
    outputs = model.infer({"data": rows})  # 3 rows run in the plan for 8
    np.testing.assert_allclose(next(iter(outputs.values())), np.repeat(expected[0], 3, axis=0),
                               rtol=1e-5, atol=1e-6)
    assert [dict(signature)["data"][0] for signature in model.plan_signatures()] == [2, 8]


def test_batch_buckets_default_to_powers_of_two_on_a_gpu_only() -> None:
    class OnGpu:
        backend = engine.device.Device("gpu")

    assert default_batch_buckets(32, OnGpu()) == (1, 2, 4, 8, 16, 32)
    assert default_batch_buckets(24, OnGpu()) == (1, 2, 4, 8, 16, 24)
    assert default_batch_buckets(1, OnGpu()) == (1,)
    assert _validate("seed_mlp").config.batch_buckets is None  # the CPU runs exact sizes


@pytest.mark.parametrize("buckets", [(0, 4), (4, 2), (2, 2), (64,)])
def test_batch_buckets_outside_one_to_max_batch_size_or_unordered_are_refused(
        buckets: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="batch_buckets"):
        ModelConfig(max_batch_size=32, batch_buckets=buckets)
