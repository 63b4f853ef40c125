"""A transposed product's tiles and its copy into place as one job cut by filters."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from engine.cpu import spin_pool
from engine.kernels import gemm_bind, gemm_kernel, gemm_transposed

pytestmark = pytest.mark.skipif(not gemm_kernel.available() or not spin_pool.available(),
                                reason="llvmlite cannot compile for this CPU")

RNG = np.random.default_rng(11)
# A product's columns that run transposed: 3 whole vectors of AVX-512's 16 lanes and 9 more
# (7 of AVX2's 8 and 1 more), too many past whole vectors for an edge to sum a column to a
# vector: 57 of 64 lanes filled.
COLUMNS = 57
TASK = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)


class ScratchWorkspace:
    def derived(self, constant, tag, make):
        return make(constant)

    def zeroed(self, shape, dtype, tag):
        return np.zeros(shape, dtype)


def random(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape, dtype=np.float32)


def transposed(filters: int, depth: int, out: np.ndarray) -> tuple[gemm_bind.Transposed,
                                                                   np.ndarray, np.ndarray]:
    weight, data = random(filters, depth), random(depth, COLUMNS)
    weight.flags.writeable = False
    call = gemm_bind.weight_product(np, weight, data, out, ScratchWorkspace())
    assert isinstance(call, gemm_bind.Transposed)
    return call, weight, data


def want(weight: np.ndarray, data: np.ndarray) -> np.ndarray:
    return weight.astype(np.float64) @ data.astype(np.float64)


@pytest.mark.parametrize("filters", [200, 960])
def test_armed_the_product_and_its_copy_are_one_job_landing_in_place(filters: int) -> None:
    frame = np.full((filters + 6, COLUMNS), np.nan, np.float32)
    out = frame[3:-3]
    call, weight, data = transposed(filters, 40, out)
    bias = random(filters)
    call = gemm_bind.clamped(gemm_bind.with_bias([call], bias_rows=bias), 0.0, 2.0)[0]
    with spin_pool.armed(2):
        call()
        call()  # the job is made at the first armed run: the second runs it again
    assert type(call.run._job) is spin_pool.Job  # the fused job, not the two calls in turn
    np.testing.assert_allclose(out, np.clip(want(weight, data) + bias[:, None], 0.0, 2.0),
                               rtol=1e-4, atol=1e-4)
    assert np.isnan(frame[:3]).all() and np.isnan(frame[-3:]).all()
    armed = out.copy()
    out[:] = np.nan
    call()  # one thread: the product, then NumPy's copy
    np.testing.assert_array_equal(out, armed)


def test_a_product_of_one_part_runs_then_copies_armed_or_not() -> None:
    """A product too small to cut in parts keeps the product then NumPy's copy: no job that
    would mark its plan worth arming."""
    out = np.full((64, COLUMNS), np.nan, np.float32)
    call, weight, data = transposed(64, 40, out)
    assert int(call.product.args[-1]) == 1
    assert not isinstance(call.run, spin_pool.WhenArmed)
    with spin_pool.armed(2):
        call()
    np.testing.assert_allclose(out, want(weight, data), rtol=1e-4, atol=1e-4)


def test_armed_a_residual_is_added_as_each_part_copies_then_clamped() -> None:
    filters = 160
    frame = np.zeros((filters, COLUMNS), np.float32)
    call, weight, data = transposed(filters, 96, frame)
    other = random(filters, COLUMNS)
    fused = gemm_bind.clamped(gemm_bind.with_residual([call], frame, other), -1.0, 1.0)[0]
    with spin_pool.armed(2):
        fused()
    np.testing.assert_allclose(frame, np.clip(want(weight, data) + other, -1.0, 1.0),
                               rtol=1e-4, atol=1e-4)


def test_each_part_copies_the_filters_it_computed() -> None:
    """A part run alone writes its run of filters' rows of ``out``, whole and right, and
    nothing else: the core copying them is the one whose tiles wrote them."""
    filters = 300
    out = np.full((filters, COLUMNS), np.nan, np.float32)
    call, weight, data = transposed(filters, 40, out)
    job = gemm_transposed.by_filters(call.product, call.out, call.source)
    assert job is not None
    parts = int(job.args[-1])
    assert parts > 1
    task, context = TASK(int(job.args[-3])), int(job.args[-2])
    full = want(weight, data)
    written = np.zeros(filters, bool)
    for part in range(parts):
        out[:] = np.nan
        call.source[:] = np.nan  # the scratch too: each part's product must fill its rows
        task(context, part, parts)
        rows = ~np.isnan(out).any(axis=1)
        assert rows.any() and not (written & rows).any()
        np.testing.assert_allclose(out[rows], full[rows], rtol=1e-4, atol=1e-4)
        assert np.isnan(out[~rows]).all()
        written |= rows
    assert written.all()


def test_a_product_not_ours_is_left_to_the_calls_in_turn() -> None:
    out = np.zeros((64, COLUMNS), np.float32)
    call, _, _ = transposed(64, 40, out)
    assert gemm_transposed.by_filters(lambda: None, call.out, call.source) is None


@pytest.mark.parametrize("batch", [1, 3])
def test_mobilenet_v2_on_one_thread_and_armed_equals_the_reference(batch: int) -> None:
    """fp32 MobileNet v2 (160 × 160: its 1×1 layers at 5² run transposed, the block ends
    adding their residual as they copy) against the reference interpreter, on one thread and
    armed over two."""
    import engine
    from bench import nets

    symbol = nets.mobilenet_v2()
    params = nets.random_params(symbol, (batch, 3, 160, 160), seed=5)
    feed = {"data": RNG.standard_normal((batch, 3, 160, 160), dtype=np.float32)}
    want = engine.load_model(symbol, params, optimize=False).infer(feed)
    model = engine.load_model(symbol, params, optimize=True)
    for threads in (1, 2):
        with spin_pool.armed(threads):
            got = model.infer(feed)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4,
                                       atol=1e-4 * np.abs(want[name]).max())
    steps = [step.call for step in model.plan_for(feed).steps]
    fused = [call for call in steps if isinstance(call, gemm_bind.Transposed)
             and type(call.run._job) is spin_pool.Job]
    assert len(fused) >= 6  # each 5² 1×1 layer's product ran as one job, copies and all
