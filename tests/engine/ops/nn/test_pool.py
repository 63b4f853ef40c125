"""Pooling and _contrib_BilinearResize2D against naive per-window references."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from engine.errors import ShapeError
from engine.ops import get_op
from tests.engine.ops.helpers import run_op

RNG = np.random.default_rng(11)


def _random(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def naive_pool(data: np.ndarray, kind: str, kernel: tuple, stride: tuple, pad: tuple,
               full: bool = False, include_pad: bool = True, p: int = 2) -> np.ndarray:
    """Pooling by visiting every output cell and clipping its window by hand."""
    spatial = data.shape[2:]
    sizes = []
    for length, k, s, q in zip(spatial, kernel, stride, pad, strict=True):
        span = length + 2 * q - k
        sizes.append((math.ceil(span / s) if full else span // s) + 1)
    out = np.zeros((*data.shape[:2], *sizes))
    for cell in itertools.product(*(range(n) for n in sizes)):
        starts = [o * s - q for o, s, q in zip(cell, stride, pad, strict=True)]
        inside = tuple(slice(max(a, 0), min(a + k, length))
                       for a, k, length in zip(starts, kernel, spatial, strict=True))
        values = data[(slice(None), slice(None), *inside)].reshape(*data.shape[:2], -1)
        if kind == "max":
            result = values.max(axis=2)
        elif kind == "sum":
            result = values.sum(axis=2)
        elif kind == "lp":
            result = (np.abs(values) ** p).sum(axis=2) ** (1 / p)
        else:
            if include_pad:
                count = math.prod(min(a + k, length + q) - max(a, -q)
                                  for a, k, length, q in zip(starts, kernel, spatial, pad,
                                                             strict=True))
            else:
                count = values.shape[2]
            result = values.sum(axis=2) / count
        out[(slice(None), slice(None), *cell)] = result
    return out


POOL_CASES = [
    # (shape, kind, kernel, stride, pad, full, include_pad)
    ((2, 3, 9, 8), "max", (3, 3), (2, 2), (1, 1), False, True),
    ((1, 2, 8, 8), "max", (3, 3), (2, 2), (0, 0), True, True),
    ((1, 2, 7, 7), "max", (2, 2), (2, 2), (0, 0), True, True),
    ((1, 2, 7, 6), "avg", (3, 2), (1, 2), (1, 0), False, True),
    ((1, 2, 7, 6), "avg", (3, 3), (2, 2), (1, 1), False, False),
    ((1, 2, 8, 8), "avg", (3, 3), (2, 2), (1, 1), True, True),
    ((1, 2, 8, 8), "avg", (3, 3), (2, 2), (1, 1), True, False),
    ((1, 2, 6, 7), "sum", (2, 3), (2, 1), (0, 1), False, True),
    ((1, 2, 6, 6), "lp", (2, 2), (2, 2), (0, 0), False, True),
    ((2, 3, 11), "max", (3,), (2,), (1,), False, True),
    ((2, 3, 10), "avg", (4,), (3,), (1,), True, False),
    ((1, 2, 4, 5, 6), "max", (2, 2, 3), (2, 1, 2), (0, 1, 1), False, True),
    ((1, 2, 4, 5, 5), "avg", (3, 3, 3), (1, 2, 2), (1, 1, 1), True, True),
]


@pytest.mark.parametrize("case", POOL_CASES, ids=[str(i) for i in range(len(POOL_CASES))])
def test_pooling_matches_naive_reference(case: tuple) -> None:
    shape, kind, kernel, stride, pad, full, include_pad = case
    data = _random(*shape)
    attrs = {"kernel": str(kernel), "stride": str(stride), "pad": str(pad), "pool_type": kind,
             "pooling_convention": "full" if full else "valid",
             "count_include_pad": str(include_pad), "p_value": "2"}
    result = run_op("Pooling", attrs, [data])
    expected = naive_pool(data, kind, kernel, stride, pad, full, include_pad)
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)


def test_pooling_stride_defaults_to_one() -> None:
    op = get_op("Pooling")
    attrs = op.parse_attrs({"kernel": "(3, 3)"})
    assert op.infer_shape(attrs, [(1, 2, 6, 6)])[1] == [(1, 2, 4, 4)]
    assert op.infer_shape(attrs, [(0, 2, 6, 0)])[1] == [(0, 2, 4, 0)]
    assert op.infer_shape(attrs, [None])[1] == [None]


@pytest.mark.parametrize("kind", ["max", "avg", "sum", "lp"])
def test_global_pooling_ignores_kernel_stride_pad(kind: str) -> None:
    data = _random(2, 3, 5, 6)
    result = run_op("_npx_pooling", {"global_pool": "True", "kernel": "(3, 3)", "pad": "(1, 1)",
                                   "stride": "(2, 2)", "pool_type": kind, "p_value": "3"},
                  [data])
    reduce = {"max": np.max, "avg": np.mean, "sum": np.sum,
              "lp": lambda x, **kw: np.sum(np.abs(x) ** 3, **kw) ** (1 / 3)}[kind]
    np.testing.assert_allclose(result, reduce(data, axis=(2, 3), keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_global_average_into_contiguous_and_strided_outputs(dtype: type) -> None:
    # Contiguous float32/float64 run as a matrix-vector product, the rest through np.mean.
    data = _random(2, 5, 7, 7).astype(dtype)
    expected = data.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    attrs = {"global_pool": "True", "kernel": "(1, 1)", "pool_type": "avg"}
    tolerance = 1e-2 if dtype == np.float16 else 1e-6
    result = run_op("Pooling", attrs, [data])
    assert result.dtype == dtype
    np.testing.assert_allclose(result, expected, rtol=tolerance, atol=tolerance)
    backing = np.full((2, 1, 1, 5), np.nan, dtype=dtype)
    run_op("Pooling", attrs, [data], out=backing.transpose(0, 3, 1, 2))
    np.testing.assert_allclose(backing.transpose(0, 3, 1, 2), expected, rtol=tolerance,
                               atol=tolerance)
    assert run_op("Pooling", attrs, [data[:0]]).shape == (0, 5, 1, 1)


@pytest.mark.parametrize("layout", ["NHWC", "NWC", "NDHWC"])
def test_channels_last_pooling_matches_channels_first(layout: str) -> None:
    spatial = len(layout) - 2
    data = _random(2, 3, *(7,) * spatial)
    attrs = {"kernel": str((3,) * spatial), "stride": str((2,) * spatial),
             "pad": str((1,) * spatial), "pool_type": "avg"}
    expected = run_op("Pooling", attrs, [data])
    order = (0, *range(2, spatial + 2), 1)
    last = run_op("Pooling", {**attrs, "layout": layout}, [np.ascontiguousarray(
        data.transpose(order))])
    np.testing.assert_allclose(last, expected.transpose(order), rtol=1e-6)


def test_pooling_writes_into_out() -> None:
    data = _random(1, 3, 8, 8)
    attrs = {"kernel": "(2, 2)", "stride": "(2, 2)", "pool_type": "max"}
    expected = naive_pool(data, "max", (2, 2), (2, 2), (0, 0))
    out = np.full((1, 3, 4, 4), np.nan, dtype=np.float32)
    assert run_op("Pooling", attrs, [data], out=out) is out
    np.testing.assert_array_equal(out, expected)
    backing = np.full((1, 4, 4, 3), np.nan, dtype=np.float32)
    view = backing.transpose(0, 3, 1, 2)
    run_op("Pooling", attrs, [data], out=view)
    np.testing.assert_array_equal(view, expected)


def test_pooling_errors_are_clear() -> None:
    op = get_op("Pooling")
    with pytest.raises(ShapeError, match="'same' is not supported"):
        op.infer_shape(op.parse_attrs({"kernel": "(2, 2)", "pooling_convention": "same"}),
                       [(1, 1, 4, 4)])
    with pytest.raises(ShapeError, match="kernel"):
        op.infer_shape(op.parse_attrs({"kernel": "(2,)"}), [(1, 1, 4, 4)])
    with pytest.raises(ShapeError, match="p_value"):
        op.infer_shape(op.parse_attrs({"kernel": "(2, 2)", "pool_type": "lp"}), [(1, 1, 4, 4)])
    with pytest.raises(ShapeError, match="larger than the padded input"):
        op.infer_shape(op.parse_attrs({"kernel": "(5, 5)"}), [(1, 1, 4, 4)])


def naive_resize(data: np.ndarray, height: int, width: int, align: bool) -> np.ndarray:
    """Bilinear resize by visiting every output pixel."""
    in_h, in_w = data.shape[2:]
    out = np.zeros((*data.shape[:2], height, width))

    def source(position: int, size: int, out_size: int) -> tuple[int, int, float]:
        if align:
            real = position * (size - 1) / (out_size - 1) if out_size > 1 else 0.0
        else:
            real = max((position + 0.5) * size / out_size - 0.5, 0.0)
        low = min(int(real), size - 1)
        return low, min(low + 1, size - 1), real - low

    for y in range(height):
        top, bottom, dy = source(y, in_h, height)
        for x in range(width):
            left, right, dx = source(x, in_w, width)
            out[:, :, y, x] = ((1 - dy) * ((1 - dx) * data[:, :, top, left]
                                           + dx * data[:, :, top, right])
                               + dy * ((1 - dx) * data[:, :, bottom, left]
                                       + dx * data[:, :, bottom, right]))
    return out


@pytest.mark.parametrize("align", [True, False])
@pytest.mark.parametrize("size", [(7, 5), (2, 3), (1, 1), (9, 12)])
def test_bilinear_resize_matches_naive_reference(align: bool, size: tuple[int, int]) -> None:
    data = _random(2, 3, 4, 6)
    result = run_op("_contrib_BilinearResize2D", {"height": str(size[0]), "width": str(size[1]),
                                                "align_corners": str(align)}, [data])
    np.testing.assert_allclose(result, naive_resize(data, *size, align), rtol=1e-5, atol=1e-5)


def test_bilinear_resize_modes_and_out() -> None:
    op = get_op("_contrib_BilinearResize2D")

    def shape_for(attrs: dict[str, str], *shapes: tuple[int, ...]) -> tuple[int, ...]:
        return op.infer_shape(op.parse_attrs(attrs), list(shapes))[1][0]

    assert shape_for({"scale_height": "2", "scale_width": "1.5"}, (1, 2, 5, 4)) == (1, 2, 10, 6)
    assert shape_for({"mode": "odd_scale", "scale_height": "2", "scale_width": "2"},
                     (1, 2, 5, 4)) == (1, 2, 9, 8)
    assert shape_for({"mode": "to_even_up"}, (1, 2, 5, 4)) == (1, 2, 6, 4)
    assert shape_for({"mode": "to_odd_down"}, (1, 2, 5, 4)) == (1, 2, 5, 3)
    assert shape_for({"mode": "like"}, (1, 2, 5, 4), (3, 7, 8, 9)) == (1, 2, 8, 9)
    like = op.parse_attrs({"mode": "like"})
    assert op.input_names(like) == ("data", "like")
    data = _random(1, 2, 3, 3)
    out = np.empty((1, 2, 5, 4), dtype=np.float32)
    (result,) = op.compute(np, like, [data, np.zeros((1, 1, 5, 4), np.float32)], out=out)
    assert result is out
    np.testing.assert_allclose(out, naive_resize(data, 5, 4, True), rtol=1e-5, atol=1e-5)
