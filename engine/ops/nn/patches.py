"""``im2col`` and ``col2im`` as operators: sliding-window patches to columns and back.

``im2col`` turns ``(N, C, *spatial)`` into ``(N, C * prod(kernel), L)`` (rows channel-major,
then kernel position; ``L`` output positions, row-major), the convolution's GEMM operand.
``col2im`` is its adjoint: it adds every column entry back onto the position it came from, so
overlapping windows sum, and the padding is cut away.
"""

from __future__ import annotations

import math
from typing import Any

from engine.errors import ShapeError
from engine.kernels.im2col import (
    conv_out_sizes,
    im2col,
    kernel_offsets,
    pad_spatial,
    spatial_param,
    window,
)
from engine.ops.attrs import parse_int_tuple
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred, merge

Ints = tuple[int, ...]


def _geometry(attrs: Attrs, op: str) -> tuple[Ints, Ints, Ints, Ints]:
    kernel = tuple(attrs.kernel)
    if not 1 <= len(kernel) <= 3 or min(kernel) < 1:
        raise ShapeError(f"{op}: kernel={kernel} must have 1, 2 or 3 positive sizes")
    ndim = len(kernel)
    stride = spatial_param(attrs.stride, ndim, 1, "stride", op)
    dilate = spatial_param(attrs.dilate, ndim, 1, "dilate", op)
    pad = spatial_param(attrs.pad, ndim, 0, "pad", op)
    if min(stride) < 1 or min(dilate) < 1 or min(pad) < 0:
        raise ShapeError(f"{op}: stride {stride} and dilate {dilate} must be positive and pad "
                         f"{pad} non-negative")
    return kernel, stride, dilate, pad


def _out_sizes(op: str, spatial: Ints, geometry: tuple[Ints, ...]) -> Ints:
    sizes = conv_out_sizes(spatial, *geometry)
    if any(size and out <= 0 for size, out in zip(spatial, sizes, strict=True)):
        raise ShapeError(f"{op}: spatial size {spatial} is smaller than the dilated kernel "
                         f"{geometry[0]} (dilate {geometry[2]}) with pad {geometry[3]}")
    return sizes


def _im2col_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    geometry = _geometry(attrs, "im2col")
    data = shapes[0]
    if data is None:
        return shapes, [None]
    if len(data) != len(geometry[0]) + 2:
        raise ShapeError(f"im2col: data {data} must be (N, C, *spatial) with one spatial axis "
                         f"per kernel size {geometry[0]}")
    sizes = _out_sizes("im2col", data[2:], geometry)
    return shapes, [(data[0], data[1] * math.prod(geometry[0]), math.prod(sizes))]


def _im2col(xp: Any, attrs: Attrs, data: Any) -> Any:
    kernel, stride, dilate, pad = _geometry(attrs, "im2col")
    sizes = _out_sizes("im2col", data.shape[2:], (kernel, stride, dilate, pad))
    padded = pad_spatial(xp, data, pad, pad)
    patches = im2col(xp, padded, kernel, stride, dilate, sizes)
    return patches.reshape(data.shape[0], data.shape[1] * math.prod(kernel), math.prod(sizes))


def _col2im_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    kernel, stride, dilate, pad = geometry = _geometry(attrs, "col2im")
    output_size = tuple(attrs.output_size)
    if len(output_size) != len(kernel) or min(output_size) < 1:
        raise ShapeError(f"col2im: output_size={output_size} needs one positive size per kernel "
                         f"axis {kernel}")
    taps = math.prod(kernel)
    positions = math.prod(_out_sizes("col2im", output_size, geometry))
    data = shapes[0]
    if data is not None and (len(data) != 3 or (data[1] and data[1] % taps)):
        raise ShapeError(f"col2im: data {data} must be (N, C * {taps}, {positions})")
    data = merge(data, (0, 0, positions), "col2im data (N, C * prod(kernel), positions)")
    out = None if not data[0] or not data[1] else (data[0], data[1] // taps, *output_size)
    return [data], [out]


def _col2im(xp: Any, attrs: Attrs, data: Any) -> Any:
    kernel, stride, dilate, pad = _geometry(attrs, "col2im")
    output_size = tuple(attrs.output_size)
    sizes = _out_sizes("col2im", output_size, (kernel, stride, dilate, pad))
    batch, rows, _ = data.shape
    channels = rows // math.prod(kernel)
    columns = data.reshape(batch, channels, math.prod(kernel), *sizes)
    padded_shape = tuple(size + 2 * p for size, p in zip(output_size, pad, strict=True))
    image = xp.zeros((batch, channels, *padded_shape), data.dtype)
    for tap, offset in enumerate(kernel_offsets(kernel, dilate)):
        window(image, offset, stride, sizes)[...] += columns[:, :, tap]
    inner = tuple(slice(p, p + size) for p, size in zip(pad, output_size, strict=True))
    return xp.ascontiguousarray(image[(slice(None), slice(None), *inner)])


_GEOMETRY_PARAMS = (Param("kernel", parse_int_tuple), Param("stride", parse_int_tuple, ()),
                    Param("dilate", parse_int_tuple, ()), Param("pad", parse_int_tuple, ()))

register(OpDef(
    name="im2col",
    params=_GEOMETRY_PARAMS,
    infer_shape=_im2col_infer,
    kernel=_im2col,
    doc="Sliding-window patches as columns: (N, C * prod(kernel), output positions).",
))
register(OpDef(
    name="col2im",
    params=(Param("output_size", parse_int_tuple), *_GEOMETRY_PARAMS),
    infer_shape=_col2im_infer,
    kernel=_col2im,
    doc="Columns summed back onto the image of output_size they were taken from (the adjoint "
        "of im2col).",
))
