"""FTZ and DAZ: set in every thread that runs kernels, and on a plan's caller while it runs."""

from __future__ import annotations

import ctypes
import threading
import time

import numpy as np
import pytest

import engine
from engine import sym
from engine.cpu import blas_threads, denormals, kernel_jobs, parallel, spin_pool
from engine.runtime import batch_split

pytestmark = [
    pytest.mark.skipif(not denormals.available(), reason="no MXCSR here (not x86)"),
    # The recording kernel calls native functions through ctypes: its task cannot be cached.
    pytest.mark.filterwarnings("ignore:Cannot cache compiled function"),
]

TINY = np.float32(1e-39)  # a float32 denormal
_pthread_self = ctypes.CDLL(None).pthread_self
_pthread_self.restype = ctypes.c_uint64
_pthread_self.argtypes = []
_thread_id = _pthread_self  # numba calls ctypes functions natively
_mxcsr_update = denormals._update()


def _modes(threads, modes, work, first, last):  # pragma: no cover - runs compiled
    """For each index, the native thread that ran it and that thread's MXCSR, with ``work``
    iterations of busy work per index (so that a worker has time to take a part)."""
    for index in range(first, last):
        total = 0.0
        for step in range(work):
            total += np.sqrt(step + index)
        threads[index] = _thread_id()
        modes[index] = _mxcsr_update(0, -1) + 0 * int(total > -1)


_compiled: dict = {}


def compiled_kernels() -> dict:
    """This module's kernels, as `kernel_jobs` finds them by name."""
    if not _compiled:
        from numba import njit

        _compiled.update(modes=njit(nogil=True)(_modes))
    return _compiled


def on_new_thread(function):
    """``function()``'s result, called on a thread of its own."""
    result = []
    thread = threading.Thread(target=lambda: result.append(function()))
    thread.start()
    thread.join()
    return result[0]


def test_flushed_sets_both_bits_inside_and_puts_the_callers_back() -> None:
    def check() -> tuple:
        before = denormals.mxcsr()
        with denormals.flushed():
            inside = denormals.flushing_here(), float((np.array([TINY]) * np.float32(1))[0])
        return before, inside, denormals.mxcsr()

    before, (flushing, product), after = on_new_thread(check)
    assert before & denormals.BOTH == 0  # a fresh thread of this process does not flush
    assert flushing and product == 0.0
    assert after == before


def test_flush_here_holds_for_the_thread_alone() -> None:
    def check() -> tuple:
        denormals.flush_here()
        return denormals.flushing_here(), float((np.array([TINY]) * np.float32(1))[0])

    assert on_new_thread(check) == (True, 0.0)
    assert not on_new_thread(denormals.flushing_here)


@pytest.mark.skipif(not spin_pool.available(), reason="llvmlite cannot compile the pool")
def test_spin_pool_workers_flush_denormals() -> None:
    threads = np.zeros(64, np.uint64)
    modes = np.zeros(64, np.int64)
    job = kernel_jobs.bind((__name__, "modes"), (threads, modes, 2000), 64, 16)
    assert job is not None
    caller = _pthread_self()
    seen_worker = False
    # Until a worker takes a part, for seconds if need be (a busy machine's cores).
    deadline = time.monotonic() + 10
    with spin_pool.armed(2):
        while not seen_worker and time.monotonic() < deadline:
            job()
            seen_worker = bool((threads != caller).any())
    assert seen_worker, "no part ran on a worker while armed"
    on_workers = modes[threads != caller]
    assert ((on_workers & denormals.BOTH) == denormals.BOTH).all()
    # The caller (this test's thread, outside any plan) keeps IEEE denormals.
    assert ((modes[threads == caller] & denormals.BOTH) == 0).all()


def test_the_engines_thread_pools_flush_denormals() -> None:
    assert batch_split._pool(1).submit(denormals.flushing_here).result()
    assert parallel._pool(1).submit(denormals.flushing_here).result()


@pytest.mark.skipif(blas_threads.numpy_openblas() is None, reason="not numpy's OpenBLAS")
def test_openblas_threads_started_anew_flush_denormals() -> None:
    blas = blas_threads.numpy_openblas()
    if spin_pool.cores() < 2:
        pytest.skip("OpenBLAS runs on the caller alone with one core")
    tiny = np.full((2048, 256), TINY, np.float32)
    identity = np.eye(256, dtype=np.float32)
    saved = blas.count()
    blas.set(2)
    try:
        assert blas_threads.restart_flushed()
        # This thread keeps IEEE denormals: the rows OpenBLAS's worker computed come out 0.
        rows = (tiny @ identity)[:, 0]
    finally:
        blas.set(saved)
    assert (rows == 0).any() and (rows == TINY).any()


def scaled_convolution() -> tuple:
    """A convolution without bias whose weights are so large that a denormal input times them
    is a normal float: 1e-39 * 1e30 = 1e-9 where denormals count, 0 where they are flushed."""
    data = sym.var("data")
    out = sym.Convolution(data, num_filter=16, kernel=(3, 3), pad=(1, 1), no_bias=True,
                          name="conv")
    weight = np.full((16, 8, 3, 3), 1e30, np.float32)
    return out, {"conv_weight": weight}


@pytest.mark.parametrize("rows", [1, 4])
def test_a_denormal_input_gives_the_flushed_output(rows: int) -> None:
    symbol, params = scaled_convolution()
    model = engine.load_model(symbol, params)
    normal = model.infer({"data": np.full((rows, 8, 12, 12), 1e-30, np.float32)})
    assert np.abs(next(iter(normal.values()))).min() > 0  # normal inputs are untouched
    outputs = model.infer({"data": np.full((rows, 8, 12, 12), TINY, np.float32)})
    np.testing.assert_array_equal(next(iter(outputs.values())), 0.0)
    assert not denormals.flushing_here()  # the caller's bits are back
