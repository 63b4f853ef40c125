"""Pooling (max/avg/sum/lp, 1-3 spatial axes, any layout) and _contrib_BilinearResize2D.

Pooling reduces strided views of the padded input one spatial axis and one kernel offset at a
time (the reductions are separable); channels-last layouts are transposed views, never copies.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import (
    choice,
    optional,
    parse_bool,
    parse_float,
    parse_int,
    parse_int_tuple,
)
from engine.ops.im2col import Ints, pad_spatial, spatial_param
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register

ShapeResult = tuple[list[MaybeShape], list[MaybeShape]]

LAYOUTS = ("NCW", "NWC", "NCHW", "NHWC", "NCDHW", "NDHWC")


def _channels_first(layout: str | None, ndim: int) -> tuple[int, ...] | None:
    """The axis order that views data in ``layout`` as (N, C, *spatial); None if it already is."""
    if layout is None or layout[1] == "C":
        if layout is not None and len(layout) != ndim:
            raise ShapeError(f"Pooling: layout {layout!r} does not fit {ndim}-D data")
        return None
    if len(layout) != ndim:
        raise ShapeError(f"Pooling: layout {layout!r} does not fit {ndim}-D data")
    return (0, ndim - 1, *range(1, ndim - 1))


def _permute(shape: tuple[int, ...], order: tuple[int, ...] | None) -> tuple[int, ...]:
    return shape if order is None else tuple(shape[axis] for axis in order)


def _unpermute(shape: tuple[int, ...], order: tuple[int, ...] | None) -> tuple[int, ...]:
    if order is None:
        return shape
    result = [0] * len(shape)
    for position, axis in enumerate(order):
        result[axis] = shape[position]
    return tuple(result)


def _pool_geometry(attrs: Attrs, ndim: int) -> tuple[Ints, Ints, Ints]:
    """(kernel, stride, pad) for a non-global pooling over ``ndim - 2`` spatial axes."""
    spatial = ndim - 2
    if not 1 <= spatial <= 3:
        raise ShapeError(f"Pooling: data has {ndim} dimensions; expected 3, 4 or 5 "
                         f"(N, C and 1-3 spatial axes)")
    if attrs.pooling_convention == "same":
        raise ShapeError("Pooling: pooling_convention='same' is not supported (MXNet 1.9.1 "
                         "cannot run it either); use 'valid' or 'full' with explicit pad")
    if attrs.pool_type == "lp" and attrs.p_value is None:
        raise ShapeError("Pooling: pool_type='lp' needs p_value (for example p_value=2)")
    if attrs.global_pool:
        return (), (), ()
    kernel = attrs.kernel
    if len(kernel) != spatial or min(kernel) < 1:
        raise ShapeError(f"Pooling: kernel={kernel} must have {spatial} positive sizes for "
                         f"{ndim}-D data (or set global_pool=True)")
    stride = spatial_param(attrs.stride, spatial, 1, "stride", "Pooling")
    pad = spatial_param(attrs.pad, spatial, 0, "pad", "Pooling")
    if min(stride) < 1 or min(pad) < 0:
        raise ShapeError(f"Pooling: stride {stride} must be positive and pad {pad} non-negative")
    return kernel, stride, pad


def _pool_out_size(size: int, kernel: int, stride: int, pad: int, full: bool) -> int:
    if not size:
        return 0
    span = size + 2 * pad - kernel
    if span < 0:
        raise ShapeError(f"Pooling: kernel {kernel} is larger than the padded input "
                         f"({size} + 2 * {pad})")
    return (-(-span // stride) if full else span // stride) + 1


def _pool_sizes(attrs: Attrs, spatial: Ints, geometry: tuple[Ints, Ints, Ints]) -> Ints:
    if attrs.global_pool:
        return (1,) * len(spatial)
    full = attrs.pooling_convention == "full"
    return tuple(_pool_out_size(size, k, s, p, full)
                 for size, k, s, p in zip(spatial, *geometry, strict=True))


def _pool_infer_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    data = shapes[0]
    if data is None:
        return [None], [None]
    order = _channels_first(attrs.layout, len(data))
    geometry = _pool_geometry(attrs, len(data))
    first = _permute(tuple(data), order)
    out = (*first[:2], *_pool_sizes(attrs, first[2:], geometry))
    return [data], [_unpermute(out, order)]


def _lowest(dtype: Any) -> Any:
    dtype = np.dtype(dtype)
    return -np.inf if dtype.kind in "fc" else np.iinfo(dtype).min


def _pooling(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
    order = _channels_first(attrs.layout, data.ndim)
    geometry = _pool_geometry(attrs, data.ndim)
    source = data if order is None else data.transpose(order)
    size = _pool_sizes(attrs, source.shape[2:], geometry)
    if out is None:
        out = xp.empty(_unpermute((*source.shape[:2], *size), order), dtype=data.dtype)
    target = out if order is None else out.transpose(order)
    if attrs.global_pool:
        _global_pool(xp, attrs, source, target)
    else:
        _window_pool(xp, attrs, source, geometry, target)
    return out


def _global_pool(xp: Any, attrs: Attrs, source: Any, target: Any) -> None:
    axes = tuple(range(2, source.ndim))
    kind = attrs.pool_type
    if kind == "max":
        xp.max(source, axis=axes, keepdims=True, out=target)
    elif kind == "avg":
        xp.mean(source, axis=axes, keepdims=True, out=target)
    elif kind == "sum":
        xp.sum(source, axis=axes, keepdims=True, out=target)
    else:
        xp.sum(_lp_power(xp, source, attrs.p_value), axis=axes, keepdims=True, out=target)
        _lp_root(xp, target, attrs.p_value)


def _lp_power(xp: Any, values: Any, p: int, out: Any = None) -> Any:
    """``|values| ** p`` (into ``out`` when given)."""
    result = xp.abs(values, out=out)
    if p == 2:
        xp.multiply(result, result, out=result)
    elif p != 1:
        xp.power(result, p, out=result)
    return result


def _lp_root(xp: Any, target: Any, p: int) -> None:
    if p == 2:
        xp.sqrt(target, out=target)
    elif p != 1:
        xp.power(target, 1.0 / p, out=target)


def _window_pool(xp: Any, attrs: Attrs, source: Any, geometry: tuple[Ints, Ints, Ints],
                 target: Any) -> None:
    """Windowed pooling, one spatial axis at a time (max, sum and Lp sums are separable)."""
    kernel, stride, pad = geometry
    size = target.shape[2:]
    spatial = source.shape[2:]
    # 'full' windows may run past the padding; extend the far side so every view is in bounds.
    extra = tuple(max(0, (n - 1) * s + k - (length + 2 * p))
                  for n, s, k, length, p in zip(size, stride, kernel, spatial, pad, strict=True))
    after = tuple(p + e for p, e in zip(pad, extra, strict=True))
    kind = attrs.pool_type
    current = pad_spatial(xp, source, pad, after, _lowest(source.dtype) if kind == "max" else 0)
    if kind == "lp":
        current = _lp_power(xp, current, attrs.p_value)
    combine = xp.maximum if kind == "max" else xp.add
    last = len(kernel) - 1
    for axis, (k, s, n) in enumerate(zip(kernel, stride, size, strict=True)):
        shape = (*current.shape[:axis + 2], n, *current.shape[axis + 3:])
        reduced = target if axis == last else xp.empty(shape, dtype=current.dtype)
        for offset in range(k):
            index = (slice(None),) * (axis + 2) + (slice(offset, offset + s * (n - 1) + 1, s),)
            if offset == 0:
                xp.copyto(reduced, current[index])
            else:
                combine(reduced, current[index], out=reduced)
        current = reduced
    if kind == "lp":
        _lp_root(xp, target, attrs.p_value)
    elif kind == "avg":
        xp.divide(target, _avg_divisor(xp, attrs, spatial, geometry, size, target.dtype),
                  out=target)


def _avg_divisor(xp: Any, attrs: Attrs, spatial: Ints, geometry: tuple[Ints, Ints, Ints],
                 size: Ints, dtype: Any) -> Any:
    """Per-window cell counts: inside the padded input, or the unpadded one without padding."""
    kernel, stride, pad = geometry
    include = attrs.count_include_pad is None or attrs.count_include_pad
    full = attrs.pooling_convention == "full"
    if include and not full:
        return math.prod(kernel)
    divisor = np.ones((), dtype=np.float64)
    for n, k, s, length, p in zip(size, kernel, stride, spatial, pad, strict=True):
        start = np.arange(n) * s
        low, high = (0, length + 2 * p) if include else (p, p + length)
        count = np.minimum(start + k, high) - np.maximum(start, low)
        divisor = divisor[..., None] * np.maximum(count, 1)
    return xp.asarray(divisor.astype(dtype))


def _pool_hidden_outputs(attrs: Attrs) -> int:
    # MXNet 1.9.1's oneDNN build gives channel-first max pooling a workspace output, which
    # node_row_ptr counts (checked against every Pooling case in the conformance fixtures).
    channels_first = attrs.layout in (None, "NCW", "NCHW", "NCDHW")
    return int(attrs.pool_type == "max" and len(attrs.kernel) in (1, 2, 3) and channels_first)


POOLING = register(OpDef(
    name="Pooling",
    aliases=("_npx_pooling",),
    params=(
        Param("kernel", parse_int_tuple, ()),
        Param("pool_type", choice("max", "avg", "sum", "lp"), "max"),
        Param("global_pool", parse_bool, False),
        Param("cudnn_off", parse_bool, False),
        Param("pooling_convention", choice("valid", "full", "same"), "valid"),
        Param("stride", parse_int_tuple, ()),
        Param("pad", parse_int_tuple, ()),
        Param("p_value", optional(parse_int), None),
        Param("count_include_pad", optional(parse_bool), None),
        Param("layout", optional(choice(*LAYOUTS)), None),
    ),
    infer_shape=_pool_infer_shape,
    hidden_outputs=_pool_hidden_outputs,
    kernel=_pooling,
    writes_out=True,
    doc="Max/avg/sum/Lp pooling over 1-3 spatial axes; stride defaults to 1, not to the kernel.",
))


# -- _contrib_BilinearResize2D -------------------------------------------------------------------

RESIZE_MODES = ("size", "odd_scale", "like", "to_even_down", "to_even_up", "to_odd_down",
                "to_odd_up")


def _resize_inputs(attrs: Attrs) -> tuple[str, ...]:
    return ("data", "like") if attrs.mode == "like" else ("data",)


def _scaled(size: int, scale: float) -> int:
    # MXNet multiplies in single precision and truncates.
    return int(np.float32(scale) * np.float32(size))


def _resize_axis(attrs: Attrs, size: int, fixed: int, scale: float | None, like: int) -> int:
    """The output length of one axis (0 when it depends on an unknown size)."""
    mode = attrs.mode
    if mode == "like":
        return like
    if mode == "size":
        return fixed if scale is None else (_scaled(size, scale) if size else 0)
    if not size:
        return 0
    if mode == "odd_scale":
        if scale is None:
            raise ShapeError("_contrib_BilinearResize2D: mode='odd_scale' needs scale_height "
                             "and scale_width")
        return _scaled(size, scale) if size % 2 == 0 else _scaled(size - 1, scale) + 1
    want_even = mode.startswith("to_even")
    if (size % 2 == 0) == want_even:
        return size
    return size + 1 if mode.endswith("_up") else size - 1


def _resize_infer_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    for name, shape in zip(_resize_inputs(attrs), shapes, strict=True):
        if shape is not None and len(shape) != 4:
            raise ShapeError(f"_contrib_BilinearResize2D: input {name!r} has shape "
                             f"{tuple(shape)}; expected 4 dimensions (N, C, H, W)")
    data = shapes[0]
    like = shapes[1] if attrs.mode == "like" else None
    if data is None or (attrs.mode == "like" and like is None):
        return shapes, [None]
    height = _resize_axis(attrs, data[2], attrs.height, attrs.scale_height,
                          like[2] if like else 0)
    width = _resize_axis(attrs, data[3], attrs.width, attrs.scale_width, like[3] if like else 0)
    return shapes, [(data[0], data[1], height, width)]


def _source_index(xp: Any, size: int, out_size: int, align_corners: bool,
                  dtype: Any) -> tuple[Any, Any, Any]:
    """(lower index, upper index, weight of upper) for each output position along one axis."""
    position = np.arange(out_size, dtype=np.float32)
    if align_corners:
        scale = np.float32((size - 1) / (out_size - 1)) if out_size > 1 else np.float32(0)
        source = scale * position
    else:
        scale = np.float32(size / out_size)
        source = np.maximum(scale * (position + np.float32(0.5)) - np.float32(0.5), 0)
    lower = np.minimum(source.astype(np.int64), size - 1)
    upper = np.where(lower < size - 1, lower + 1, lower)
    weight = (source - lower).astype(dtype)
    return xp.asarray(lower), xp.asarray(upper), xp.asarray(weight)


def _bilinear_resize(xp: Any, attrs: Attrs, data: Any, like: Any = None, out: Any = None) -> Any:
    shapes = [tuple(data.shape)] + ([tuple(like.shape)] if like is not None else [])
    _, (shape,) = _resize_infer_shape(attrs, shapes)
    if min(shape) < 1:
        raise ShapeError(f"_contrib_BilinearResize2D: output shape {shape} is empty")
    if out is None:
        out = xp.empty(shape, dtype=data.dtype)
    top, bottom, down = _source_index(xp, data.shape[2], shape[2], attrs.align_corners,
                                      data.dtype)
    left, right, across = _source_index(xp, data.shape[3], shape[3], attrs.align_corners,
                                        data.dtype)
    down = down[:, None]
    rows = data[:, :, top] * (1 - down) + data[:, :, bottom] * down
    xp.multiply(rows[..., left], 1 - across, out=out)
    out += rows[..., right] * across
    return out


BILINEAR_RESIZE_2D = register(OpDef(
    name="_contrib_BilinearResize2D",
    params=(
        Param("height", parse_int, 1),
        Param("width", parse_int, 1),
        Param("scale_height", optional(parse_float), None),
        Param("scale_width", optional(parse_float), None),
        Param("mode", choice(*RESIZE_MODES), "size"),
        Param("align_corners", parse_bool, True),
    ),
    inputs=_resize_inputs,
    infer_shape=_resize_infer_shape,
    kernel=_bilinear_resize,
    writes_out=True,
    doc="Bilinear resize of NCHW data to a size, a scale or another input's size.",
))
