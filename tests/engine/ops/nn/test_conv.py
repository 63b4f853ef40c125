"""Convolution, Deconvolution and UpSampling against naive references, plus shape inference."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from engine.errors import ModelFormatError, ShapeError
from engine.ops import get_op
from tests.engine.ops.helpers import run_op

RNG = np.random.default_rng(7)


def _random(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def naive_conv(data: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, stride: tuple,
               dilate: tuple, pad: tuple, group: int) -> np.ndarray:
    """Direct convolution: per group and kernel position, an einsum over input channels."""
    ndim = data.ndim - 2
    padded = np.pad(data.astype(np.float64), [(0, 0), (0, 0)] + [(p, p) for p in pad])
    kernel = weight.shape[2:]
    size = [(padded.shape[2 + i] - dilate[i] * (kernel[i] - 1) - 1) // stride[i] + 1
            for i in range(ndim)]
    filters, per_group = weight.shape[0], weight.shape[1]
    out = np.zeros((data.shape[0], filters, *size))
    step = filters // group
    for g in range(group):
        channels = padded[:, g * per_group:(g + 1) * per_group]
        for position in itertools.product(*(range(k) for k in kernel)):
            index = tuple(slice(position[i] * dilate[i],
                                position[i] * dilate[i] + stride[i] * (size[i] - 1) + 1,
                                stride[i]) for i in range(ndim))
            taps = weight[(slice(g * step, (g + 1) * step), slice(None), *position)]
            out[:, g * step:(g + 1) * step] += np.einsum("nc...,fc->nf...",
                                                         channels[(..., *index)], taps)
    if bias is not None:
        out += bias.reshape((1, -1) + (1,) * ndim)
    return out


CONV_CASES = [
    # (data shape, num_filter, kernel, stride, dilate, pad, group, no_bias)
    ((2, 3, 9), 4, (3,), (2,), (1,), (1,), 1, False),
    ((1, 4, 11), 6, (3,), (1,), (2,), (2,), 2, False),
    ((2, 3, 8, 7), 5, (3, 3), (1, 1), (1, 1), (1, 1), 1, False),
    ((1, 6, 9, 9), 4, (3, 2), (2, 1), (1, 2), (1, 0), 2, True),
    ((2, 8, 7, 7), 8, (3, 3), (1, 1), (1, 1), (1, 1), 8, False),   # depthwise
    ((1, 6, 9, 8), 6, (3, 3), (2, 2), (1, 1), (1, 1), 6, True),    # depthwise, strided
    ((1, 4, 6, 6), 8, (3, 3), (1, 1), (2, 2), (2, 2), 4, False),   # depthwise, multiplier 2
    ((2, 6, 5, 5), 9, (1, 1), (1, 1), (1, 1), (0, 0), 3, False),   # 1x1 grouped
    ((2, 6, 7, 7), 4, (1, 1), (2, 2), (1, 1), (0, 0), 1, False),   # 1x1 strided
    ((1, 2, 4, 5, 5), 3, (3, 3, 3), (1, 2, 1), (1, 1, 1), (1, 0, 1), 1, False),
    ((1, 4, 4, 5, 5), 4, (2, 3, 3), (1, 1, 1), (1, 1, 1), (0, 1, 1), 4, False),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
def test_convolution_matches_naive_reference(case: tuple) -> None:
    shape, filters, kernel, stride, dilate, pad, group, no_bias = case
    data = _random(*shape)
    weight = _random(filters, shape[1] // group, *kernel)
    bias = None if no_bias else _random(filters)
    attrs = {"kernel": str(kernel), "stride": str(stride), "dilate": str(dilate),
             "pad": str(pad), "num_filter": str(filters), "num_group": str(group),
             "no_bias": str(no_bias)}
    inputs = [data, weight] + ([] if bias is None else [bias])
    result = run_op("Convolution", attrs, inputs)
    expected = naive_conv(data, weight, bias, stride, dilate, pad, group)
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)
    assert result.dtype == np.float32


def test_convolution_infers_weight_and_bias_from_data() -> None:
    op = get_op("Convolution")
    attrs = op.parse_attrs({"kernel": "(3, 3)", "num_filter": "16", "num_group": "2",
                            "stride": "(2, 2)", "pad": "(1, 1)"})
    inputs, (out,) = op.infer_shape(attrs, [(4, 8, 32, 30), None, None])
    assert inputs == [(4, 8, 32, 30), (16, 4, 3, 3), (16,)]
    assert out == (4, 16, 16, 15)


def test_convolution_partial_shapes() -> None:
    op = get_op("Convolution")
    attrs = op.parse_attrs({"kernel": "(3,)", "num_filter": "5", "no_bias": "True"})
    inputs, (out,) = op.infer_shape(attrs, [(0, 6, 0), None])
    assert inputs == [(0, 6, 0), (5, 6, 3)] and out == (0, 5, 0)
    # Channels come from the weight when the data does not say.
    inputs, (out,) = op.infer_shape(attrs, [(2, 0, 10), (5, 6, 3)])
    assert inputs == [(2, 6, 10), (5, 6, 3)] and out == (2, 5, 8)
    inputs, (out,) = op.infer_shape(attrs, [None, None])
    assert inputs == [None, (5, 0, 3)] and out is None


def test_convolution_shape_errors() -> None:
    op = get_op("Convolution")
    attrs = op.parse_attrs({"kernel": "(3, 3)", "num_filter": "4"})
    with pytest.raises(ShapeError, match="weight"):
        op.infer_shape(attrs, [(1, 3, 8, 8), (4, 2, 3, 3), None])
    with pytest.raises(ShapeError, match="too small"):
        op.infer_shape(attrs, [(1, 3, 2, 8), None, None])
    with pytest.raises(ShapeError, match="num_group"):
        op.infer_shape(op.parse_attrs({"kernel": "(1, 1)", "num_filter": "4",
                                       "num_group": "3"}), [(1, 6, 4, 4), None, None])
    with pytest.raises(ShapeError, match="4 dimensions"):
        op.infer_shape(attrs, [(1, 3, 8), None, None])


def test_channels_last_layout_is_refused_clearly() -> None:
    with pytest.raises(ModelFormatError, match="NHWC.*channels-first"):
        get_op("Convolution").parse_attrs({"kernel": "(3, 3)", "num_filter": "4",
                                           "layout": "NHWC"})
    attrs = get_op("_npx_convolution").parse_attrs({"kernel": "(3, 3)", "num_filter": "4",
                                                    "layout": "NCHW", "cudnn_tune": "fastest",
                                                    "workspace": "256", "cudnn_off": "1"})
    assert attrs.layout == "NCHW"


@pytest.mark.parametrize("group", [1, 4])
def test_convolution_writes_into_out(group: int) -> None:
    data, weight, bias = _random(2, 4, 6, 6), _random(8, 4 // group, 3, 3), _random(8)
    attrs = {"kernel": "(3, 3)", "pad": "(1, 1)", "num_filter": "8", "num_group": str(group)}
    expected = naive_conv(data, weight, bias, (1, 1), (1, 1), (1, 1), group)
    out = np.full((2, 8, 6, 6), np.nan, dtype=np.float32)
    result = run_op("Convolution", attrs, [data, weight, bias], out=out)
    assert result is out
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    # A non-contiguous destination (a transposed view) is filled too.
    backing = np.full((2, 6, 6, 8), np.nan, dtype=np.float32)
    view = backing.transpose(0, 3, 1, 2)
    run_op("Convolution", attrs, [data, weight, bias], out=view)
    np.testing.assert_allclose(view, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", [
    # (data shape, num_filter, kernel, stride, dilate, pad, group)
    ((2, 3, 9), 4, (3,), (2,), (1,), (1,), 1),
    ((1, 4, 7, 8), 6, (3, 3), (2, 2), (1, 1), (1, 1), 2),
    ((1, 4, 7, 7), 4, (4, 4), (2, 2), (1, 1), (1, 1), 4),
    ((1, 2, 8, 9), 3, (3, 2), (1, 2), (2, 1), (2, 0), 1),
    ((1, 2, 5, 5, 4), 2, (2, 2, 2), (2, 1, 2), (1, 1, 1), (0, 1, 0), 2),
])
def test_deconvolution_is_the_adjoint_of_convolution(case: tuple) -> None:
    shape, filters, kernel, stride, dilate, pad, group = case
    data = _random(*shape).astype(np.float64)
    weight = _random(filters, shape[1] // group, *kernel).astype(np.float64)
    forward = naive_conv(data, weight, None, stride, dilate, pad, group)
    cotangent = RNG.standard_normal(forward.shape)
    sizes = forward.shape[2:]
    adj = tuple(length - ((n - 1) * s + d * (k - 1) + 1 - 2 * p)
                for length, n, s, d, k, p in zip(shape[2:], sizes, stride, dilate, kernel, pad,
                                                 strict=True))
    attrs = {"kernel": str(kernel), "stride": str(stride), "dilate": str(dilate),
             "pad": str(pad), "adj": str(adj), "num_filter": str(shape[1]),
             "num_group": str(group)}
    backward = run_op("Deconvolution", attrs, [cotangent, weight])
    assert backward.shape == data.shape
    np.testing.assert_allclose(np.vdot(forward, cotangent), np.vdot(data, backward), rtol=1e-9)


def test_deconvolution_shapes_bias_and_out() -> None:
    op = get_op("Deconvolution")
    attrs = op.parse_attrs({"kernel": "(3, 3)", "num_filter": "6", "num_group": "2",
                            "stride": "(2, 2)", "target_shape": "(12, 11)"})
    assert attrs.no_bias is True
    inputs, (out,) = op.infer_shape(attrs, [(1, 4, 6, 6), None])
    assert inputs == [(1, 4, 6, 6), (4, 3, 3, 3)] and out == (1, 6, 12, 11)
    with_bias = op.parse_attrs({"kernel": "(2, 2)", "num_filter": "3", "no_bias": "False",
                                "stride": "(2, 2)"})
    inputs, (out,) = op.infer_shape(with_bias, [(2, 0, 3, 3), (5, 3, 2, 2), None])
    assert inputs == [(2, 5, 3, 3), (5, 3, 2, 2), (3,)] and out == (2, 3, 6, 6)
    data, weight, bias = _random(2, 5, 3, 3), _random(5, 3, 2, 2), _random(3)
    out_array = np.full((2, 3, 6, 6), np.nan, dtype=np.float32)
    (result,) = op.compute(np, with_bias, [data, weight, bias], out=out_array)
    assert result is out_array
    # Stride equal to the kernel: every output cell gets exactly one tap.
    expected = np.einsum("nchw,cfij->nfhiwj", data, weight).reshape(2, 3, 6, 6)
    np.testing.assert_allclose(out_array, expected + bias.reshape(1, 3, 1, 1), rtol=1e-5,
                               atol=1e-5)


def test_upsampling_nearest_concat_and_sum() -> None:
    first, second = _random(1, 2, 3, 4), _random(1, 3, 6, 8)
    concat = run_op("UpSampling", {"scale": "2", "sample_type": "nearest", "num_args": "2"},
                  [first, second])
    np.testing.assert_array_equal(concat[:, :2], first.repeat(2, axis=2).repeat(2, axis=3))
    np.testing.assert_array_equal(concat[:, 2:], second)
    other = _random(1, 2, 6, 8)
    total = run_op("UpSampling", {"scale": "2", "sample_type": "nearest", "num_args": "2",
                                "multi_input_mode": "sum"}, [first, other])
    np.testing.assert_allclose(total, first.repeat(2, axis=2).repeat(2, axis=3) + other)
    op = get_op("UpSampling")
    attrs = op.parse_attrs({"scale": "3", "sample_type": "nearest", "num_args": "1"})
    assert op.input_names(attrs) == ("arg0",)
    out = np.empty((2, 2, 6, 9), dtype=np.float32)
    (result,) = op.compute(np, attrs, [first.repeat(2, axis=0)[:, :, :2, :3]], out=out)
    assert result is out


def test_upsampling_bilinear_infers_weight() -> None:
    op = get_op("UpSampling")
    attrs = op.parse_attrs({"scale": "3", "sample_type": "bilinear", "num_args": "2",
                            "num_filter": "4"})
    assert op.input_names(attrs) == ("data", "weight")
    inputs, (out,) = op.infer_shape(attrs, [(2, 4, 5, 6), None])
    assert inputs == [(2, 4, 5, 6), (4, 1, 5, 5)] and out == (2, 4, 15, 18)
    data, weight = _random(2, 4, 5, 6), _random(4, 1, 5, 5)
    result = run_op("UpSampling", {"scale": "3", "sample_type": "bilinear", "num_args": "2",
                                 "num_filter": "4"}, [data, weight])
    deconv = run_op("Deconvolution", {"kernel": "(5, 5)", "stride": "(3, 3)", "pad": "(1, 1)",
                                    "num_filter": "4", "num_group": "4"}, [data, weight])
    np.testing.assert_allclose(result, deconv, rtol=1e-6)
