"""On a GPU: every conformance op and model through load_model gives the CPU's outputs.

Marked ``gpu``: skipped (with the reason) where CuPy or a CUDA device is missing.
"""

from __future__ import annotations

import gc
import threading
from typing import Any

import numpy as np
import pytest

import engine
from engine import sym
from engine.context import gpu
from engine.device import get_device
from tests.conformance.fixtures import (
    assert_close,
    model_files,
    model_io_sets,
    model_meta,
    model_names,
    op_arrays,
    op_cases,
    tolerance_for,
)
from tests.engine.kernels.test_conv_bind import GEOMETRIES, two_convs

pytestmark = pytest.mark.gpu
CASES = op_cases()
MODELS = model_names()
RNN_TOLERANCE = {"rtol": 1e-3, "atol": 1e-5}
RUNS = 4  # enough for the warm-up runs, the capture and two replays


def _case_feed(case: dict[str, Any]) -> dict[str, np.ndarray]:
    arrays = op_arrays()
    return {spec["name"]: arrays[f"{case['id']}/in{k}"] for k, spec in enumerate(case["inputs"])}


@pytest.mark.parametrize("optimize", [False, True], ids=["reference", "optimized"])
@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_op_case_on_gpu_matches_cpu_and_mxnet(case: dict[str, Any], optimize: bool) -> None:
    arrays = op_arrays()
    feed = _case_feed(case)
    on_gpu = engine.load_model(case["symbol"], device="gpu", optimize=optimize)
    on_cpu = engine.load_model(case["symbol"], device="cpu", optimize=optimize)
    assert on_gpu.device == "gpu"
    expected_cpu = list(on_cpu.infer(feed).values())
    for _ in range(RUNS if optimize else 1):
        outputs = list(on_gpu.infer(feed).values())
    for k, spec in enumerate(case["outputs"]):
        assert outputs[k].shape == tuple(spec["shape"]) and isinstance(outputs[k], np.ndarray)
        assert outputs[k].dtype == np.dtype(spec["dtype"])
        if spec.get("unspecified"):
            continue
        expected = arrays[f"{case['id']}/out{k}"]
        tolerance = tolerance_for(expected.dtype, case.get("tolerance"))
        assert_close(outputs[k], expected, tolerance, f"{case['id']} output {k} vs MXNet")
        assert_close(outputs[k], expected_cpu[k], tolerance, f"{case['id']} output {k} vs CPU")
    if optimize:  # the reference interpreter runs no plan
        _assert_captured_unless_blocked(on_gpu.plan_for(feed), cuda_graphs=True)


