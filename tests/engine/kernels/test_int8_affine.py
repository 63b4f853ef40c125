"""`int8_affine`: a per-channel scale and shift of int8/uint8 values gives NumPy's float32
bytes (one product, one sum, rounding half to even, saturation) in each layout pair of the
channels-last hand-off."""

from __future__ import annotations

import numpy as np
import pytest

from engine.kernels import int8_affine
from engine.ops.quantized import ranges

pytestmark = pytest.mark.skipif(not int8_affine.available(),
                                reason="needs numba and the spin pool")

RNG = np.random.default_rng(23)


def laid(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array.transpose(0, 2, 3, 1)).reshape(array.shape)


def unlaid(buffer: np.ndarray) -> np.ndarray:
    batch, channels, height, width = buffer.shape
    return buffer.reshape(batch, height, width, channels).transpose(0, 3, 1, 2)


@pytest.mark.parametrize("in_dtype, out_dtype", [(np.int8, np.uint8), (np.uint8, np.uint8),
                                                 (np.int8, np.int8)])
@pytest.mark.parametrize("shape", [(2, 64, 7, 5), (1, 3, 4, 9), (1, 80, 2, 70)])
@pytest.mark.parametrize("data_laid", [False, True])
@pytest.mark.parametrize("out_laid", [False, True])
def test_the_pass_gives_numpys_bytes(in_dtype, out_dtype, shape, data_laid, out_laid):
    limits = np.iinfo(in_dtype)
    values = RNG.integers(limits.min, limits.max + 1, shape).astype(in_dtype)
    scale = (RNG.standard_normal(shape[1]) * 4).astype(np.float32)
    shift = (RNG.standard_normal(shape[1]) * 60).astype(np.float32)
    values[0, 0, 0, 0], scale[0], shift[0], shift[1] = limits.max, 3.0, 0.0, -1000.0
    want = ranges.saturate_round(values.astype(np.float32) * scale.reshape(1, -1, 1, 1)
                                 + shift.reshape(1, -1, 1, 1), out_dtype)
    ends = np.iinfo(out_dtype)
    assert (want == ends.min).any() and (want == ends.max).any()  # both ends saturate
    out = np.full(shape, 7, out_dtype)
    job = int8_affine.affine_job(laid(values) if data_laid else values, scale, shift, out,
                                 data_laid, out_laid)
    assert job is not None
    job()
    np.testing.assert_array_equal(unlaid(out) if out_laid else out, want)


def test_scales_of_the_wrong_length_are_refused_by_name():
    with pytest.raises(ValueError, match="int8 affine: int8"):
        int8_affine.affine_job(np.zeros((1, 4, 2, 2), np.int8), np.ones(3, np.float32),
                               np.zeros(3, np.float32), np.zeros((1, 4, 2, 2), np.uint8),
                               False, False)


@pytest.mark.skipif(not int8_affine.vector_available(), reason="needs AVX2 and llvmlite's JIT")
@pytest.mark.parametrize("in_dtype, out_dtype", [(np.int8, np.uint8), (np.uint8, np.int8)])
@pytest.mark.parametrize("laid_both", [False, True])
def test_a_shared_layout_runs_the_ir_task_rounding_halves_to_even(in_dtype, out_dtype,
                                                                   laid_both):
    # channels 151 = 2 · 64 + 16 + 7 (channels-last: whole blocks, a whole vector, a masked
    # one), positions 135 = 2 · 64 + 7 (NCHW: whole blocks, a masked vector); without
    # AVX-512, whole vectors of 16 and a masked one of 7 each
    shape = (1, 151, 2, 135)
    limits = np.iinfo(in_dtype)
    values = RNG.integers(limits.min, limits.max + 1, shape).astype(in_dtype)
    # x / 2 lands on halves for odd x; ±1e12 pass any int32 and must saturate, not wrap
    scale = np.resize(np.array([0.5, -0.5, 1.5, 1e12, -1e12], np.float32), shape[1])
    shift = np.resize(np.array([0.0, 0.5, -0.5, 0.0, 0.0], np.float32), shape[1])
    want = ranges.saturate_round(values.astype(np.float32) * scale.reshape(1, -1, 1, 1)
                                 + shift.reshape(1, -1, 1, 1), out_dtype)
    out = np.zeros(shape, out_dtype)
    job = int8_affine.affine_job(laid(values) if laid_both else values, scale, shift, out,
                                 laid_both, laid_both)
    job()
    task = int8_affine.vector_task(in_dtype == np.int8, out_dtype == np.int8, laid_both)
    assert task in job.args  # the IR task, not the numba pass
    np.testing.assert_array_equal(unlaid(out) if laid_both else out, want)
