"""Convolutions through `engine.cuda.cudnn_conv` on the CPU: fake CuPy, fake cuDNN frontend.

The fake ``execute`` computes from the raw pointers it is handed, so a wrong pointer, stride or
bias shows as a wrong result. What cuDNN itself does is left to the ``gpu`` tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import engine
import engine.cuda.executor as executor_module
from engine.cuda import cudnn_conv
from engine.device import get_device
from tests.conformance.fixtures import assert_close, model_files, model_io_sets
from tests.engine.gpu import fake_cudnn
from tests.engine.gpu.test_gpu_execution import conv_case
from tests.engine.kernels.test_conv_bind import GEOMETRIES

RUNS = executor_module.WARMUP_RUNS + 2


def _run(model: Any, data: dict[str, np.ndarray]) -> np.ndarray:
    for _ in range(RUNS):
        output = model.infer(data)["second_output"]
    return output


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_convolutions_run_as_cudnn_graphs_from_raw_pointers(fake_cudnn_gpu: Any,
                                                            geometry: tuple) -> None:
    net, params, data = conv_case(geometry)
    executions = fake_cudnn.Graph.executions
    on_gpu = engine.load_model(net, params, device="gpu")
    output = _run(on_gpu, data)
    expected = engine.load_model(net, params, device="cpu").infer(data)["second_output"]
    np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-4)
    stats = on_gpu.plan_for(data).execution_stats()
    assert stats["cuda_graph"] is True, stats["cuda_graph_error"]
    one_d = len(geometry[0]) == 1  # cuDNN graphs here are 2-D and 3-D; 1-D goes to GEMM
    assert stats["cudnn_convolutions"] == (0 if one_d else 2)
    # Per graph: a trial launch at compile time, one per run (eager or replayed), and two
    # while capturing (the run that fills the graph's pool, the captured one).
    assert fake_cudnn.Graph.executions - executions == (0 if one_d else 2 * (1 + RUNS + 2))


def test_float32_graphs_exclude_tf32_unless_the_device_allows_it(
        fake_cudnn_gpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    graphs: list[Any] = []
    original = fake_cudnn.Graph.build

    def build(graph: Any, heuristics: list[str]) -> None:
        graphs.append(graph)
        original(graph, heuristics)

    monkeypatch.setattr(fake_cudnn.Graph, "build", build)
    net, params, data = conv_case(GEOMETRIES[0])
    for tf32, excluded in ((False, ["TENSOR_CORE"]), (True, [])):
        graphs.clear()
        engine.load_model(net, params, device=get_device("gpu", tf32=tf32)).infer(data)
        assert [graph.excluded_notes for graph in graphs] == [excluded, excluded]


def test_fused_chain_runs_the_cudnn_convolution_then_the_generated_kernel(
        fake_cudnn_gpu: Any) -> None:
    inputs, expected = model_io_sets("resblock")[0]
    model = engine.load_model(*model_files("resblock"), device="gpu")
    for _ in range(RUNS):
        output = list(model.infer(inputs).values())[0]
    assert_close(output, expected[0], {"rtol": 1e-4, "atol": 1e-5}, "resblock")
    plan = model.plan_for(inputs)
    fused = [step for step in plan.steps if step.node.op == "_fused_elementwise"]
    assert any(isinstance(step.call, cudnn_conv._Execute) for step in fused)
    stats = plan.execution_stats()
    assert stats["cudnn_convolutions"] > 0 and stats["cuda_graph"] is True


@pytest.mark.parametrize("failure", ["fail_build", "fail_execute"])
def test_a_declined_graph_falls_back_to_gemm_and_says_why(fake_cudnn_gpu: Any, failure: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake_cudnn.Graph, failure, "no engine for this graph")
    net, params, data = conv_case(GEOMETRIES[1])
    on_gpu = engine.load_model(net, params, device="gpu")
    expected = engine.load_model(net, params, device="cpu").infer(data)["second_output"]
    np.testing.assert_allclose(_run(on_gpu, data), expected, rtol=1e-4, atol=1e-4)
    stats = on_gpu.plan_for(data).execution_stats()
    assert stats["cudnn_convolutions"] == 0 and stats["cuda_graph"] is True
    assert len(stats["cudnn_declined"]) == 2
    assert "no engine for this graph" in stats["cudnn_declined"][0]


def test_cudnn_switched_off_or_missing_leaves_convolutions_to_gemm(
        fake_cudnn_gpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    net, params, data = conv_case(GEOMETRIES[0])
    off = engine.load_model(net, params, device=get_device("gpu", cudnn=False))
    off.infer(data)
    assert "cudnn_convolutions" not in off.plan_for(data).execution_stats()
    monkeypatch.setattr(cudnn_conv, "_import_cudnn", lambda: (None, "not installed"))
    missing = engine.load_model(net, params, device="gpu")
    missing.infer(data)
    assert "cudnn_convolutions" not in missing.plan_for(data).execution_stats()