@pytest.mark.parametrize("cuda_graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("optimize", [False, True], ids=["reference", "optimized"])
@pytest.mark.parametrize("name", MODELS)
def test_model_on_gpu_matches_cpu(name: str, optimize: bool, cuda_graphs: bool) -> None:
    device = get_device("gpu", cuda_graphs=cuda_graphs)
    on_gpu = engine.load_model(*model_files(name), device=device, optimize=optimize)
    on_cpu = engine.load_model(*model_files(name), device="cpu", optimize=optimize)
    meta = model_meta(name)
    tolerance = RNN_TOLERANCE if "RNN" in meta.get("ops", []) else meta["tolerance"]
    for inputs, expected in model_io_sets(name):
        cpu_outputs = list(on_cpu.infer(inputs).values())
        for _ in range(RUNS):
            outputs = list(on_gpu.infer(inputs).values())
        for k, (actual, reference) in enumerate(zip(outputs, expected)):
            assert actual.dtype == reference.dtype
            assert_close(actual, reference, tolerance, f"{name} output {k} vs MXNet")
            assert_close(actual, cpu_outputs[k], tolerance, f"{name} output {k} vs CPU")
        if optimize:  # the reference interpreter runs no plan
            _assert_captured_unless_blocked(on_gpu.plan_for(inputs), cuda_graphs)


def _assert_captured_unless_blocked(plan: Any, cuda_graphs: bool) -> None:
    """A warm plan replays as a CUDA graph unless graphs are off or an op reads its inputs on
    the host: a plan that quietly stays uncaptured is a failure, not a slower pass."""
    stats = plan.execution_stats()
    blocked = any(not node.is_variable and not node.opdef.capturable
                  for node in plan.graph.nodes)
    assert stats["cuda_graph"] is (cuda_graphs and not blocked), stats["cuda_graph_error"]


def test_cuda_graph_replay_reads_new_inputs_each_run() -> None:
    model = engine.load_model(*model_files("seed_mlp"), device="gpu")
    reference = engine.load_model(*model_files("seed_mlp"), device="cpu")
    rng = np.random.default_rng(3)
    for _ in range(6):
        data = {"data": rng.normal(size=(1, 512)).astype(np.float32)}
        assert_close(list(model.infer(data).values())[0], list(reference.infer(data).values())[0],
                     {"rtol": 1e-4, "atol": 1e-5}, "seed_mlp replay")
    plan = model.plan_for(data)
    stats = plan.execution_stats()
    assert stats["cuda_graph"] is True, stats["cuda_graph_error"]
    assert model.stats()["plans"][0]["cuda_graph"] is True


def test_without_graphs_the_plan_stays_eager() -> None:
    model = engine.load_model(*model_files("seed_mlp"), device=get_device("gpu",
                                                                           cuda_graphs=False))
    inputs, _ = model_io_sets("seed_mlp")[0]
    for _ in range(RUNS):
        model.infer(inputs)
    stats = model.plan_for(inputs).execution_stats()
    assert {key: stats[key] for key in ("device", "cuda_graph", "cuda_graph_error",
                                        "eager_runs")} == {
        "device": "gpu(0)", "cuda_graph": False, "cuda_graph_error": "disabled",
        "eager_runs": RUNS}


def test_fused_chains_run_as_generated_kernels() -> None:
    from engine.cuda import fused

    model = engine.load_model(*model_files("resblock"), device="gpu")
    inputs, expected = model_io_sets("resblock")[0]
    plan = model.plan_for(inputs)
    fused_steps = [step for step in plan.steps if step.node.op == "_fused_elementwise"]
    assert fused_steps, "the resblock graph has conv+add+relu chains to fuse"
    assert fused.cache_size() >= 1
    assert_close(list(model.infer(inputs).values())[0], expected[0],
                 {"rtol": 1e-4, "atol": 1e-5}, "resblock fused")


def test_plans_share_parameters_and_allocate_from_the_pool() -> None:
    import cupy

    pool = cupy.get_default_memory_pool()
    model = engine.load_model(*model_files("seed_mlp"), device="gpu")
    gc.collect()  # earlier tests' arrays, freed mid-test, would hide this test's allocations
    before = pool.used_bytes()
    for rows in (1, 8):
        model.infer({"data": np.ones((rows, 512), np.float32)})
    assert pool.used_bytes() > before
    assert 0 < len(model._device_constants) <= len(model.optimized_graph.constants)
    count = len(model._device_constants)
    model.infer({"data": np.ones((3, 512), np.float32)})  # a third plan uploads nothing new
    assert len(model._device_constants) == count


def test_tf32_is_off_by_default_and_switchable() -> None:
    from cupy._core import _routines_linalg as linalg

    float32 = np.dtype(np.float32)
    get_device("gpu")
    assert linalg.get_compute_type(float32) != linalg.COMPUTE_TYPE_TF32
    get_device("gpu", tf32=True)
    assert linalg.get_compute_type(float32) == linalg.COMPUTE_TYPE_TF32
    get_device("gpu", tf32=False)
    assert linalg.get_compute_type(float32) != linalg.COMPUTE_TYPE_TF32


def test_context_and_auto_select_the_gpu() -> None:
    assert get_device(gpu(0)).name == "gpu(0)" and get_device("auto").kind == "gpu"
    model = engine.load_model(*model_files("lenet"), device=gpu(0))
    assert model.device == "gpu"


def test_threads_share_one_gpu_plan() -> None:
    model = engine.load_model(*model_files("seed_mlp"), device="gpu")
    reference = engine.load_model(*model_files("seed_mlp"), device="cpu")
    rng = np.random.default_rng(5)
    feeds = [{"data": rng.normal(size=(2, 512)).astype(np.float32)} for _ in range(16)]
    results: list[Any] = [None] * len(feeds)

    def work(index: int) -> None:
        for _ in range(5):
            results[index] = list(model.infer(feeds[index]).values())[0]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(feeds))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for feed, result in zip(feeds, results):
        assert_close(result, list(reference.infer(feed).values())[0],
                     {"rtol": 1e-4, "atol": 1e-5}, "threaded")


