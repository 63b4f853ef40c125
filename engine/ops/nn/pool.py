"""Pooling (max/avg/sum/lp, 1-3 spatial axes, any layout) and _contrib_BilinearResize2D.

Pooling reduces strided views of the padded input one spatial axis and one kernel offset at a
time (the reductions are separable); channels-last layouts are transposed views, never copies.
Bound into a plan, 2-D float32/64 max, avg and sum pooling runs `pool_kernel`'s compiled
kernels instead where numba is installed and they win (`pool_kernel.applies`; ResNet-18's first
pooling at batch 1: 0.56 → 0.15 ms); a float global average is bound as one matrix-vector
product (`_global_mean_call`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache, partial
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.kernels import banded_pool, pool_kernel
from engine.kernels.im2col import Ints, pad_spatial, spatial_param
from engine.kernels.workspace import aligned, uploaded
from engine.ops.attrs import (
    choice,
    optional,
    parse_bool,
    parse_float,
    parse_int,
    parse_int_tuple,
)
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register

ShapeResult = tuple[list[MaybeShape], list[MaybeShape]]

LAYOUTS = ("NCW", "NWC", "NCHW", "NHWC", "NCDHW", "NDHWC")
CHUNK_BYTES = 1 << 20  # a bound pooling pads and reduces about this much input at a time


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
        if not _mean_as_product(xp, source, target):
            xp.mean(source, axis=axes, keepdims=True, out=target)
    elif kind == "sum":
        xp.sum(source, axis=axes, keepdims=True, out=target)
    else:
        xp.sum(_lp_power(xp, source, attrs.p_value), axis=axes, keepdims=True, out=target)
        _lp_root(xp, target, attrs.p_value)


def _mean_as_product(xp: Any, source: Any, target: Any) -> bool:
    """A NumPy float global average as one matrix-vector product with a ``1/HW`` vector:
    ~8x faster than `np.mean`'s reduction at a CNN head (1280x7x7: 4.7 vs 37 us). False
    (nothing done) where the operands are not contiguous float32/float64 (float16 keeps
    `np.mean`, which sums in float32)."""
    if (xp is not np or source.dtype not in (np.float32, np.float64) or not source.size
            or not source.flags.c_contiguous or not target.flags.c_contiguous):
        return False
    rows = source.shape[0] * source.shape[1]
    np.dot(source.reshape(rows, -1), _averaging(source.size // max(rows, 1), source.dtype),
           target.reshape(rows))
    return True


@cache
def _averaging(count: int, dtype: np.dtype) -> np.ndarray:
    weights = np.full(count, 1.0 / count, dtype)
    weights.flags.writeable = False
    return weights


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
    kind = attrs.pool_type
    after = _pad_after(source.shape[2:], target.shape[2:], geometry)
    current = pad_spatial(xp, source, pad, after, _fill(kind, source.dtype))
    if kind == "lp":
        current = _lp_power(xp, current, attrs.p_value)
    for call in _reductions(xp, kind, current, kernel, stride, target,
                            lambda axis, shape: xp.empty(shape, dtype=current.dtype)):
        call()
    if kind == "lp":
        _lp_root(xp, target, attrs.p_value)
    elif kind == "avg":
        xp.divide(target, _avg_divisor(xp, attrs, source.shape[2:], geometry, target.shape[2:],
                                       target.dtype), out=target)


def _pad_after(spatial: Ints, size: Ints, geometry: tuple[Ints, Ints, Ints]) -> Ints:
    """Padding on the far side: 'full' windows may run past ``pad``, so extend it to cover them."""
    kernel, stride, pad = geometry
    return tuple(p + max(0, (n - 1) * s + k - (length + 2 * p))
                 for n, s, k, length, p in zip(size, stride, kernel, spatial, pad, strict=True))


def _fill(kind: str, dtype: Any) -> Any:
    """The padding value: one that never wins a max, or adds nothing to a sum."""
    return _lowest(dtype) if kind == "max" else 0


def _reductions(xp: Any, kind: str, current: Any, kernel: Ints, stride: Ints, target: Any,
                between: Callable[[int, Ints], Any]) -> list[Callable[[], Any]]:
    """Calls pooling the padded ``current`` into ``target``, one axis at a time; the result
    after ``axis`` (all but the last) goes to ``between(axis, shape)``."""
    combine = xp.maximum if kind == "max" else xp.add
    last = len(kernel) - 1
    calls: list[Callable[[], Any]] = []
    for axis, (k, s, n) in enumerate(zip(kernel, stride, target.shape[2:], strict=True)):
        shape = (*current.shape[:axis + 2], n, *current.shape[axis + 3:])
        reduced = target if axis == last else between(axis, shape)
        for offset in range(k):
            index = (slice(None),) * (axis + 2) + (slice(offset, offset + s * (n - 1) + 1, s),)
            if offset == 0:
                calls.append(partial(xp.copyto, reduced, current[index]))
            else:
                calls.append(partial(combine, reduced, current[index], out=reduced))
        current = reduced
    return calls


def _bound_shapes(attrs: Attrs, data_shape: Ints, itemsize: int
                  ) -> tuple[Ints, list[Ints]] | None:
    """For a pooling a plan can bind (windowed max/avg/sum, channels-first): the padded shape
    of one chunk of samples and the shapes between its axes; None for the others."""
    if (attrs.global_pool or attrs.pool_type == "lp" or attrs.pooling_convention == "same"
            or _channels_first(attrs.layout, len(data_shape)) is not None):
        return None
    geometry = _pool_geometry(attrs, len(data_shape))
    kernel, _, pad = geometry
    size = _pool_sizes(attrs, data_shape[2:], geometry)
    after = _pad_after(data_shape[2:], size, geometry)
    padded = (*data_shape[:2], *(n + b + a for n, b, a in zip(data_shape[2:], pad, after)))
    per_sample = math.prod(padded[1:]) * itemsize
    padded = (max(1, min(data_shape[0], CHUNK_BYTES // max(per_sample, 1))), *padded[1:])
    between = [(*padded[:2], *size[:axis + 1], *padded[axis + 3:])
               for axis in range(len(kernel) - 1)]
    return padded, between


def _pool_scratch(attrs: Attrs, shapes: list[Ints], dtype: Any) -> int:
    """Plan scratch bytes of a bound pooling: the results between its axes."""
    itemsize = np.dtype(dtype).itemsize
    bound = _bound_shapes(attrs, tuple(shapes[0]), itemsize)
    if bound is None:
        return 0
    return sum(aligned(math.prod(shape) * itemsize) for shape in bound[1])


def _pool_bind(xp: Any, attrs: Attrs, inputs: list[Any], out: Any,
               workspace: Any = None) -> list[Callable[[], Any]]:
    """Windowed pooling on the CPU over the plan's workspace, a chunk of samples at a time.

    The kernel pads the whole batch and reduces it pass by pass: at batch 8, ResNet's first
    pooling streams 26 MB through memory six times and takes twice as long per image as at
    batch 1. Here the padded chunk is kept (its border filled once), the results between axes
    are scratch, and each chunk stays in cache for all its passes.
    """
    data = inputs[0]
    mean = _global_mean_call(xp, attrs, data, out)
    if mean is not None:
        return [mean]
    bound = _bound_shapes(attrs, data.shape, data.itemsize)
    if workspace is None or bound is None:
        return [partial(_pooling, xp, attrs, data, out=out)]
    if xp is np and pool_kernel.applies(data, out, attrs.kernel):
        if attrs.pool_type == "max" and banded_pool.take(
                workspace, data, out, _window(attrs, data.ndim)):
            return [banded_pool.pooled_by_writer]  # the stem's step pools its bands
        return [_compiled_call(attrs, data, out)]
    padded_shape, between = bound
    kernel, stride, pad = _pool_geometry(attrs, data.ndim)
    kind = attrs.pool_type
    padded = None
    if padded_shape[2:] != data.shape[2:]:
        padded = workspace.filled(padded_shape, data.dtype, ("pool", pad, data.shape[2:]),
                                  _fill(kind, data.dtype))
    offsets = np.cumsum([0] + [aligned(math.prod(shape) * data.itemsize) for shape in between])
    interior = tuple(slice(p, p + n) for p, n in zip(pad, data.shape[2:]))
    calls: list[Callable[[], Any]] = []
    for start in range(0, data.shape[0], padded_shape[0]):
        samples = slice(start, min(start + padded_shape[0], data.shape[0]))
        current = data[samples]
        if padded is not None:
            count = samples.stop - start
            calls.append(partial(xp.copyto, padded[(slice(count), slice(None), *interior)],
                                 current))
            current = padded[:count]
        calls += _reductions(xp, kind, current, kernel, stride, out[samples], lambda axis, shape:
                             workspace.region(int(offsets[axis]), shape, data.dtype))
    if kind == "avg":
        divisor = _avg_divisor(xp, attrs, data.shape[2:], (kernel, stride, pad), out.shape[2:],
                               out.dtype)
        calls.append(partial(xp.divide, out, divisor, out=out))
    return calls


def _global_mean_call(xp: Any, attrs: Attrs, data: Any, out: Any) -> Callable[[], Any] | None:
    """A global average bound as `_mean_as_product`'s product itself, its operands viewed
    once: the interpreter's path re-derives layout and geometry on every call, and after a
    network's convolutions that Python runs cold (ResNet-18's head, 512 × 7², one thread, in
    order: 52 µs through `_pooling`, 16 bound so). None where `_mean_as_product` would not
    apply (and for channels-last layouts, which `_pooling` transposes)."""
    if (attrs.pool_type != "avg" or not attrs.global_pool or xp is not np
            or _channels_first(attrs.layout, data.ndim) is not None
            or data.dtype not in (np.float32, np.float64) or not data.size
            or not data.flags.c_contiguous or not out.flags.c_contiguous):
        return None
    rows = data.shape[0] * data.shape[1]
    return partial(np.dot, data.reshape(rows, -1), _averaging(data.size // rows, data.dtype),
                   out.reshape(rows))


def _window(attrs: Attrs, ndim: int) -> tuple[int, ...]:
    """The window as the compiled kernels take it: kernel, stride and padding, y then x."""
    kernel, stride, pad = _pool_geometry(attrs, ndim)
    return (*kernel, *stride, *pad)


def _compiled_call(attrs: Attrs, data: Any, out: Any) -> Callable[[], Any]:
    """The compiled kernel over the (N·C) planes, reading ``data`` itself: no padded copy.
    An average divides by the same per-window counts as the NumPy binding."""
    kernel, stride, pad = _pool_geometry(attrs, data.ndim)
    planes = data.reshape(-1, *data.shape[2:])
    results = out.reshape(-1, *out.shape[2:])
    window = _window(attrs, data.ndim)
    if attrs.pool_type == "max":
        return pool_kernel.MaxPoolCall(pool_kernel.max_pool, planes, results, *window)
    if attrs.pool_type == "avg":
        include = attrs.count_include_pad is None or attrs.count_include_pad
        divisor = _host_divisor(include, data.shape[2:], (kernel, stride, pad), out.shape[2:],
                                data.dtype)
    else:
        divisor = np.empty((0, 0), data.dtype)
    return partial(pool_kernel.sum_pool, planes, results, divisor, *window)


def _avg_divisor(xp: Any, attrs: Attrs, spatial: Ints, geometry: tuple[Ints, Ints, Ints],
                 size: Ints, dtype: Any) -> Any:
    """Per-window cell counts: inside the padded input, or the unpadded one without padding."""
    kernel, stride, pad = geometry
    include = attrs.count_include_pad is None or attrs.count_include_pad
    full = attrs.pooling_convention == "full"
    if include and not full:
        return math.prod(kernel)
    key = ("avg_divisor", include, tuple(spatial), tuple(geometry), tuple(size),
           np.dtype(dtype).str)
    return uploaded(xp, key, partial(_host_divisor, include, spatial, geometry, size, dtype))


def _host_divisor(include: bool, spatial: Ints, geometry: tuple[Ints, Ints, Ints], size: Ints,
                  dtype: Any) -> np.ndarray:
    kernel, stride, pad = geometry
    divisor = np.ones((), dtype=np.float64)
    for n, k, s, length, p in zip(size, kernel, stride, spatial, pad, strict=True):
        start = np.arange(n) * s
        low, high = (0, length + 2 * p) if include else (p, p + length)
        count = np.minimum(start + k, high) - np.maximum(start, low)
        divisor = divisor[..., None] * np.maximum(count, 1)
    return divisor.astype(dtype)


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
    bind=_pool_bind,
    scratch=_pool_scratch,
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
    key = ("bilinear", size, out_size, align_corners, np.dtype(dtype).str)
    return uploaded(xp, key, partial(_host_source_index, size, out_size, align_corners, dtype))


def _host_source_index(size: int, out_size: int, align_corners: bool,
                       dtype: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    return lower, upper, weight


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
