"""The fused int8 depthwise convolution (`int8_depthwise.FusedDepthwise`) against the NumPy
path it replaces (`integer.conv`'s int32 depthwise sums, the bias, `requantize.finish`): equal
bit for bit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from engine.cpu import spin_pool
from engine.kernels import int8_conv, int8_depthwise
from engine.ops.quantized import integer
from engine.ops.quantized.requantize import finish
from engine.ops.quantized.subgraph_attrs import Activation

pytestmark = pytest.mark.skipif(not int8_depthwise.available(),
                                reason="needs numba and the spin pool")

# (batch, channels, size, kernel, stride, pad, dilate): channels off the vector widths
SHAPES = [(1, 5, (9, 11), (3, 3), (1, 1), (1, 1), (1, 1)),
          (3, 19, (10, 7), (3, 3), (2, 2), (1, 1), (1, 1)),
          (1, 70, (8, 8), (5, 5), (1, 1), (2, 2), (1, 1)),
          (3, 33, (12, 13), (3, 3), (1, 2), (2, 1), (2, 2))]


def layer(shape: tuple, rng: np.random.Generator, data_dtype: type, act: str | None,
          act_high: float, with_residual: bool,
          scales: Callable[[np.ndarray], np.ndarray]) -> tuple:
    """A depthwise layer of ``shape`` with random data, weights, residual and epilogue
    (``scales(weight)`` its requantize scales), and the NumPy path's output: (geometry, data,
    weight, residual, out_shape, out_dtype, epilogue, want)."""
    batch, channels, size, kernel, stride, pad, dilate = shape
    geometry = int8_conv.Geometry(kernel, stride, dilate, pad)
    info = np.iinfo(data_dtype)
    data = rng.integers(info.min, info.max + 1, (batch, channels, *size)).astype(data_dtype)
    weight = rng.integers(-127, 128, (channels, 1, *kernel)).astype(np.int8)
    out_shape = (batch, channels, *geometry.out_size(*size))
    residual = rng.integers(-128, 128, out_shape).astype(np.int8) if with_residual else None
    out_dtype = np.uint8 if act else np.int8
    storage = np.dtype(np.int8) if with_residual else np.dtype(out_dtype)
    limits = np.iinfo(storage)
    epilogue = int8_conv.Epilogue(
        bias=rng.integers(-3000, 3000, channels).astype(np.int32), scales=scales(weight),
        act=act, act_high=act_high, residual_scale=0.61 if with_residual else 0.0,
        low=int(limits.min), high=int(limits.max))
    sums = integer.conv(data, weight, kernel, stride, dilate, pad, channels)
    sums += epilogue.bias.astype(np.float64).reshape(1, -1, 1, 1)
    want = finish(sums, epilogue.scales, 1, storage,
                  None if act is None else Activation(act, act_high),
                  None if residual is None else (residual, np.float32(0.61))).astype(out_dtype)
    return geometry, data, weight, residual, out_shape, out_dtype, epilogue, want


def outputs_armed_and_alone(conv: Any, epilogue: Any, out: np.ndarray) -> list[np.ndarray]:
    """``out`` after the layer ran on two threads of the spin pool, then on this one alone."""
    outputs = []
    for armed in (True, False):
        out[...] = 0
        if armed:
            with spin_pool.armed(2):
                conv(epilogue)
        else:
            conv(epilogue)
        outputs.append(out.copy())
    return outputs


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("data_dtype,act,with_residual", [
    (np.uint8, "relu", False), (np.int8, None, True), (np.int8, "bounded_relu", False)])
@pytest.mark.parametrize("chunk_bytes", [16, int8_depthwise.CHUNK_BYTES])
def test_equals_the_numpy_path_bit_for_bit(monkeypatch, shape, data_dtype, act, with_residual,
                                           chunk_bytes):
    monkeypatch.setattr(int8_depthwise, "CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(shape[1] * 7 + shape[0])
    geometry, data, weight, residual, out_shape, out_dtype, epilogue, want = layer(
        shape, rng, data_dtype, act, 60.5 if act == "bounded_relu" else 0.0, with_residual,
        lambda weight: rng.uniform(0.002, 0.02, len(weight)).astype(np.float32))
    out = np.zeros(out_shape, out_dtype)
    conv = int8_depthwise.FusedDepthwise(data, weight, geometry, out, residual)
    with spin_pool.armed(2):
        conv(epilogue)
    np.testing.assert_array_equal(out, want)
    out[...] = 0
    conv(epilogue)  # on one thread
    np.testing.assert_array_equal(out, want)


def test_refuses_a_channel_multiplier():
    data = np.zeros((1, 4, 6, 6), np.uint8)
    assert not int8_depthwise.supported(data, np.zeros((8, 1, 3, 3), np.int8), 4)
    assert int8_depthwise.supported(data, np.zeros((4, 1, 3, 3), np.int8), 4)


# (batch, channels, size, kernel, stride, pad, dilate): 3×3 windows, MobileNet's strides
LAID_SHAPES = [(1, 37, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1)),
               (2, 21, (11, 10), (3, 3), (2, 2), (1, 1), (1, 1)),
               (1, 18, (12, 13), (3, 3), (1, 2), (2, 1), (2, 1)),
               (1, 9, (9, 9), (5, 5), (1, 1), (2, 2), (1, 1))]  # 5×5: sums, then epilogue


@pytest.mark.parametrize("shape", LAID_SHAPES)
@pytest.mark.parametrize("laid", [int8_conv.Layouts(data=True, out=True),
                                  int8_conv.Layouts(data=True),
                                  int8_conv.Layouts(out=True)])
@pytest.mark.parametrize("data_dtype,act,act_high,with_residual", [
    (np.uint8, "bounded_relu", 40.5, False), (np.int8, None, 0.0, False),
    (np.uint8, "relu", 0.0, True)])
def test_channels_last_arrays_equal_the_numpy_path(shape, laid, data_dtype, act, act_high,
                                                   with_residual):
    """Data and output handed over channels-last (N, H, W, C in the NCHW buffer), the 3×3
    window without a residual as one pass (`_window_3x3`): NumPy's bytes."""
    rng = np.random.default_rng(shape[1] * 5 + shape[0] + len(str(act)))

    def scales(weight: np.ndarray) -> np.ndarray:
        reach = float(np.sqrt(weight[0].size)) * 127 * 40  # sums over the range and past it
        return (rng.uniform(0.5, 2.0, len(weight)) * 128 / reach).astype(np.float32)

    geometry, data, weight, residual, out_shape, out_dtype, epilogue, want = layer(
        shape, rng, data_dtype, act, act_high, with_residual, scales)

    def held(array: np.ndarray, channels_last: bool) -> np.ndarray:
        """An NCHW-shaped buffer holding ``array``'s values N, H, W, C where asked."""
        if not channels_last:
            return array.copy()
        return np.ascontiguousarray(np.moveaxis(array, 1, -1)).reshape(array.shape)

    out = np.full(out_shape, 77, out_dtype)
    conv = int8_depthwise.FusedDepthwise(held(data, laid.data), weight, geometry, out,
                                         residual, laid)
    for got in outputs_armed_and_alone(conv, epilogue, out):
        np.testing.assert_array_equal(got, held(want, laid.out))