def _conv_models() -> list[str]:
    return [name for name in MODELS if "Convolution" in model_meta(name).get("ops", [])]


@pytest.mark.parametrize("name", _conv_models())
def test_convolutions_run_as_cudnn_graphs_and_match_the_gemm_path(name: str) -> None:
    from engine.cuda import cudnn_conv

    assert cudnn_conv.unavailable_reason() is None, cudnn_conv.unavailable_reason()
    with_cudnn = engine.load_model(*model_files(name), device=get_device("gpu", cudnn=True))
    with_gemm = engine.load_model(*model_files(name), device=get_device("gpu", cudnn=False))
    tolerance = model_meta(name)["tolerance"]
    for inputs, expected in model_io_sets(name):
        for _ in range(RUNS):
            outputs = list(with_cudnn.infer(inputs).values())
            gemm_outputs = list(with_gemm.infer(inputs).values())
        for k, (actual, reference) in enumerate(zip(outputs, expected)):
            assert_close(actual, reference, tolerance, f"{name} output {k} cuDNN vs MXNet")
            assert_close(gemm_outputs[k], reference, tolerance, f"{name} output {k} GEMM")
        stats = with_cudnn.plan_for(inputs).execution_stats()
        assert stats["cudnn_convolutions"] > 0, stats
        _assert_captured_unless_blocked(with_cudnn.plan_for(inputs), cuda_graphs=True)
        assert "cudnn_convolutions" not in with_gemm.plan_for(inputs).execution_stats()


def test_cudnn_float32_convolution_is_not_tf32_by_default() -> None:
    """A float32 convolution with TF32 would differ from float64 by ~1e-3 relative; without,
    by ~1e-6."""
    rng = np.random.default_rng(8)
    data = rng.normal(size=(2, 64, 16, 16)).astype(np.float32)
    weight = rng.normal(size=(64, 64, 3, 3)).astype(np.float32)
    net = sym.Convolution(sym.var("data"), sym.var("weight"), kernel=(3, 3), pad=(1, 1),
                          num_filter=64, no_bias=True)
    model = engine.load_model(net, {"weight": weight}, device="gpu")
    for _ in range(RUNS):
        output = list(model.infer({"data": data}).values())[0]
    assert model.plan_for({"data": data}).execution_stats()["cudnn_convolutions"] == 1
    exact = engine.load_model(net, {"weight": weight.astype(np.float64)}, device="cpu")
    reference = list(exact.infer({"data": data.astype(np.float64)}).values())[0]
    np.testing.assert_allclose(output, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
@pytest.mark.parametrize("cudnn", [True, False], ids=["cudnn", "gemm"])
def test_convolution_geometries_match_the_cpu(geometry: tuple, cudnn: bool) -> None:
    net, params, data = conv_case(geometry)
    on_gpu = engine.load_model(net, params, device=get_device("gpu", cudnn=cudnn))
    on_cpu = engine.load_model(net, params, device="cpu")
    for _ in range(RUNS):
        output = on_gpu.infer(data)["second_output"]
    np.testing.assert_allclose(output, on_cpu.infer(data)["second_output"], rtol=1e-4,
                               atol=1e-4)
    stats = on_gpu.plan_for(data).execution_stats()
    assert stats["cuda_graph"] is True, stats["cuda_graph_error"]
    if cudnn and len(geometry[0]) > 1:
        assert stats["cudnn_convolutions"] == 2, stats["cudnn_declined"]


def conv_case(geometry: tuple) -> tuple[Any, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Two convolutions of ``geometry`` (see `two_convs`), random parameters and an input."""
    shape = (3, 3, *{1: (11,), 2: (12, 10), 3: (7, 6, 5)}[len(geometry[0])])
    net = two_convs(*geometry, no_bias=False)
    rng = np.random.default_rng(9)
    arguments, _, _ = net.infer_shape(data=shape)
    params = {name: rng.normal(size=spec).astype(np.float32)
              for name, spec in zip(net.list_arguments(), arguments) if name != "data"}
    return net, params, {"data": rng.normal(size=shape).astype(np.float32)}
