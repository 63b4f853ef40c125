"""MXNet 1.9.1 exports using ``_foreach``, ``_while_loop`` and ``_cond`` against MXNet's outputs.

Each runs optimised and through the reference interpreter on the CPU, and through the GPU
stand-in (where the data-dependent ops keep the plan out of CUDA graph capture).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import engine
import engine.cuda.executor as executor_module
from tests.conformance.fixtures import (
    assert_close,
    control_flow_names,
    model_files,
    model_io_sets,
    model_meta,
)
from tests.engine.gpu import fake_cupy
from tests.engine.gpu.test_simulated_gpu import assert_captured_unless_blocked

NAMES = control_flow_names()
OPS = {"foreach_rnn_tiny": "_foreach", "while_loop_tiny": "_while_loop", "cond_tiny": "_cond"}


def test_every_control_flow_op_has_a_fixture() -> None:
    assert NAMES == sorted(OPS)
    for name, op in OPS.items():
        assert op in model_meta(name)["ops"]


@pytest.mark.parametrize("optimize", [False, True], ids=["reference", "optimized"])
@pytest.mark.parametrize("name", NAMES)
def test_control_flow_model_matches_mxnet(name: str, optimize: bool) -> None:
    model = engine.load_model(*model_files(name), optimize=optimize)
    tolerance = model_meta(name)["tolerance"]
    for inputs, expected in model_io_sets(name):
        outputs = model.run(inputs)
        assert len(outputs) == len(expected)
        for k, (actual, reference) in enumerate(zip(outputs, expected)):
            assert actual.dtype == reference.dtype
            assert_close(actual, reference, tolerance, f"{name} output {k}")


def test_the_fixtures_exercise_both_branches_and_both_loop_exits() -> None:
    # cond: the first batch's mean is positive (Dense), the second's negative (relu*2-1).
    (first, _), (second, second_out) = model_io_sets("cond_tiny")
    assert first["data"].mean() > 0 > second["data"].mean()
    np.testing.assert_allclose(second_out[0], np.maximum(second["data"], 0) * 2 - 1, rtol=1e-6)
    # while_loop: one batch stops on the counter (5 < max_iterations 6), one earlier.
    counts = [int(expected[1][0]) for _, expected in model_io_sets("while_loop_tiny")]
    assert counts[0] == 5 and 0 < counts[1] < 5


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    return fake_cupy.install(monkeypatch)


@pytest.mark.parametrize("name", NAMES)
def test_control_flow_through_the_gpu_path_matches_mxnet(fake_gpu: Any, name: str) -> None:
    for inputs, expected in model_io_sets(name):
        model = engine.load_model(*model_files(name), device="gpu")  # fresh run counts per set
        for _ in range(executor_module.WARMUP_RUNS + 2):
            outputs = list(model.infer(inputs).values())
        for k, (actual, reference) in enumerate(zip(outputs, expected)):
            assert_close(actual, reference, {"rtol": 1e-3, "atol": 1e-5}, f"{name} output {k}")
        plan = model.plan_for(inputs)
        assert_captured_unless_blocked(plan)
        assert plan.execution_stats()["cuda_graph"] is False  # every one of them blocks capture


@pytest.mark.parametrize("name", NAMES)
def test_onnx_export_refuses_control_flow_naming_the_node_and_reason(name: str,
                                                                     tmp_path: Any) -> None:
    from engine.errors import OnnxExportError
    from engine.onnx import export

    shapes = {spec["name"]: spec["shape"] for spec in model_meta(name)["inputs"]}
    with pytest.raises(OnnxExportError, match=rf"\({OPS[name]}\).*Loop/If is not implemented"):
        export(model_files(name), tmp_path / f"{name}.onnx", input_shapes=shapes)
    assert not (tmp_path / f"{name}.onnx").exists()