# (batch, channels, size, kernel, stride, pad, dilate): the vector window's cases, whole
# 16-channel blocks and a tail, a width whose last stride-2 window reaches the right padding,
# a one-pixel image, and a pad of 2 (read from the padded copy)
VECTOR_SHAPES = [(1, 48, (7, 9), (3, 3), (1, 1), (1, 1), (1, 1)),
                 (2, 40, (9, 11), (3, 3), (2, 2), (1, 1), (1, 1)),
                 (1, 16, (1, 1), (3, 3), (1, 1), (1, 1), (1, 1)),
                 (1, 20, (2, 3), (3, 3), (2, 2), (1, 1), (1, 1)),
                 (1, 7, (5, 4), (3, 3), (1, 1), (1, 1), (1, 1)),
                 (3, 33, (6, 5), (3, 3), (2, 2), (2, 2), (1, 1))]


@pytest.mark.parametrize("shape", VECTOR_SHAPES)
@pytest.mark.parametrize("data_laid", [True, False])
@pytest.mark.parametrize("data_dtype,act,act_high", [
    (np.uint8, "bounded_relu", 40.5), (np.int8, None, 0.0), (np.uint8, "relu", 0.0)])
def test_vector_window_equals_the_numpy_path(monkeypatch, shape, data_laid, data_dtype, act,
                                             act_high):
    """The 3×3 window of stride 1 or 2 as `depthwise_int8_ir`'s task (on the data where it
    lies, or on the padded copy): NumPy's bytes, and the task did run."""
    if not int8_depthwise.vector_available():
        pytest.skip("no AVX2 or no JIT for the vector window")
    taken = []
    vector_job = int8_depthwise.FusedDepthwise._vector_job

    def spied(self, *args):
        job = vector_job(self, *args)
        taken.append(job is not None)
        return job

    monkeypatch.setattr(int8_depthwise.FusedDepthwise, "_vector_job", spied)
    rng = np.random.default_rng(shape[1] * 3 + shape[2][1] + len(str(act)))

    def scales(weight: np.ndarray) -> np.ndarray:
        return (rng.uniform(0.5, 2.0, len(weight)) * 128 / (3 * 127 * 60)).astype(np.float32)

    geometry, data, weight, residual, out_shape, out_dtype, epilogue, want = layer(
        shape, rng, data_dtype, act, act_high, False, scales)
    laid = int8_conv.Layouts(data=data_laid, out=True)
    held_data = np.ascontiguousarray(np.moveaxis(data, 1, -1)).reshape(data.shape) \
        if data_laid else data
    out = np.full(out_shape, 77, out_dtype)
    conv = int8_depthwise.FusedDepthwise(held_data, weight, geometry, out, None, laid)
    for got in outputs_armed_and_alone(conv, epilogue, out):
        got = np.moveaxis(got.reshape(out_shape[0], *out_shape[2:], out_shape[1]), -1, 1)
        np.testing.assert_array_equal(got, want)
    assert taken and taken[-1]


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("data_dtype", [np.uint8, np.int8])  # int8: the padded copy, shifted
@pytest.mark.parametrize(("bias_low", "bias_high", "folded"), [
    (0, 3000, True),  # every partial sum below 2²⁴: the bias joins the float32 shift
    (2 ** 24, 2 ** 26, False)])  # past float32's exact integers: added as an int32
