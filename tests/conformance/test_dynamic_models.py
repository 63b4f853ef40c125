"""An MXNet 1.9.1 export with a data-dependent shape between layers (Dense, boolean_mask of the
features above their mean, Dense, sum) against MXNet's outputs: optimised (a staged plan),
through the reference interpreter, through the GPU stand-in and through ONNX Runtime."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import engine
import engine.cuda.executor as executor_module
from engine.runtime.staged import StagedPlan
from tests.conformance.fixtures import assert_close, model_files, model_io_sets, model_meta
from tests.engine.gpu import fake_cupy

NAME = "boolean_mask_tiny"


def test_the_fixture_keeps_some_features_of_each_batch_not_all() -> None:
    assert "_contrib_boolean_mask" in model_meta(NAME)["ops"]
    for inputs, expected in model_io_sets(NAME):
        features = inputs["data"].shape[0] * 8
        assert 0 < int(expected[1][0]) < features


@pytest.mark.parametrize("optimize", [False, True], ids=["reference", "optimized"])
def test_masked_model_matches_mxnet(optimize: bool) -> None:
    model = engine.load_model(*model_files(NAME), optimize=optimize)
    tolerance = model_meta(NAME)["tolerance"]
    for number, (inputs, expected) in enumerate(model_io_sets(NAME)):
        outputs = model.run(inputs)
        assert len(outputs) == len(expected)
        for k, (actual, reference) in enumerate(zip(outputs, expected)):
            assert actual.dtype == reference.dtype
            assert_close(actual, reference, tolerance, f"{NAME} set {number} output {k}")
    if optimize:
        assert isinstance(model.plan_for(model_io_sets(NAME)[0][0]), StagedPlan)


@pytest.mark.parametrize("optimize", [False, True], ids=["reference", "optimized"])
def test_a_selection_keeping_nothing_sums_zero_rows(optimize: bool) -> None:
    # Equal features are never above their mean: the rest runs on zero rows (MXNet 1.9.1
    # itself cannot, its oneDNN FullyConnected refuses them), giving zeros.
    model = engine.load_model(*model_files(NAME), optimize=optimize)
    scores, count = model.run({"data": np.zeros((2, 6), np.float32)})
    np.testing.assert_array_equal(scores, np.zeros((1, 3), np.float32))
    np.testing.assert_array_equal(count, [0.0])


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    return fake_cupy.install(monkeypatch)


def test_masked_model_through_the_gpu_path(fake_gpu: Any) -> None:
    model = engine.load_model(*model_files(NAME), device="gpu")
    for inputs, expected in model_io_sets(NAME):
        for _ in range(executor_module.WARMUP_RUNS + 2):
            outputs = model.run(inputs)
        for k, (actual, reference) in enumerate(zip(outputs, expected)):
            assert_close(actual, reference, {"rtol": 1e-3, "atol": 1e-5}, f"{NAME} output {k}")
    plan = model.plan_for(model_io_sets(NAME)[0][0])
    stats = plan.execution_stats()
    assert stats["cuda_graph"] is False and stats["device"].startswith("gpu")
    assert stats["cuda_graph_error"].startswith(
        "node 'maskedscores0_boolean_mask0' (_contrib_boolean_mask) cannot run inside a CUDA graph")
    # The stages themselves have no host-bound op: each replays as a CUDA graph once warm.
    static = plan.stages()[0].execution_stats()
    assert static["cuda_graph"] is True, static["cuda_graph_error"]


def test_masked_model_through_onnx_runtime(tmp_path: Any) -> None:
    pytest.importorskip("onnxruntime")
    from engine.onnx import export
    from tests.engine.onnx.helpers import run

    path = export(model_files(NAME), tmp_path / f"{NAME}.onnx", input_shapes={"data": (1, 6)})
    for inputs, expected in model_io_sets(NAME):
        for k, (actual, reference) in enumerate(zip(run(path, inputs), expected)):
            assert_close(actual, reference, model_meta(NAME)["tolerance"], f"onnx output {k}")
