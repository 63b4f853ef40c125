"""`engine.device` without a GPU: parsing, `auto`, clear errors, CPU plans unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.context import cpu, gpu
from engine.device import CPU, Device, get_device, gpu_available, gpu_unavailable_reason
from engine.errors import EngineError
from tests.conformance.fixtures import model_files, model_io_sets

NO_GPU = gpu_unavailable_reason()
needs_no_gpu = pytest.mark.skipif(NO_GPU is None, reason="checks behaviour where no GPU exists")


def test_cpu_spellings_resolve_to_numpy() -> None:
    for spec in ("cpu", "CPU", None, cpu(), cpu(3), CPU):
        device = get_device(spec)
        assert device.kind == "cpu" and device.xp is np and device.name == "cpu"
    assert get_device("cpu").context == cpu(0)
    with CPU.activate():
        assert CPU.empty((2, 3), np.float32).shape == (2, 3)
    assert CPU.to_host(CPU.asarray([1, 2])).tolist() == [1, 2]
    assert CPU.new_stream() is None and CPU.memory_pool_bytes() == 0
    CPU.synchronize()


def test_unknown_devices_are_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown device 'tpu'; expected one of cpu, gpu, auto"):
        get_device("tpu")
    with pytest.raises(ValueError, match="device must be a string, a Context or a Device"):
        get_device(3)
    with pytest.raises(ValueError, match="device kind must be 'cpu' or 'gpu'"):
        Device("npu")
    with pytest.raises(ValueError, match="unknown device 'tpu'; expected one of cpu, gpu, auto"):
        engine.load_model(*model_files("seed_mlp"), device="tpu")


def test_auto_is_the_gpu_exactly_when_cupy_sees_one() -> None:
    assert get_device("auto").kind == ("gpu" if gpu_available() else "cpu")


@needs_no_gpu
def test_gpu_without_cupy_or_device_says_what_is_missing() -> None:
    for spec in ("gpu", "gpu:1", "gpu(0)", gpu(0), Device("gpu", 2)):
        with pytest.raises(EngineError, match=r"cannot use gpu\(\d\): .*use device='cpu'"):
            get_device(spec)
    with pytest.raises(EngineError, match="cannot use gpu"):
        engine.load_model(*model_files("seed_mlp"), device="gpu")
    with pytest.raises(EngineError, match="the GPU device is unavailable"):
        _ = Device("gpu").xp


@needs_no_gpu
def test_missing_cupy_reason_names_the_install_command() -> None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        assert "pip install .[gpu]" in NO_GPU
    else:
        assert "CUDA" in NO_GPU


def test_switches_are_carried_by_the_device() -> None:
    device = Device("cpu", tf32=True, cuda_graphs=False)
    assert get_device(device) is device
    assert get_device("cpu", cuda_graphs=False).cuda_graphs is False
    assert get_device("cpu").tf32 is False and get_device("cpu").cuda_graphs is True


def test_auto_model_runs_and_reports_its_device() -> None:
    inputs, expected = model_io_sets("seed_mlp")[0]
    model = engine.load_model(*model_files("seed_mlp"), device="auto")
    assert model.device == model.backend.kind
    output = list(model.infer(inputs).values())[0]
    np.testing.assert_allclose(output, expected[0], rtol=1e-4, atol=1e-5)
    stats = model.stats()
    assert stats["device"] == model.backend.name
    assert stats["plans"][0]["device"] == model.backend.name


def test_cpu_context_and_plan_stats() -> None:
    inputs, _ = model_io_sets("seed_mlp")[0]
    model = engine.load_model(*model_files("seed_mlp"), device=cpu())
    model.infer(inputs)
    plan = model.plan_for(inputs)
    assert plan.device is model.backend and plan.xp is np
    assert plan.execution_stats() == {"device": "cpu", "cuda_graph": False,
                                      "cuda_graph_error": None}


def test_engine_gpu_is_the_context_constructor() -> None:
    import engine.cuda.codegen  # noqa: F401  (the GPU package must not shadow engine.gpu)

    assert engine.gpu(0) == gpu(0) and engine.gpu(2) == gpu(2) and engine.gpu() == gpu(0)
