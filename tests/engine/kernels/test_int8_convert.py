"""The compiled quantize and dequantize passes (`int8_convert`) give NumPy's bytes, and the
bound ``_contrib_quantize_v2`` / ``_contrib_dequantize`` nodes of a plan run them."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cpu import spin_pool
from engine.kernels import int8_convert
from engine.ops.quantized import ranges
from engine.ops.registry import get_op

RNG = np.random.default_rng(29)

pytestmark = pytest.mark.skipif(not int8_convert.available(),
                                reason="needs numba and the spin pool")


def _values(rng, size):
    values = (rng.standard_normal(size) * 3).astype(np.float32)
    values[:6] = [np.inf, -np.inf, 0.5, 1.5, -2.5, 1e30]  # saturation and ties to even
    return values


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("size", [1, 7, 4099, 100_003])
def test_quantize_gives_numpys_bytes(dtype, size):
    rng = np.random.default_rng(size)
    values = np.ascontiguousarray(_values(rng, max(size, 6))[:size])
    scale = np.array([np.float32(127.5 / 2.3)], np.float32)
    want = ranges.saturate_round(values * scale[0], np.dtype(dtype))
    out = np.full(values.shape, 9, dtype)
    job = int8_convert.quantize_job(values, scale, *ranges.LIMITS[np.dtype(dtype)], out)
    with spin_pool.armed(2):
        job()
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32])
def test_dequantize_gives_numpys_floats(dtype):
    rng = np.random.default_rng(3)
    info = np.iinfo(dtype)
    values = rng.integers(info.min, info.max, (3, 5, 7, 11), endpoint=True).astype(dtype)
    step = np.array([np.float32(1.7 / 127.5)], np.float32)
    out = np.zeros(values.shape, np.float32)
    job = int8_convert.dequantize_job(values, step, out)
    job()
    np.testing.assert_array_equal(out, values.astype(np.float32) * step[0])


@pytest.mark.parametrize("low,high", [(-1.3, 2.9), (0.0, 4.2)])
def test_bound_quantize_v2_equals_its_kernel(low, high):
    op = get_op("_contrib_quantize_v2")
    attrs = op.parse_attrs({"out_type": "auto", "min_calib_range": repr(low),
                            "max_calib_range": repr(high)})
    data = _values(np.random.default_rng(5), 2 * 3 * 9 * 9).reshape(2, 3, 9, 9)
    want = op.compute(np, attrs, [data])
    out = tuple(np.zeros_like(np.asarray(value)) for value in want)
    (call,) = op.bind(np, attrs, [data], out)
    call()
    for got, expected in zip(out, want, strict=True):
        np.testing.assert_array_equal(got, np.asarray(expected))
    assert out[0].dtype == (np.uint8 if low >= 0 else np.int8)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32])
def test_bound_dequantize_follows_its_range_from_run_to_run(dtype):
    """The bound node makes its step once per range: a run after the range inputs changed
    in place (or turned to NaN, which equals nothing) gives the kernel's floats for the new
    range, one with the range unchanged the same floats again."""
    op = get_op("_contrib_dequantize")
    attrs = op.parse_attrs({})
    info = np.iinfo(dtype)
    data = np.random.default_rng(4).integers(info.min, info.max, (2, 3, 4, 5),
                                             endpoint=True).astype(dtype)
    low, high = np.array([-1.5], np.float32), np.array([2.5], np.float32)
    out = np.zeros(data.shape, np.float32)
    (call,) = op.bind(np, attrs, [data, low, high], out)
    for new_low, new_high in [(-1.5, 2.5), (-1.5, 2.5), (-3.25, 0.5), (-3.25, 7.0),
                              (np.nan, 1.0), (-0.75, 0.25)]:
        low[0], high[0] = new_low, new_high
        call()
        (want,) = op.compute(np, attrs, [data, low, high])
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_dequantize_reads_channels_last_bytes_into_nchw(dtype):
    """Bytes laid N, H, W, C in an (N, C, H, W) array (a fused convolution's hand-off) come
    out as NumPy's floats in NCHW order."""
    rng = np.random.default_rng(8)
    info = np.iinfo(dtype)
    values = rng.integers(info.min, info.max, (3, 5, 7, 11), endpoint=True).astype(dtype)
    laid = np.ascontiguousarray(values.transpose(0, 2, 3, 1)).reshape(values.shape)
    step = np.array([np.float32(2.3 / 127.5)], np.float32)
    out = np.zeros(values.shape, np.float32)
    job = int8_convert.dequantize_channels_last_job(laid, step, out)
    with spin_pool.armed(2):
        job()
    np.testing.assert_array_equal(out, values.astype(np.float32) * step[0])


@pytest.mark.skipif(not int8_convert.vector_available(),
                    reason="needs AVX2 and llvmlite's JIT")
@pytest.mark.parametrize("channels", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype, low, high", [(np.int8, -128, 127), (np.uint8, 0, 255)])
def test_an_images_few_channels_quantize_channels_last_in_the_ir_task(channels, dtype, low,
                                                                      high):
    """Up to 4 channels run `int8_convert_ir`'s task (16 pixels a step, a row's last step
    of 7 masked): the bytes of the plain quantize, transposed, halves rounded to even, NaN
    as zero, infinities and values past the bounds saturated."""
    values = (RNG.standard_normal((2, channels, 5, 39)) * 3).astype(np.float32)
    values.reshape(-1)[:8] = [np.nan, np.inf, -np.inf, 1e9, 0.5 / 40, 1.5 / 40, -2.5 / 40,
                              -1e9]
    scale = np.array([40.0], np.float32)
    plain, laid = np.empty(values.shape, dtype), np.full(values.shape, 7, dtype)
    int8_convert.quantize_job(values, scale, low, high, plain)()
    job = int8_convert.quantize_channels_last_job(values, scale, low, high, laid)
    assert int8_convert.vector_task(channels) in job.args  # the IR task, not numba's pass
    with spin_pool.armed(2):
        job()
    np.testing.assert_array_equal(laid.reshape(2, 5, 39, channels),
                                  plain.transpose(0, 2, 3, 1))
    scale[0] = 3.0  # read at each run
    job()
    int8_convert.quantize_job(values, scale, low, high, plain)()
    np.testing.assert_array_equal(laid.reshape(2, 5, 39, channels),
                                  plain.transpose(0, 2, 3, 1))


@pytest.mark.parametrize("dtype, low, high", [(np.int8, -128, 127), (np.uint8, 0, 255)])
def test_quantize_channels_last_writes_the_quantize_bytes_transposed(dtype, low, high):
    values = (RNG.standard_normal((3, 5, 7, 9)) * 3).astype(np.float32)
    values.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, 1e9]
    scale = np.array([40.0], np.float32)
    plain, laid = np.empty(values.shape, dtype), np.empty(values.shape, dtype)
    int8_convert.quantize_job(values, scale, low, high, plain)()
    int8_convert.quantize_channels_last_job(values, scale, low, high, laid)()
    np.testing.assert_array_equal(laid.reshape(3, 7, 9, 5), plain.transpose(0, 2, 3, 1))
