"""The GPU execution path run on the CPU through a numpy stand-in for CuPy (no GPU needed).

Checks what can go wrong in Python: device selection, plan binding, pinned staging, parameter
sharing, generated fused kernels in real plans (executed by the C-expression evaluator), and the
CUDA-graph capture/fallback logic. CUDA behaviour itself is covered by the ``gpu`` tests.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pytest

import engine
import engine.cuda.executor as executor_module
from engine.cuda import fused
from engine.cuda.array_module import capturable
from engine.device import get_device
from engine.runtime.plan import Plan, Step
from engine.runtime.signature import Signature
from tests.conformance.fixtures import (
    assert_close,
    model_files,
    model_io_sets,
    model_names,
    op_arrays,
    op_cases,
    tolerance_for,
)
from tests.engine.gpu import fake_cupy
from tests.engine.gpu.test_gpu_execution import conv_case
from tests.engine.kernels.test_conv_bind import GEOMETRIES

MODELS = model_names()


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    return fake_cupy.install(monkeypatch)


@pytest.mark.parametrize("name", MODELS)
def test_models_through_the_gpu_path_match_mxnet(fake_gpu: Any, name: str) -> None:
    model = engine.load_model(*model_files(name), device="gpu")
    assert model.device == "gpu" and model.backend.xp is capturable(fake_gpu)
    tolerance = {"rtol": 1e-3, "atol": 1e-5}
    for inputs, expected in model_io_sets(name):
        for _ in range(executor_module.WARMUP_RUNS + 2):  # warm-up, capture, replays
            outputs = list(model.infer(inputs).values())
        for k, (actual, reference) in enumerate(zip(outputs, expected)):
            assert type(actual) is np.ndarray and actual.dtype == reference.dtype
            assert_close(actual, reference, tolerance, f"{name} output {k}")
        # No step copies from the host or synchronises: the fake refuses both under capture.
        assert_captured_unless_blocked(model.plan_for(inputs))


def test_fused_chains_use_generated_kernels_cached_by_key(fake_gpu: Any) -> None:
    launches = fake_cupy.ElementwiseKernel.launches
    inputs, expected = model_io_sets("resblock")[0]
    model = engine.load_model(*model_files("resblock"), device="auto")
    assert model.device == "gpu"
    plan = model.plan_for(inputs)
    # One fused node is several steps (its head op as bound, then the generated kernel).
    chains = {step.node.name for step in plan.steps if step.node.op == "_fused_elementwise"}
    assert chains
    assert_close(list(model.infer(inputs).values())[0], expected[0],
                 {"rtol": 1e-4, "atol": 1e-5}, "resblock")
    assert fake_cupy.ElementwiseKernel.launches - launches == len(chains)
    assert 1 <= fused.cache_size() <= len(chains)
    engine.load_model(*model_files("resblock"), device="gpu").infer(inputs)
    assert fused.cache_size() <= len(chains)  # a second model reuses the same kernels


def test_capture_failure_keeps_the_plan_eager_and_says_why(fake_gpu: Any) -> None:
    model = engine.load_model(*model_files("seed_mlp"), device="gpu")
    inputs, expected = model_io_sets("seed_mlp")[0]
    plan = model.plan_for(inputs)
    uploads = []
    # A step that copies from the host on every run, as a kernel building a constant would.
    plan.steps.append(Step(lambda: uploads.append(fake_gpu.asarray(np.ones(2))),
                           plan.steps[-1].node))
    for _ in range(4):
        output = list(model.infer(inputs).values())[0]
    assert_close(output, expected[0], {"rtol": 1e-4, "atol": 1e-5}, "seed_mlp")
    stats = plan.execution_stats()
    assert stats["cuda_graph"] is False and stats["eager_runs"] == 4
    assert "host-to-device copy during stream capture" in stats["cuda_graph_error"]
    assert len(uploads) == 4 + 1  # four eager runs and the pre-capture run, none captured


def test_fake_cupy_is_as_strict_as_cupy(fake_gpu: Any) -> None:
    device_array = fake_gpu.ones((2, 2), np.float32)
    with pytest.raises(TypeError, match="multiple values for argument 'out'|positional"):
        fake_gpu.matmul(device_array, device_array, device_array)
    with pytest.raises(TypeError, match="Unsupported type"):
        fake_gpu.add(device_array, np.ones((2, 2), np.float32))
    with pytest.raises(AttributeError, match="__array_interface__"):
        _ = device_array.__array_interface__
    with pytest.raises(AttributeError):
        _ = device_array.flags.writeable
    with pytest.raises(AttributeError, match="has no attribute 'ctypeslib'"):
        _ = fake_gpu.ctypeslib
    with pytest.raises(TypeError, match="data type 'X0' not understood"):
        fake_gpu.ElementwiseKernel("X0 e0", "Y y", "y = e0", "k")
    with pytest.raises(ValueError, match="Wrong type float"):
        fake_gpu.ElementwiseKernel("float e0", "Y y", "y = e0", "k")


def test_captured_graph_is_replayed_after_warmup(fake_gpu: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    replays: list[int] = []

    class Replay:
        def __init__(self, run_steps: Any) -> None:
            self.run_steps = run_steps

        def replay(self) -> None:
            replays.append(1)
            self.run_steps()

    monkeypatch.setattr(executor_module, "capture",
                        lambda run_steps, stream, cupy: Replay(run_steps))
    model = engine.load_model(*model_files("seed_mlp"), device="gpu")
    reference = engine.load_model(*model_files("seed_mlp"), device="cpu")
    rng = np.random.default_rng(4)
    for _ in range(5):
        feed = {"data": rng.normal(size=(1, 512)).astype(np.float32)}
        assert_close(list(model.infer(feed).values())[0], list(reference.infer(feed).values())[0],
                     {"rtol": 1e-4, "atol": 1e-5}, "replay")
    stats = model.plan_for(feed).execution_stats()
    assert stats["cuda_graph"] is True and stats["eager_runs"] == executor_module.WARMUP_RUNS
    assert len(replays) == 5 - executor_module.WARMUP_RUNS


def test_cuda_graphs_switch_off(fake_gpu: Any) -> None:
    model = engine.load_model(*model_files("seed_mlp"),
                              device=get_device("gpu", cuda_graphs=False))
    inputs, _ = model_io_sets("seed_mlp")[0]
    for _ in range(3):
        model.infer(inputs)
    assert model.plan_for(inputs).execution_stats()["cuda_graph_error"] == "disabled"


def test_parameters_are_uploaded_once_per_model(fake_gpu: Any) -> None:
    model = engine.load_model(*model_files("seed_mlp"), device="gpu")
    for rows in (1, 4, 8):
        model.infer({"data": np.ones((rows, 512), np.float32)})
    uploaded = dict(model._device_constants)
    model.infer({"data": np.ones((2, 512), np.float32)})
    assert all(model._device_constants[name] is array for name, array in uploaded.items())
    assert len(model.stats()["plans"]) == 4


def test_reference_interpreter_and_buckets_on_the_gpu_path(fake_gpu: Any) -> None:
    inputs, expected = model_io_sets("lenet")[0]
    reference = engine.load_model(*model_files("lenet"), device="gpu", optimize=False)
    assert_close(list(reference.infer(inputs).values())[0], expected[0],
                 {"rtol": 1e-4, "atol": 1e-5}, "lenet reference")
    from engine.runtime.loader import read_graph, read_params
    from engine.runtime.model import Model

    symbol, params = model_files("seed_mlp")
    bucketed = Model(read_graph(symbol), read_params(params), device="gpu", batch_buckets=(4,))
    data, out = model_io_sets("seed_mlp")[0]
    result = list(bucketed.infer(data).values())[0]
    assert result.shape == out[0].shape
    assert_close(result, out[0], {"rtol": 1e-4, "atol": 1e-5}, "bucketed")


@pytest.mark.parametrize("case", op_cases(), ids=[case["id"] for case in op_cases()])
def test_op_cases_through_the_gpu_path_capture_and_match_mxnet(fake_gpu: Any,
                                                               case: dict[str, Any]) -> None:
    arrays = op_arrays()
    feed = {spec["name"]: arrays[f"{case['id']}/in{k}"] for k, spec in enumerate(case["inputs"])}
    model = engine.load_model(case["symbol"], device="gpu")
    for _ in range(executor_module.WARMUP_RUNS + 2):
        outputs = list(model.infer(feed).values())
    for k, spec in enumerate(case["outputs"]):
        assert outputs[k].shape == tuple(spec["shape"])
        if not spec.get("unspecified"):
            expected = arrays[f"{case['id']}/out{k}"]
            assert_close(outputs[k], expected, tolerance_for(expected.dtype, case.get("tolerance")),
                         f"{case['id']} output {k}")
    assert_captured_unless_blocked(model.plan_for(feed))


def assert_captured_unless_blocked(plan: Plan) -> None:
    """The plan replays as a CUDA graph exactly when every op in it is capturable; otherwise it
    never tried, ran eagerly every time, and its stats name the first op that is not."""
    stats = plan.execution_stats()
    blocking = [node for node in plan.graph.nodes
                if not node.is_variable and not node.opdef.capturable]
    if not blocking:
        assert stats["cuda_graph"] is True, stats["cuda_graph_error"]
        return
    assert stats["cuda_graph"] is False
    assert stats["cuda_graph_error"].startswith(f"{blocking[0].describe()} cannot run inside "
                                                "a CUDA graph")
    assert stats["eager_runs"] == executor_module.WARMUP_RUNS + 2


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_convolution_geometries_through_the_gemm_path(fake_gpu: Any, geometry: tuple) -> None:
    net, params, data = conv_case(geometry)
    on_gpu = engine.load_model(net, params, device="gpu")
    plan = on_gpu.plan_for(data)
    unbound = [step for step in plan.steps if isinstance(step.call, partial)
               and getattr(step.call.func, "__name__", "") == "_convolution"]
    assert not unbound, "every convolution is bound (im2col and GEMM in the workspace)"
    for _ in range(executor_module.WARMUP_RUNS + 2):
        output = on_gpu.infer(data)["second_output"]
    expected = engine.load_model(net, params, device="cpu").infer(data)["second_output"]
    np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-4)
    assert plan.execution_stats()["cuda_graph"] is True


def test_a_served_gpu_model_is_bucketed_and_warmed_at_load(fake_gpu: Any) -> None:
    from pathlib import Path

    from engine.serving.config import ModelConfig
    from engine.serving.validate import default_loader, load_and_validate

    symbol, params = model_files("seed_mlp")
    validated = load_and_validate(
        Path("unused"), ModelConfig(max_batch_size=8),
        loader=lambda _s, _p, *, device: default_loader(symbol, params, device=device),
        device="gpu", where="upload")
    model = validated.model
    assert validated.config.batch_buckets == (1, 2, 4, 8) == model.batch_buckets
    assert model.concurrent_runs == 2
    compiled = sorted(dict(signature)["data"][0] for signature in model.plan_signatures())
    assert compiled == [1, 2, 4, 8]  # every bucket compiled at load, not on first request
    for rows in compiled:
        entry = model._plans.get(Signature.of({"data": np.zeros((rows, 512), np.float32)}))
        plans = [entry.plan, entry.spare]
        assert all(plan is not None and plan.execution_stats()["cuda_graph"] for plan in plans)
    inputs, expected = model_io_sets("seed_mlp")[0]
    rows = np.repeat(inputs["data"], 3, axis=0)  # 3 rows run in the plan for 4
    assert_close(list(model.infer({"data": rows}).values())[0],
                 np.repeat(expected[0], 3, axis=0), {"rtol": 1e-4, "atol": 1e-5}, "3 rows")