def test_vector_window_folds_the_bias_only_where_float32_is_exact(
        monkeypatch, stride, data_dtype, bias_low, bias_high, folded):
    """The vector window with the bias folded into its float32 shift, and with it added as
    an int32 where a partial sum could reach 2²⁴: NumPy's bytes either way, and the task
    taken is the one the bias allows."""
    if not int8_depthwise.vector_available():
        pytest.skip("no AVX2 or no JIT for the vector window")
    asked = []
    vector_task = int8_depthwise._vector_task

    def spied(stride: int, folded: bool = False) -> int | None:
        asked.append(folded)
        return vector_task(stride, folded)

    monkeypatch.setattr(int8_depthwise, "_vector_task", spied)
    rng = np.random.default_rng(bias_high + stride)
    shape = (1, 37, (9, 10), (3, 3), (stride, stride), (1, 1), (1, 1))
    geometry, data, weight, _, out_shape, out_dtype, epilogue, _ = layer(
        shape, rng, data_dtype, "bounded_relu", 90.5, False,
        lambda weight: np.ones(len(weight), np.float32))
    epilogue.bias[:] = rng.integers(bias_low, bias_high, 37)
    epilogue.bias[::2] *= -1
    sums = integer.conv(data, weight, (3, 3), (stride, stride), (1, 1), (1, 1), 37)
    sums += epilogue.bias.astype(np.float64).reshape(1, -1, 1, 1)
    # the largest sum of each channel to 90: a small bias leaves its outputs spread over
    # the clamp's range, a large one near its ends
    epilogue.scales[:] = 90 / np.abs(sums).max(axis=(0, 2, 3))
    want = finish(sums, epilogue.scales, 1, np.dtype(np.uint8),
                  Activation("bounded_relu", 90.5), None)
    assert len(np.unique(want)) > (40 if folded else 1)
    out = np.zeros(out_shape, out_dtype)
    held = np.ascontiguousarray(np.moveaxis(data, 1, -1)).reshape(data.shape)
    conv = int8_depthwise.FusedDepthwise(held, weight, geometry, out, None,
                                         int8_conv.Layouts(data=True, out=True))
    for got in outputs_armed_and_alone(conv, epilogue, out):
        np.testing.assert_array_equal(np.moveaxis(got.reshape(1, *out_shape[2:], 37), -1, 1),
                                      want)
    assert asked and asked[-1] == folded


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("data_laid", [True, False])
def test_vector_window_puts_each_product_in_its_own_output(monkeypatch, stride, data_laid):
    """Small data and taps with a scale of 1: each output is its window's exact sum plus the
    bias, so a product of the wrong tap, pixel or padding (a chain of the sum mislaid) shows
    as a wrong byte, whichever order the task adds the products in."""
    if not int8_depthwise.vector_available():
        pytest.skip("no AVX2 or no JIT for the vector window")
    rng = np.random.default_rng(11 + stride)
    shape = (2, 35, (9, 10), (3, 3), (stride, stride), (1, 1), (1, 1))
    geometry, data, weight, _, out_shape, _, epilogue, _ = layer(
        shape, rng, np.uint8, None, 0.0, False, lambda weight: np.ones(len(weight), np.float32))
    data[:] = rng.integers(0, 3, data.shape)
    # nine taps of distinct values, both signs: a product of the wrong tap changes the sum
    weight[:] = np.array([1, 2, 4, -1, -2, -4, 3, -3, 5], np.int8).reshape(1, 1, 3, 3)
    epilogue.bias[:] = rng.integers(-20, 21, 35)
    sums = integer.conv(data, weight, (3, 3), (stride, stride), (1, 1), (1, 1), 35)
    want = (sums + epilogue.bias.astype(np.float64).reshape(1, -1, 1, 1)).astype(np.int8)
    assert np.abs(sums + epilogue.bias.reshape(1, -1, 1, 1)).max() <= 127  # none saturates
    held = np.ascontiguousarray(np.moveaxis(data, 1, -1)).reshape(data.shape) \
        if data_laid else data
    out = np.zeros(out_shape, np.int8)
    conv = int8_depthwise.FusedDepthwise(held, weight, geometry, out, None,
                                         int8_conv.Layouts(data=data_laid, out=True))
    for got in outputs_armed_and_alone(conv, epilogue, out):
        got = np.moveaxis(got.reshape(out_shape[0], *out_shape[2:], 35), -1, 1)
        np.testing.assert_array_equal(got, want)


