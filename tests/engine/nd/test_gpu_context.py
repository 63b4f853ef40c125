"""NDArrays on ``engine.gpu(0)``: placement, transfers, ops with the device's ``xp``, errors.

Each GPU test runs on the numpy stand-in for CuPy and, marked ``gpu``, on a real GPU
(the ``gpu_backend`` fixture in tests/conftest.py); results must equal the CPU's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import engine
import engine.device as device_module
from engine import nd
from engine.context import cpu, gpu
from engine.device import get_device
from engine.errors import EngineError

TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def on_device(array: nd.NDArray, backend: Any) -> bool:
    return array.context == gpu(0) and type(array._data) is backend.array_type


def test_creation_functions_place_arrays_on_the_gpu(gpu_backend: Any) -> None:
    made = {
        "array": (nd.array([[1, 2], [3, 4]], ctx=gpu(0)), np.array([[1, 2], [3, 4]])),
        "zeros": (nd.zeros((2, 3), ctx=gpu(0)), np.zeros((2, 3))),
        "ones": (nd.ones(4, ctx=gpu(0), dtype="int32"), np.ones(4)),
        "full": (nd.full((2,), 7.5, ctx=gpu(0)), np.full((2,), 7.5)),
        "empty": (nd.empty((3,), ctx=gpu(0)), np.zeros(3)),
        "arange": (nd.arange(0, 6, 2, ctx=gpu(0)), np.arange(0, 6, 2)),
        "zeros_like": (nd.zeros_like(nd.ones((2, 2), ctx=gpu(0))), np.zeros((2, 2))),
        "np.ones": (nd.np.ones((2,), ctx=gpu(0)), np.ones(2)),
    }
    for name, (array, expected) in made.items():
        assert on_device(array, gpu_backend), name
        host = array.asnumpy()
        assert type(host) is np.ndarray, name
        np.testing.assert_array_equal(host, expected, err_msg=name)
    assert made["ones"][0].dtype is np.int32 and made["array"][0].dtype is np.float32
    with gpu(0):
        default = nd.ones((1,))
    assert on_device(default, gpu_backend)


def test_random_sampling_on_the_gpu_matches_the_cpu(gpu_backend: Any) -> None:
    nd.random.seed(7)
    on_gpu = nd.random.normal(1.0, 2.0, shape=(3, 4), ctx=gpu(0))
    uniform_gpu = nd.random.uniform(shape=(5,), ctx=gpu(0))
    nd.random.seed(7)
    on_cpu = nd.random.normal(1.0, 2.0, shape=(3, 4))
    uniform_cpu = nd.random.uniform(shape=(5,))
    assert on_device(on_gpu, gpu_backend) and on_device(uniform_gpu, gpu_backend)
    np.testing.assert_array_equal(on_gpu.asnumpy(), on_cpu.asnumpy())
    np.testing.assert_array_equal(uniform_gpu.asnumpy(), uniform_cpu.asnumpy())
    per_element = nd.random.normal(nd.zeros((2,), ctx=gpu(0)), nd.ones((2,), ctx=gpu(0)),
                                   shape=(3,))
    assert on_device(per_element, gpu_backend) and per_element.shape == (2, 3)


def test_transfers_between_contexts(gpu_backend: Any) -> None:
    host = nd.array(np.arange(6, dtype=np.float32).reshape(2, 3))
    device = host.as_in_context(gpu(0))
    assert on_device(device, gpu_backend) and host.context == cpu(0)
    assert device.as_in_context(gpu(0)) is device
    back = device.copyto(cpu())
    assert back.context == cpu(0) and type(back._data) is np.ndarray
    np.testing.assert_array_equal(back.asnumpy(), host.asnumpy())
    target = nd.zeros((2, 3), ctx=gpu(0))
    assert host.copyto(target) is target
    np.testing.assert_array_equal(target.asnumpy(), host.asnumpy())
    into_host = nd.zeros((2, 3))
    device.copyto(into_host)
    np.testing.assert_array_equal(into_host.asnumpy(), host.asnumpy())
    snapshot = device.asnumpy()
    snapshot[:] = -1  # a download is a copy: the device array is untouched
    assert device.asnumpy()[0, 1] == 1
    assert np.asarray(device).tolist() == host.asnumpy().tolist()


def test_ops_on_gpu_arrays_match_the_cpu(gpu_backend: Any) -> None:
    rng = np.random.default_rng(0)
    data = rng.normal(size=(4, 8)).astype(np.float32)
    weight = rng.normal(size=(3, 8)).astype(np.float32)
    bias = rng.normal(size=(3,)).astype(np.float32)

    def compute(ctx: engine.Context) -> list[nd.NDArray]:
        x, w, b = (nd.array(value, ctx=ctx) for value in (data, weight, bias))
        y = nd.FullyConnected(x, w, b, num_hidden=3)
        z = nd.relu(y) * 2 + 1
        results = [y, z, nd.softmax(z, axis=-1), x.reshape((8, 4)), x[1], x[1:3, ::2],
                   -x / (abs(x) + 1), nd.sum(x > 0), nd.concat(x, x, dim=0), x.T,
                   nd.broadcast_add(x, nd.ones((1, 8), ctx=ctx))]
        x += 1
        x[0] = 5.0
        x[1, 2:4] = nd.array([9, 8], ctx=ctx)
        out = nd.zeros((4, 3), ctx=ctx)
        nd.FullyConnected(x, w, b, num_hidden=3, out=out)
        return [*results, x, out]

    for k, (on_gpu, on_cpu) in enumerate(zip(compute(gpu(0)), compute(cpu()), strict=True)):
        assert on_device(on_gpu, gpu_backend), f"result {k}"
        assert on_gpu.shape == on_cpu.shape and on_gpu.dtype is on_cpu.dtype, f"result {k}"
        np.testing.assert_allclose(on_gpu.asnumpy(), on_cpu.asnumpy(), **TOLERANCE,
                                   err_msg=f"result {k}")
    scalar = nd.sum(nd.ones((2,), ctx=gpu(0)))
    assert scalar.asscalar() == 2.0 and bool(scalar)


def test_kernels_run_with_the_devices_array_module(monkeypatch: pytest.MonkeyPatch) -> None:
    # A call spy needs the stand-in: the real CuPy's module attributes cannot be intercepted.
    import engine.nd.placement as placement
    from tests.engine.gpu import fake_cupy

    monkeypatch.setattr(placement, "_USED", {})
    cupy = fake_cupy.install(monkeypatch)
    used: list[str] = []
    fallback = cupy.__getattr__
    cupy.__getattr__ = lambda name: (used.append(name), fallback(name))[1]
    nd.exp(nd.ones((2,), ctx=gpu(0)))
    assert "exp" in used
    used.clear()
    nd.exp(nd.ones((2,)))
    assert used == []


def test_mixing_contexts_in_one_op_fails_clearly(gpu_backend: Any) -> None:
    on_gpu, on_cpu = nd.ones((2, 2), ctx=gpu(0)), nd.ones((2, 2))
    with pytest.raises(EngineError, match=r"input 'rhs' is on cpu\(0\) but input 'lhs' is on "
                                          r"gpu\(0\).*as_in_context\(gpu\(0\)\)"):
        on_gpu + on_cpu
    with pytest.raises(EngineError, match=r"nd.FullyConnected: input 'weight' is on cpu\(0\)"):
        nd.FullyConnected(on_gpu, on_cpu, num_hidden=2, no_bias=True)
    with pytest.raises(EngineError, match="same context"):
        nd.concat(on_cpu, on_gpu, dim=0)


def test_numpy_inputs_join_the_other_inputs_context(gpu_backend: Any) -> None:
    result = nd.broadcast_mul(nd.full((2,), 3.0, ctx=gpu(0)), np.array([1, 2], np.float32))
    assert on_device(result, gpu_backend)
    assert result.asnumpy().tolist() == [3.0, 6.0]
    created = nd._zeros(shape=(2, 2), ctx=gpu(0))
    assert on_device(created, gpu_backend) and created.asnumpy().sum() == 0


def test_waitall_and_wait_to_read_synchronize_the_gpu(gpu_backend: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    original = device_module.Device.synchronize

    def spy(self: device_module.Device) -> None:
        calls.append(self.name)
        original(self)

    monkeypatch.setattr(device_module.Device, "synchronize", spy)
    array = nd.ones((2,), ctx=gpu(0)) * 3
    nd.waitall()
    assert calls == ["gpu(0)"]
    array.wait_to_read()
    assert calls == ["gpu(0)", "gpu(0)"]


def test_save_and_load_gpu_arrays(gpu_backend: Any, tmp_path: Any) -> None:
    path = tmp_path / "arrays.params"
    nd.save(path, {"w": nd.arange(4, ctx=gpu(0))})
    loaded = nd.load(path)
    assert isinstance(loaded, dict) and loaded["w"].context == cpu(0)
    assert loaded["w"].asnumpy().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert "@gpu(0)" in repr(nd.ones((1,), ctx=gpu(0)))


def test_a_gpu_the_device_does_not_have_fails_clearly(gpu_backend: Any) -> None:
    count = device_module.gpu_count()
    with pytest.raises(EngineError, match=rf"gpu\({count}\): CuPy sees {count} GPU"):
        nd.zeros((1,), ctx=gpu(count))


def test_without_cupy_gpu_contexts_fail_and_the_cpu_works(no_cupy: str) -> None:
    expected = r"cannot place an array on gpu\(0\): GPU arrays need CuPy and a GPU, but CuPy " \
               r"is not installed .*pip install \.\[gpu\].*ctx=engine\.cpu\(\)"
    attempts = {
        "array": lambda: nd.array([1], ctx=gpu(0)),
        "zeros": lambda: nd.zeros((2,), ctx=gpu(0)),
        "ones": lambda: nd.ones((2,), ctx=gpu(0)),
        "full": lambda: nd.full((2,), 1.0, ctx=gpu(0)),
        "empty": lambda: nd.empty((2,), ctx=gpu(0)),
        "arange": lambda: nd.arange(3, ctx=gpu(0)),
        "normal": lambda: nd.random.normal(shape=(2,), ctx=gpu(0)),
        "uniform": lambda: nd.random.uniform(shape=(2,), ctx=gpu(0)),
        "as_in_context": lambda: nd.ones((1,)).as_in_context(gpu(0)),
        "copyto": lambda: nd.ones((1,)).copyto(gpu(0)),
        "default": lambda: nd.ones((1,)).__class__([1.0], gpu(0)),
    }
    for name, attempt in attempts.items():
        with pytest.raises(EngineError, match=expected):
            attempt()
        assert name
    with pytest.raises(EngineError, match="CuPy is not installed"), gpu(0):
        nd.ones((1,))
    assert get_device("auto").kind == "cpu"
    assert (nd.ones((2,)) + 1).asnumpy().tolist() == [2.0, 2.0]
    nd.waitall()


@pytest.mark.skipif(device_module.gpu_available(), reason="this machine has a usable GPU")
def test_the_error_names_what_this_machine_is_missing() -> None:
    reason = device_module.gpu_unavailable_reason()
    assert reason is not None
    with pytest.raises(EngineError) as caught:
        nd.zeros((1,), ctx=gpu(0))
    assert reason in str(caught.value)
