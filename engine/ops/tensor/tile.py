"""Tiling, repeating, broadcasting, padding and reversing."""

from __future__ import annotations

import math
from typing import Any

from engine.errors import ShapeError
from engine.ops.attrs import (
    choice,
    optional,
    parse_float,
    parse_int,
    parse_int_tuple,
)
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, Shape, emit, first_dtype, register
from engine.ops.shapes import Inferred, normalize_axis


def _tile_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return [None], [None]
    length = max(len(data), len(attrs.reps))
    dims = (1,) * (length - len(data)) + tuple(data)
    reps = (1,) * (length - len(attrs.reps)) + tuple(attrs.reps)
    return [data], [tuple(dim * rep for dim, rep in zip(dims, reps, strict=True))]


register(OpDef(
    name="tile",
    params=(Param("reps", parse_int_tuple),),
    infer_shape=_tile_infer,
    kernel=lambda xp, attrs, data: xp.tile(data, attrs.reps),
    doc="Repeat the whole array reps times per axis (NumPy tile).",
))


def _repeat_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return [None], [None]
    if attrs.axis is None:
        return [data], [(math.prod(data) * attrs.repeats,)]
    axis = normalize_axis(attrs.axis, len(data), "repeat axis")
    return [data], [(*data[:axis], data[axis] * attrs.repeats, *data[axis + 1:])]


register(OpDef(
    name="repeat",
    params=(Param("repeats", parse_int), Param("axis", optional(parse_int), None)),
    infer_shape=_repeat_infer,
    kernel=lambda xp, attrs, data: xp.repeat(data, attrs.repeats, axis=attrs.axis),
    doc="Repeat each element repeats times along axis (flattened when axis is None).",
))


def _broadcast_dims(data: Shape, target: Shape) -> Shape:
    if len(data) != len(target):
        raise ShapeError(f"cannot broadcast {data} to {target}: ranks differ")
    out = []
    for have, want in zip(data, target, strict=True):
        if not want:
            out.append(have)
        elif have not in (0, 1, want):
            raise ShapeError(f"cannot broadcast {data} to {target}")
        else:
            out.append(want)
    return tuple(out)


def _broadcast_to_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return [None], [None]
    return [data], [_broadcast_dims(data, attrs.shape)]


def _broadcast_kernel(shape_of: Any) -> Any:
    def kernel(xp: Any, attrs: Attrs, data: Any, *rest: Any, out: Any = None) -> Any:
        shape = shape_of(attrs, data.shape, *(array.shape for array in rest))
        if out is None:
            return xp.broadcast_to(data, shape).copy()
        xp.copyto(out, data, casting="unsafe")
        return out

    return kernel


register(OpDef(
    name="broadcast_to",
    params=(Param("shape", parse_int_tuple),),
    infer_shape=_broadcast_to_infer,
    kernel=_broadcast_kernel(lambda attrs, data: _broadcast_dims(data, attrs.shape)),
    writes_out=True,
    doc="Broadcast to shape; a 0 in shape keeps the input's dimension.",
))


def _like_shape(attrs: Attrs, lhs: Shape, rhs: Shape) -> Shape:
    if attrs.lhs_axes is None and attrs.rhs_axes is None:
        return _broadcast_dims(lhs, rhs)
    lhs_axes, rhs_axes = attrs.lhs_axes or (), attrs.rhs_axes or ()
    if len(lhs_axes) != len(rhs_axes):
        raise ShapeError(f"broadcast_like lhs_axes {lhs_axes} and rhs_axes {rhs_axes} differ "
                         "in length")
    target = [0] * len(lhs)
    for left, right in zip(lhs_axes, rhs_axes, strict=True):
        target[normalize_axis(left, len(lhs), "lhs_axes")] = rhs[
            normalize_axis(right, len(rhs), "rhs_axes")]
    return _broadcast_dims(lhs, tuple(target))


def _broadcast_like_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    lhs, rhs = shapes
    if lhs is None or rhs is None:
        return [lhs, rhs], [None]
    return [lhs, rhs], [_like_shape(attrs, lhs, rhs)]


register(OpDef(
    name="broadcast_like",
    params=(
        Param("lhs_axes", optional(parse_int_tuple), None),
        Param("rhs_axes", optional(parse_int_tuple), None),
    ),
    inputs=("lhs", "rhs"),
    infer_shape=_broadcast_like_infer,
    infer_dtype=first_dtype,
    kernel=_broadcast_kernel(_like_shape),
    writes_out=True,
    doc="Broadcast lhs to rhs's shape (or only on lhs_axes, sized from rhs_axes).",
))


def _axis_shape(attrs: Attrs, data: Shape) -> Shape:
    if len(attrs.axis) != len(attrs.size):
        raise ShapeError(f"broadcast_axis axis {attrs.axis} and size {attrs.size} differ in "
                         "length")
    target = [0] * len(data)
    for axis, size in zip(attrs.axis, attrs.size, strict=True):
        target[normalize_axis(axis, len(data), "broadcast_axis axis")] = size
    return _broadcast_dims(data, tuple(target))


def _broadcast_axis_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    return [data], [None if data is None else _axis_shape(attrs, data)]


register(OpDef(
    name="broadcast_axis",
    aliases=("broadcast_axes",),
    params=(Param("axis", parse_int_tuple, ()), Param("size", parse_int_tuple, ())),
    infer_shape=_broadcast_axis_infer,
    kernel=_broadcast_kernel(_axis_shape),
    writes_out=True,
    doc="Broadcast the size-1 axes in axis to the matching size.",
))


# --- Padding and reversing --------------------------------------------------------------------

def _pad_pairs(attrs: Attrs, ndim: int) -> tuple[tuple[int, int], ...]:
    width = attrs.pad_width
    if len(width) != 2 * ndim:
        raise ShapeError(f"Pad pad_width {width} needs 2 x {ndim} = {2 * ndim} values for a "
                         f"{ndim}-D input")
    return tuple((width[2 * axis], width[2 * axis + 1]) for axis in range(ndim))


def _pad_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return [None], [None]
    pairs = _pad_pairs(attrs, len(data))
    return [data], [tuple(dim + before + after if dim else 0
                          for dim, (before, after) in zip(data, pairs, strict=True))]


def _pad_kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    pairs = _pad_pairs(attrs, data.ndim)
    if attrs.mode == "constant":
        return xp.pad(data, pairs, mode="constant", constant_values=attrs.constant_value)
    return xp.pad(data, pairs, mode=attrs.mode)


register(OpDef(
    name="Pad",
    aliases=("pad",),
    params=(
        Param("mode", choice("constant", "edge", "reflect"), "constant"),
        Param("pad_width", parse_int_tuple),
        Param("constant_value", parse_float, 0.0),
    ),
    infer_shape=_pad_infer,
    kernel=_pad_kernel,
    doc="Pad each axis by (before, after) pairs from pad_width: constant, edge or reflect.",
))


def _reverse_kernel(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
    axes = tuple(normalize_axis(axis, data.ndim, "reverse axis") for axis in attrs.axis)
    return emit(xp, xp.flip(data, axis=axes), out)


register(OpDef(
    name="reverse",
    aliases=("flip",),
    params=(Param("axis", parse_int_tuple),),
    infer_shape=lambda attrs, shapes: (shapes, [shapes[0]]),
    kernel=_reverse_kernel,
    writes_out=True,
    doc="Reverse the order of elements along the given axes.",
))
