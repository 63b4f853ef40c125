"""``model_warmup``: the config field (and its ``warmup`` alias), the samples' data (zeros,
random, a file in the version's folder), their runs before READY, and a failing sample
refusing the load by name."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.runtime.model import Model
from engine.serving.config import ModelConfig, parse_config
from engine.serving.errors import InvalidModel
from engine.serving.manifest import PARAMS_NAME, SYMBOL_NAME
from engine.serving.repository import ModelRepository
from engine.serving.validate import Validated, checks_of, default_loader, load_and_validate
from tests.conformance.fixtures import model_files
from tests.engine.serving.helpers import run

WIDTH = 512  # seed_mlp's input: data [-1, 512] FP32


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[np.ndarray]:
    """The ``data`` of every `Model.infer` call from now on (copies)."""
    seen: list[np.ndarray] = []
    original = Model.infer

    def recording(self: Model, inputs: Any) -> dict[str, np.ndarray]:
        seen.append(np.array(inputs["data"]))
        return original(self, inputs)

    monkeypatch.setattr(Model, "infer", recording)
    return seen


def validate(folder: Path, warmup: list[dict], **config: Any) -> Validated:
    symbol, params = model_files("seed_mlp")
    parsed = parse_config({"max_batch_size": 8, "model_warmup": warmup, **config}, "test")
    return load_and_validate(
        folder, parsed, device="cpu", where="model 'mlp' version 1",
        loader=lambda _s, _p, *, device: default_loader(symbol, params, device=device))


def warmup_runs(calls: list[np.ndarray], count: int) -> list[np.ndarray]:
    """The last ``count`` runs: warm-up runs after every other step of the load."""
    assert len(calls) >= count
    return calls[-count:]


# ----- the config field -------------------------------------------------------------------


def test_model_warmup_is_triton_s_field_and_warmup_another_name_for_it() -> None:
    sample = {"name": "zeros", "batch_size": 2,
              "inputs": {"data": {"data_type": "TYPE_FP32", "dims": [WIDTH], "zero_data": True}}}
    canonical = parse_config({"model_warmup": [sample]}, "test")
    alias = parse_config({"warmup": [sample]}, "test")
    assert canonical == alias
    assert canonical.model_warmup[0].inputs["data"].data_type == "FP32"
    assert json.loads(canonical.to_json())["model_warmup"][0]["name"] == "zeros"
    with pytest.raises(InvalidModel, match="give model_warmup or warmup"):
        parse_config({"model_warmup": [sample], "warmup": [sample]}, "test")


@pytest.mark.parametrize(("warmup", "message"), [
    ([{"name": "big", "batch_size": 9}], r"model_warmup.0 \('big'\): batch_size 9 is more "
     r"than 8: max_batch_size is 8"),
    ([{"name": "a"}, {"name": "a"}], r"sample names must be unique; \['a'\] repeated"),
    ([{"name": "two", "inputs": {"data": {"zero_data": True, "random_data": True}}}],
     "give one of zero_data, random_data, input_data_file; got zero_data, random_data"),
    ([{"name": "up", "inputs": {"data": {"input_data_file": "../other/x.npy"}}}],
     r"model_warmup.0.inputs.data.input_data_file: .*must stay inside the model version's "
     r"folder \(no '..'\)"),
    ([{"name": "abs", "inputs": {"data": {"input_data_file": "/etc/passwd"}}}],
     r"model_warmup.0.inputs.data.input_data_file: .*must be a path relative to the model "
     "version's folder"),
    ([{"name": "neg", "count": -1}], r"model_warmup.0.count"),
    ([{"batch_size": 1}], r"model_warmup.0.name: Field required"),
])
def test_a_bad_sample_is_refused_naming_the_field(warmup: list[dict], message: str) -> None:
    with pytest.raises(InvalidModel, match=message):
        parse_config({"max_batch_size": 8, "model_warmup": warmup}, "test")


def test_a_model_without_batching_warms_up_one_request_of_its_whole_shape() -> None:
    with pytest.raises(InvalidModel, match=r"batch_size 2 is more than 1: the model has no "
                       r"batch dimension \(max_batch_size 0\)"):
        parse_config({"max_batch_size": 0, "model_warmup": [{"name": "x", "batch_size": 2}]},
                     "test")


# ----- the samples' data and runs -----------------------------------------------------------


def test_samples_run_count_times_with_zeros_by_default(
        tmp_path: Path, calls: list[np.ndarray]) -> None:
    validated = validate(tmp_path, [{"name": "three rows", "batch_size": 3, "count": 2},
                                    {"name": "once", "batch_size": 5, "count": 0}])
    runs = warmup_runs(calls, 3)
    assert [run.shape for run in runs] == [(3, WIDTH), (3, WIDTH), (5, WIDTH)]
    assert all(not run.any() and run.dtype == np.float32 for run in runs)
    checks = checks_of(validated.model)
    assert checks is not None
    record = checks.as_dict()["warmup"]
    assert record["ran"] is True
    assert [(s["name"], s["batch_size"], s["runs"]) for s in record["samples"]] == [
        ("three rows", 3, 2), ("once", 5, 1)]
    assert all(s["seconds"] > 0 for s in record["samples"])


def test_random_data_is_random_and_the_same_on_every_load(
        tmp_path: Path, calls: list[np.ndarray]) -> None:
    sample = [{"name": "noise", "batch_size": 4, "inputs": {"data": {"random_data": True}}}]
    validate(tmp_path, sample)
    first = warmup_runs(calls, 1)[0]
    validate(tmp_path, sample)
    again = warmup_runs(calls, 1)[0]
    assert first.shape == (4, WIDTH) and first.dtype == np.float32
    assert 0 <= first.min() and first.max() < 1 and np.unique(first).size > WIDTH
    np.testing.assert_array_equal(first, again)


def test_a_npy_file_of_one_row_fills_every_row_and_of_the_batch_is_taken_whole(
        tmp_path: Path, calls: list[np.ndarray]) -> None:
    (tmp_path / "warmup").mkdir()
    row = np.arange(WIDTH, dtype=np.float32)
    batch = np.random.default_rng(3).normal(size=(2, WIDTH)).astype(np.float32)
    np.save(tmp_path / "warmup" / "row.npy", row)
    np.save(tmp_path / "batch.npy", batch)
    validate(tmp_path, [
        {"name": "row", "batch_size": 3,
         "inputs": {"data": {"input_data_file": "warmup/row.npy"}}},
        {"name": "batch", "batch_size": 2, "inputs": {"data": {"input_data_file": "batch.npy"}}}])
    rows, whole = warmup_runs(calls, 2)
    np.testing.assert_array_equal(rows, np.stack([row] * 3))
    np.testing.assert_array_equal(whole, batch)


def test_a_raw_file_is_read_as_triton_reads_input_data_file(
        tmp_path: Path, calls: list[np.ndarray]) -> None:
    row = np.linspace(-1, 1, WIDTH, dtype=np.float32)
    (tmp_path / "row.bin").write_bytes(row.tobytes())
    validate(tmp_path, [{"name": "raw", "batch_size": 2, "inputs": {
        "data": {"data_type": "TYPE_FP32", "dims": [WIDTH], "input_data_file": "row.bin"}}}])
    np.testing.assert_array_equal(warmup_runs(calls, 1)[0], np.stack([row, row]))


def test_a_pickled_npy_file_is_never_unpickled(tmp_path: Path) -> None:
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InvalidModel, match=r"warm-up sample 'pickled' \(model_warmup.0\): "
                       r"input 'data': input_data_file 'objects.npy' is not a .npy array of "
                       "numbers"):
        validate(tmp_path, [{"name": "pickled",
                             "inputs": {"data": {"input_data_file": "objects.npy"}}}])


def test_a_link_out_of_the_version_folder_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(np.zeros(WIDTH, np.float32).tobytes())
    version = tmp_path / "1"
    version.mkdir()
    (version / "data.bin").symlink_to(outside)
    with pytest.raises(InvalidModel, match="leads outside the model version's folder"):
        validate(version, [{"name": "linked",
                            "inputs": {"data": {"input_data_file": "data.bin"}}}])


@pytest.mark.parametrize(("entry", "files", "message"), [
    ({"input_data_file": "missing.npy"}, {},
     "input_data_file 'missing.npy' is not a file in the model version's folder"),
    ({"input_data_file": "short.bin"}, {"short.bin": b"\0" * 12},
     rf"input_data_file 'short.bin' has 12 bytes; raw float32 data of shape \[2, {WIDTH}\] "
     rf"or \[{WIDTH}\] takes {2 * WIDTH * 4} or {WIDTH * 4}"),
    ({"input_data_file": "ints.npy"}, {"ints.npy": np.zeros(WIDTH, np.int32)},
     "input_data_file 'ints.npy' holds int32, the input takes float32"),
    ({"input_data_file": "shape.npy"}, {"shape.npy": np.zeros((3, WIDTH), np.float32)},
     rf"input_data_file 'shape.npy' has shape \[3, {WIDTH}\]; expected \[2, {WIDTH}\] or "
     rf"\[{WIDTH}\]"),
    ({"data_type": "INT32"}, {}, "data_type INT32 does not match the input's datatype FP32"),
    ({"dims": [256]}, {}, rf"dims \[256\] do not fit the input's shape \[{WIDTH}\]"),
])
def test_a_sample_whose_data_does_not_fit_refuses_the_load_naming_it(
        tmp_path: Path, entry: dict, files: dict[str, Any], message: str) -> None:
    for name, content in files.items():
        if isinstance(content, bytes):
            (tmp_path / name).write_bytes(content)
        else:
            np.save(tmp_path / name, content)
    with pytest.raises(InvalidModel, match=r"model 'mlp' version 1: warm-up sample 'bad' "
                       r"\(model_warmup.0\): input 'data': " + message):
        validate(tmp_path, [{"name": "bad", "batch_size": 2, "inputs": {"data": entry}}])


def test_a_sample_naming_an_input_the_model_lacks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidModel, match=r"warm-up sample 'typo' \(model_warmup.0\): inputs "
                       r"\['dta'\] are not inputs of the model; it has \['data'\]"):
        validate(tmp_path, [{"name": "typo", "inputs": {"dta": {"zero_data": True}}}])


def test_a_run_that_fails_refuses_the_load_naming_the_sample(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = Model.infer

    def failing(self: Model, inputs: Any) -> dict[str, np.ndarray]:
        if inputs["data"].shape[0] == 7:
            raise MemoryError("7 rows do not fit")
        return original(self, inputs)

    monkeypatch.setattr(Model, "infer", failing)
    with pytest.raises(InvalidModel, match=r"warm-up sample 'seven' \(model_warmup.1\) failed "
                       "at batch_size 7: 7 rows do not fit"):
        validate(tmp_path, [{"name": "one"}, {"name": "seven", "batch_size": 7}])


def test_a_batch_axis_other_than_the_first_takes_the_batch_size_there(
        tmp_path: Path, calls: list[np.ndarray]) -> None:
    from engine import sym

    net = sym.FullyConnected(sym.transpose(sym.var("data")), num_hidden=2, name="fc")
    params = {"fc_weight": np.ones((2, 3), np.float32), "fc_bias": np.zeros(2, np.float32)}

    def loader(_symbol: Path, _params: Path, *, device: str) -> Any:
        import engine

        return engine.load_model(net, params, device=device, keep_batch=True)

    config = parse_config({"max_batch_size": 8, "inputs": [
        {"name": "data", "datatype": "FP32", "shape": [3, -1], "batch_axis": 1}],
        "outputs": [{"name": "fc_output", "shape": [-1, 2]}],
        "model_warmup": [{"name": "five", "batch_size": 5,
                          "inputs": {"data": {"random_data": True}}}]}, "test")
    load_and_validate(tmp_path, config, loader=loader, device="cpu", where="model 't'")
    assert warmup_runs(calls, 1)[0].shape == (3, 5)


# ----- READY only after the warm-up ---------------------------------------------------------


def _write_version(root: Path, config: dict) -> None:
    symbol, params = model_files("seed_mlp")
    version = root / "mlp" / "1"
    version.mkdir(parents=True)
    (version / SYMBOL_NAME).write_bytes(symbol.read_bytes())
    (version / PARAMS_NAME).write_bytes(params.read_bytes())
    (root / "mlp" / "config.json").write_text(json.dumps(config))


def test_a_version_is_ready_only_once_its_warmup_ran(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entered, release = threading.Event(), threading.Event()
    original = Model.infer

    def held(self: Model, inputs: Any) -> dict[str, np.ndarray]:
        if inputs["data"].shape[0] == 6:  # the warm-up's batch size, and only its
            entered.set()
            assert release.wait(60), "the test never released the warm-up"
        return original(self, inputs)

    monkeypatch.setattr(Model, "infer", held)
    _write_version(tmp_path, {"max_batch_size": 8,
                              "model_warmup": [{"name": "six", "batch_size": 6}]})

    async def main() -> None:
        repo = ModelRepository(tmp_path, require_manifest=False)
        start = asyncio.get_running_loop().create_task(repo.start())
        try:
            for _ in range(6000):
                if entered.is_set():
                    break
                await asyncio.sleep(0.01)
            assert entered.is_set(), "the warm-up never ran"
            assert [(s.version, s.state) for s in repo.index()] == [(1, "LOADING")]
            release.set()
            await asyncio.wait_for(start, 60)
            assert [(s.version, s.state) for s in repo.index()] == [(1, "READY")]
            outputs = await repo.infer("mlp", {"data": np.zeros((6, WIDTH), np.float32)})
            assert next(iter(outputs.values())).shape[0] == 6
        finally:
            release.set()
            await repo.close()

    run(main(), timeout=120)


def test_a_failing_warmup_leaves_the_version_unavailable_naming_the_sample(
        tmp_path: Path) -> None:
    _write_version(tmp_path, {"max_batch_size": 8, "model_warmup": [
        {"name": "from a file", "inputs": {"data": {"input_data_file": "absent.npy"}}}]})

    async def main() -> None:
        repo = ModelRepository(tmp_path, require_manifest=False)
        await repo.start()
        try:
            (status,) = repo.index()
            assert status.state == "UNAVAILABLE"
            assert "warm-up sample 'from a file' (model_warmup.0): input 'data': " \
                "input_data_file 'absent.npy' is not a file" in status.reason
        finally:
            await repo.close()

    run(main(), timeout=120)


def test_the_completed_config_keeps_the_samples(tmp_path: Path) -> None:
    validated = validate(tmp_path, [{"name": "z", "batch_size": 2}])
    assert isinstance(validated.config, ModelConfig)
    assert [sample.name for sample in validated.config.model_warmup] == ["z"]


def test_a_sample_larger_than_the_batch_the_load_settled_on_is_refused(tmp_path: Path) -> None:
    from engine import sym

    # A graph that takes one row only: the load lowers max_batch_size to 1.
    net = sym.FullyConnected(sym.Reshape(sym.var("data"), shape=(1, -1)), num_hidden=2,
                             name="fc")
    params = {"fc_weight": np.zeros((2, 6), np.float32), "fc_bias": np.zeros(2, np.float32)}

    def loader(_symbol: Path, _params: Path, *, device: str) -> Any:
        import engine

        return engine.load_model(net, params, device=device, keep_batch=True)

    config = parse_config({"model_warmup": [{"name": "four", "batch_size": 4}]}, "test")
    with pytest.raises(InvalidModel, match=r"warm-up sample 'four' \(model_warmup.0\): "
                       r"batch_size 4 is more than the model takes \(max_batch_size 1 after "
                       r"loading\)"):
        load_and_validate(tmp_path, config, loader=loader, device="cpu", where="model 't'")
