"""Slicing: ``slice``, ``slice_axis`` and ``slice_like``."""

from __future__ import annotations

from typing import Any

from engine.errors import ShapeError
from engine.ops.attrs import (
    optional,
    parse_int,
    parse_int_tuple,
    parse_optional_int_tuple,
)
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, Shape, emit, first_dtype, register
from engine.ops.shapes import Inferred, normalize_axis


def _slice_length(dim: int, index: slice) -> int:
    return len(range(*index.indices(dim)))


def slices(attrs: Attrs, ndim: int) -> tuple[slice, ...]:
    """The Python slices of ``begin``, ``end`` and ``step`` (also read by the assign ops)."""
    begin, end, step = attrs.begin, attrs.end, attrs.step
    if len(begin) != len(end) or (step and len(step) != len(begin)):
        raise ShapeError(f"slice begin {begin}, end {end} and step {step} differ in length")
    if len(begin) > ndim:
        raise ShapeError(f"slice of {len(begin)} axes on a {ndim}-D input")
    result = []
    for axis in range(len(begin)):
        stride = step[axis] if step and step[axis] is not None else 1
        if stride == 0:
            raise ShapeError("slice step must not be 0")
        result.append(slice(begin[axis], end[axis], stride))
    return tuple(result)


def slice_shape(attrs: Attrs, data: Shape) -> Shape:
    """The shape of the slice of ``data`` (unknown dimensions, 0, stay unknown)."""
    index = slices(attrs, len(data))
    return tuple((_slice_length(dim, index[axis]) if dim else 0) if axis < len(index) else dim
                 for axis, dim in enumerate(data))


def _slice_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return [None], [None]
    return [data], [slice_shape(attrs, data)]


register(OpDef(
    name="slice",
    aliases=("crop",),
    params=(
        Param("begin", parse_optional_int_tuple),
        Param("end", parse_optional_int_tuple),
        Param("step", parse_optional_int_tuple, ()),
    ),
    infer_shape=_slice_infer,
    kernel=lambda xp, attrs, data, out=None: emit(xp, data[slices(attrs, data.ndim)], out),
    writes_out=True,
    doc="Python-style slicing per axis; None takes the default end, step may be negative.",
))


def _axis_slice(attrs: Attrs, ndim: int) -> tuple[int, slice]:
    axis = normalize_axis(attrs.axis, ndim, "slice_axis axis")
    return axis, slice(attrs.begin, attrs.end)


def _slice_axis_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return [None], [None]
    axis, index = _axis_slice(attrs, len(data))
    out = list(data)
    out[axis] = _slice_length(data[axis], index) if data[axis] else 0
    return [data], [tuple(out)]


def _slice_axis_kernel(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
    axis, index = _axis_slice(attrs, data.ndim)
    return emit(xp, data[(slice(None),) * axis + (index,)], out)


register(OpDef(
    name="slice_axis",
    params=(
        Param("axis", parse_int),
        Param("begin", parse_int),
        Param("end", optional(parse_int)),
    ),
    infer_shape=_slice_axis_infer,
    kernel=_slice_axis_kernel,
    writes_out=True,
    doc="data[begin:end] along one axis (end None = to the end).",
))


def _like_axes(attrs: Attrs, data: Shape, like: Shape) -> list[int]:
    if attrs.axes:
        return [normalize_axis(axis, len(data), "slice_like axis") for axis in attrs.axes]
    if len(like) > len(data):
        raise ShapeError(f"slice_like: shape_like {like} has more axes than data {data}")
    return list(range(len(like)))


def _slice_like_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data, like = shapes
    if data is None or like is None:
        return [data, like], [None]
    out = list(data)
    for axis in _like_axes(attrs, data, like):
        if axis >= len(like):
            raise ShapeError(f"slice_like axis {axis} is out of range for shape_like {like}")
        if data[axis] and like[axis] and like[axis] > data[axis]:
            raise ShapeError(f"slice_like: shape_like {like} is larger than data {data}")
        out[axis] = like[axis]
    return [data, like], [tuple(out)]


def _slice_like_kernel(xp: Any, attrs: Attrs, data: Any, like: Any, out: Any = None) -> Any:
    index = [slice(None)] * data.ndim
    for axis in _like_axes(attrs, data.shape, like.shape):
        index[axis] = slice(0, like.shape[axis])
    return emit(xp, data[tuple(index)], out)


register(OpDef(
    name="slice_like",
    params=(Param("axes", parse_int_tuple, ()),),
    inputs=("data", "shape_like"),
    infer_shape=_slice_like_infer,
    infer_dtype=first_dtype,
    kernel=_slice_like_kernel,
    writes_out=True,
    doc="Slice data from 0 to shape_like's size on the given axes (all when empty).",
))
