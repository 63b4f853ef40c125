"""config.json names inputs and outputs (`source`: the graph's name) and labels outputs: parsing,
completion from the graph, and a repository serving under the new names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.serving.config import parse_config
from engine.serving.errors import InvalidModel
from engine.serving.loaded import VersionState
from engine.serving.repository import ModelRepository
from engine.serving.validate import checks_of
from tests.conformance.fixtures import DEFAULT_TOLERANCE, assert_close, model_files, model_io_sets
from tests.engine.serving.helpers import run
from tests.engine.serving.test_repository import write_version

SOFTMAX, CONCAT = "multi_io_softmax0_output", "multi_io_concat0_output"
RENAMES: dict[str, Any] = {
    "inputs": [{"name": "vector", "source": "data0"}, {"name": "image", "source": "data1"}],
    "outputs": [{"name": "features", "source": CONCAT},
                {"name": "probabilities", "source": SOFTMAX, "labels": "classes.txt"}]}
LABELS = "cat\ndog\nbird\n"


def test_a_rename_alone_is_a_whole_entry() -> None:
    config = parse_config({"outputs": [{"name": "probabilities", "source": SOFTMAX}]}, "t")
    assert config.outputs is not None
    (tensor,) = config.outputs
    assert (tensor.name, tensor.graph_name, tensor.datatype, tensor.shape) == (
        "probabilities", SOFTMAX, None, None)
    assert parse_config({"inputs": [{"name": "data"}]}, "t").inputs[0].graph_name == "data"


@pytest.mark.parametrize(("config", "message"), [
    ({"outputs": [{"name": "a", "source": "x"}, {"name": "b", "source": "x"}]},
     "outputs: sources (graph names) must be unique; ['x'] repeated"),
    ({"outputs": [{"name": "a", "source": "x"}, {"name": "a", "source": "y"}]},
     "outputs: names must be unique; ['a'] repeated"),
    ({"inputs": [{"name": "a", "labels": "a.txt"}]}, "labels belong to outputs"),
    ({"outputs": [{"name": "a", "labels": "../a.txt"}]}, "outputs.0.labels"),
    ({"outputs": [{"name": "a", "labels": "config.json"}]}, "outputs.0.labels"),
    ({"outputs": [{"name": "a", "source": ""}]}, "outputs.0.source"),
])
def test_bad_names_are_refused_naming_the_field(config: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidModel, match="upload") as caught:
        parse_config(config, "upload")
    assert message in str(caught.value)


def _repository(root: Path, config: dict[str, Any], labels: str | None = LABELS) -> Path:
    symbol, params = model_files("multi_io")
    write_version(root, "multi", 1, symbol.read_bytes(), params.read_bytes())
    (root / "multi" / "config.json").write_text(json.dumps(config))
    if labels is not None:
        (root / "multi" / "classes.txt").write_text(labels)
    return root


def test_a_renaming_config_serves_under_the_new_names(tmp_path: Path) -> None:
    inputs, expected = model_io_sets("multi_io")[0]
    _repository(tmp_path, RENAMES)

    async def main() -> None:
        repo = ModelRepository(tmp_path)
        await repo.start()
        try:
            handle = repo.get("multi")
            outputs = await repo.infer("multi", {"vector": inputs["data0"],
                                                 "image": inputs["data1"]})
            assert list(outputs) == ["probabilities", "features"]  # the graph's order
            assert handle.output_names == ["probabilities", "features"]
            assert_close(outputs["probabilities"], expected[0], DEFAULT_TOLERANCE, "softmax")
            assert_close(outputs["features"], expected[1], DEFAULT_TOLERANCE, "concat")
            config = handle.config
            assert [(t.name, t.datatype, t.shape) for t in config.outputs or ()] == [
                ("features", "FP32", (-1, 12)), ("probabilities", "FP32", (-1, 3))]
            assert [(t.name, t.shape) for t in config.inputs or ()] == [
                ("vector", (-1, 5)), ("image", (-1, 3, -1, -1))]
            assert handle.labels == {"probabilities": ("cat", "dog", "bird")}
            checks = checks_of(handle.model)
            assert checks is not None
            assert checks.variable_dims == {"vector": [], "image": [2, 3]}
            assert checks.sample is not None and checks.sample["vector"] == (1, 5)
            assert checks.sample["image"][:2] == (1, 3)
        finally:
            await repo.close()

    run(main())


def test_a_config_less_model_keeps_the_graph_names(tmp_path: Path) -> None:
    _repository(tmp_path, {"max_batch_size": 4}, labels=None)

    async def main() -> None:
        repo = ModelRepository(tmp_path)
        await repo.start()
        try:
            handle = repo.get("multi")
            assert handle.output_names == [SOFTMAX, CONCAT]
            assert list(handle.input_specs) == ["data0", "data1"]
            assert handle.labels == {}
        finally:
            await repo.close()

    run(main())


@pytest.mark.parametrize(("change", "labels", "message"), [
    ({"outputs": [{"name": "probabilities", "source": "dense0_output"},
                  {"name": "features", "source": CONCAT}]}, None,
     "outputs.0 'probabilities' (source 'dense0_output') is not one of the model's outputs"),
    ({"outputs": [{"name": "probabilities", "source": SOFTMAX}]}, None,
     f"leave out the model's outputs ['{CONCAT}']"),
    ({"inputs": [{"name": "vector", "source": "data0"}, {"name": "data2"}]}, None,
     "inputs.1 'data2' is not one of the model's inputs ['data0', 'data1']"),
    ({}, "cat\ndog\n", "'classes.txt' has 2 labels; output 'probabilities' (shape [-1, 3]) has "
                       "3 classes"),
    ({"outputs": [{"name": "features", "source": CONCAT},
                  {"name": "probabilities", "source": SOFTMAX, "labels": "other.txt"}]},
     LABELS, "no file 'other.txt' for output 'probabilities'"),
    ({"outputs": [{"name": "features", "source": CONCAT},
                  {"name": "probabilities", "source": SOFTMAX, "datatype": "INT32"}]}, None,
     "outputs.1.datatype is INT32, but the model returns FP32"),
])
def test_a_config_that_does_not_fit_names_both_names(tmp_path: Path, change: dict[str, Any],
                                                      labels: str | None, message: str) -> None:
    _repository(tmp_path, {**RENAMES, **change}, labels=labels)

    async def main() -> None:
        repo = ModelRepository(tmp_path)
        await repo.start()
        try:
            (row,) = [row for row in repo.index() if row.name == "multi"]
            assert row.state == VersionState.UNAVAILABLE
            assert message in row.reason, row.reason
        finally:
            await repo.close()

    run(main())


def test_labels_travel_with_an_upload_in_its_staging_folder(tmp_path: Path) -> None:
    symbol, params = model_files("multi_io")
    inputs, _ = model_io_sets("multi_io")[0]

    async def main() -> None:
        repo = ModelRepository(tmp_path)
        await repo.start()
        try:
            async with repo.staging() as staging:
                (staging / "model-symbol.json").write_bytes(symbol.read_bytes())
                (staging / "model-0000.params").write_bytes(params.read_bytes())
                (staging / "classes.txt").write_text("a\r\nb\r\nc")  # CRLF, no final newline
                number = await repo.add_staged("multi", staging, config=json.dumps(RENAMES))
            assert (tmp_path / "multi" / str(number) / "classes.txt").is_file()
            assert repo.get("multi").labels == {"probabilities": ("a", "b", "c")}
            outputs = await repo.infer("multi", {"vector": inputs["data0"],
                                                 "image": inputs["data1"]})
            assert np.allclose(outputs["probabilities"].sum(axis=1), 1.0, atol=1e-5)
        finally:
            await repo.close()

    run(main())
