"""`int8_pool`: max pooling of int8/uint8 values equals the float op's over the same values,
exactly, in each layout pair of the channels-last hand-off."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cpu import spin_pool
from engine.kernels import int8_pool
from engine.ops.registry import get_op

pytestmark = pytest.mark.skipif(not int8_pool.available(), reason="needs numba and the spin pool")

RNG = np.random.default_rng(17)

CASES = [  # (N, C, H, W), window, pooling convention
    ((2, 64, 13, 11), int8_pool.Window((3, 3), (2, 2), (1, 1)), "valid"),  # ResNet's, odd
    ((1, 3, 8, 8), int8_pool.Window((3, 3), (2, 2), (1, 1)), "valid"),
    ((3, 5, 7, 9), int8_pool.Window((2, 3), (1, 2), (0, 1)), "valid"),
    ((1, 17, 6, 5), int8_pool.Window((3, 2), (2, 3), (1, 1)), "full"),  # windows past the end
]


def float_max_pool(values: np.ndarray, window: int8_pool.Window, convention: str) -> np.ndarray:
    pooling = get_op("Pooling")
    attrs = pooling.parse_attrs({"kernel": str(window.kernel), "stride": str(window.stride),
                                 "pad": str(window.pad), "pool_type": "max",
                                 "pooling_convention": convention})
    (result,) = pooling.compute(np, attrs, [values.astype(np.float32)])
    # a window wholly in the padding: -inf in float, the type's lowest in int8/uint8
    return np.where(np.isneginf(result), np.iinfo(values.dtype).min, result)


def laid(array: np.ndarray) -> np.ndarray:
    """``array`` (N, C, H, W) with its bytes channels-last in a buffer of its own shape."""
    return np.ascontiguousarray(array.transpose(0, 2, 3, 1)).reshape(array.shape)


def unlaid(buffer: np.ndarray) -> np.ndarray:
    batch, channels, height, width = buffer.shape
    return buffer.reshape(batch, height, width, channels).transpose(0, 3, 1, 2)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("shape, window, convention", CASES)
@pytest.mark.parametrize("data_laid", [False, True])
@pytest.mark.parametrize("out_laid", [False, True])
def test_max_pooling_equals_the_float_op(dtype, shape, window, convention, data_laid, out_laid):
    limits = np.iinfo(dtype)
    values = RNG.integers(limits.min, limits.max + 1, shape).astype(dtype)
    want = float_max_pool(values, window, convention)
    out = np.full((*shape[:2], *want.shape[2:]), 99, dtype)
    job = int8_pool.max_pool_job(laid(values) if data_laid else values, window, out,
                                 data_laid, out_laid)
    assert job is not None
    job()
    got = unlaid(out) if out_laid else out
    np.testing.assert_array_equal(got.astype(np.float32), want)


def test_a_window_wholly_in_the_padding_gets_the_lowest_value():
    values = np.full((1, 2, 1, 1), -5, np.int8)
    window = int8_pool.Window((1, 1), (2, 2), (1, 1))  # the corner windows see padding only
    out = np.zeros((1, 2, 2, 2), np.int8)
    int8_pool.max_pool_job(values, window, out, False, False)()
    assert (out == -128).sum() == 8


def test_mismatched_dtypes_are_refused_by_name():
    with pytest.raises(ValueError, match="int8 max pooling: int8"):
        int8_pool.max_pool_job(np.zeros((1, 2, 4, 4), np.int8),
                               int8_pool.Window((3, 3), (2, 2), (1, 1)),
                               np.zeros((1, 2, 2, 2), np.uint8), False, False)


@pytest.mark.parametrize("in_dtype,out_dtype", [(np.uint8, np.uint8), (np.int8, np.int8),
                                                (np.int8, np.uint8)])
@pytest.mark.parametrize("data_laid", [False, True])
def test_the_global_average_scales_each_channels_exact_sum(in_dtype, out_dtype, data_laid):
    """Each channel's integer sum, in float32 times the factor, rounded half to even and
    saturated: NumPy's bytes, whichever layout the data lies in."""
    limits = np.iinfo(in_dtype)
    values = RNG.integers(limits.min, limits.max + 1, (3, 70, 7, 7)).astype(in_dtype)
    values[0, 0], values[1, 1] = limits.max, limits.min  # both ends saturate
    factor = np.array([3 / 49], np.float32)
    sums = values.reshape(3, 70, -1).sum(axis=2, dtype=np.int64)
    ends = np.iinfo(out_dtype)
    want = np.clip(np.rint(sums.astype(np.float32) * factor[0]), ends.min, ends.max)
    assert (want == ends.min).any() and (want == ends.max).any()
    out = np.full((3, 70, 1, 1), 9, out_dtype)
    int8_pool.global_average_job(laid(values) if data_laid else values, factor, out,
                                 data_laid)()
    np.testing.assert_array_equal(out.reshape(3, 70), want.astype(out_dtype))


def test_a_global_average_past_float32s_exact_sums_is_refused():
    with pytest.raises(ValueError, match="int8 global average"):
        int8_pool.global_average_job(np.zeros((1, 2, 300, 300), np.uint8),
                                     np.ones(1, np.float32), np.zeros((1, 2, 1, 1), np.uint8),
                                     False)


@pytest.mark.parametrize("batch,channels", [(1, 512), (1, 200), (2, 130)])
@pytest.mark.parametrize("data_laid", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_global_average_is_cut_into_blocks_of_channels(batch, channels, data_laid, threads):
    """The job's parts are blocks of `CHANNEL_BLOCK` channels of an image (the last one
    short where the channels are no multiple of it), so that a single image's head runs on
    every core: NumPy's bytes, on one thread and on two."""
    values = RNG.integers(0, 256, (batch, channels, 7, 7)).astype(np.uint8)
    factor = np.array([1 / 49], np.float32)
    sums = values.reshape(batch, channels, -1).sum(axis=2, dtype=np.int64)
    want = np.clip(np.rint(sums.astype(np.float32) * factor[0]), 0, 255).astype(np.uint8)
    out = np.zeros((batch, channels, 1, 1), np.uint8)
    job = int8_pool.global_average_job(laid(values) if data_laid else values, factor, out,
                                       data_laid)
    assert job.args[-1] > 1  # parts: even one image's channels are shared out
    with spin_pool.armed(threads):
        for _ in range(3):
            out[...] = 0
            job()
            np.testing.assert_array_equal(out.reshape(batch, channels), want)