def test_a_bias_past_the_vector_reach_equals_the_numpy_path():
    """A bias the vector window's int32 addition could overflow with: the numba window, still
    NumPy's bytes."""
    rng = np.random.default_rng(5)
    shape = (1, 16, (6, 6), (3, 3), (1, 1), (1, 1), (1, 1))
    geometry, data, weight, _, out_shape, out_dtype, epilogue, _ = layer(
        shape, rng, np.uint8, None, 0.0, False,
        lambda weight: np.full(len(weight), 2.0 ** -24, np.float32))
    epilogue.bias[:] = rng.integers(int8_depthwise.BIAS_REACH, 2 ** 31 - 1, 16)
    epilogue.bias[::2] *= -1
    sums = integer.conv(data, weight, (3, 3), (1, 1), (1, 1), (1, 1), 16)
    sums += epilogue.bias.astype(np.float64).reshape(1, -1, 1, 1)
    want = finish(sums, epilogue.scales, 1, np.dtype(np.int8), None, None)
    laid = int8_conv.Layouts(data=True, out=True)
    out = np.zeros(out_shape, out_dtype)
    conv = int8_depthwise.FusedDepthwise(
        np.ascontiguousarray(np.moveaxis(data, 1, -1)).reshape(data.shape), weight, geometry,
        out, None, laid)
    conv(epilogue)
    np.testing.assert_array_equal(
        np.moveaxis(out.reshape(1, 6, 6, 16), -1, 1), want)
    assert np.abs(want).max() > 60  # the bias reached the outputs
