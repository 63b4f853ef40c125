"""Small operators along axes: ``cumsum``, ``diag`` (and NumPy-mode ``diagonal``), ``moments``
and ``argmax_channel``."""

from __future__ import annotations

import math
from typing import Any

from engine.errors import ShapeError
from engine.ops.attrs import (
    optional,
    parse_bool,
    parse_dtype,
    parse_int,
    parse_int_tuple,
)
from engine.ops.dtypes import FLOAT32
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred, normalize_axis

# --- cumsum -----------------------------------------------------------------------------------

def _cumsum_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None or attrs.axis is not None:
        return shapes, [data]
    return shapes, [(math.prod(data),)]


def _cumsum_kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    dtype = data.dtype if attrs.dtype is None else attrs.dtype
    if attrs.axis is None:
        return xp.cumsum(data.reshape(-1), dtype=dtype)
    return xp.cumsum(data, axis=normalize_axis(attrs.axis, data.ndim, "cumsum axis"),
                     dtype=dtype)


register(OpDef(
    name="_np_cumsum",
    params=(Param("axis", optional(parse_int), None),
            Param("dtype", optional(parse_dtype), None)),
    inputs=("a",),
    infer_shape=_cumsum_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0] if attrs.dtype is None
                                                else attrs.dtype]),
    kernel=_cumsum_kernel,
    doc="Running sums along axis (over the flattened array when axis is None).",
))


# --- diag -------------------------------------------------------------------------------------

def _diag_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return shapes, [None]
    if len(data) == 1:
        size = data[0] + abs(attrs.k)
        return shapes, [(size, size)]
    first = normalize_axis(attrs.axis1, len(data), "diag axis1")
    second = normalize_axis(attrs.axis2, len(data), "diag axis2")
    if first == second:
        raise ShapeError(f"diag: axis1 and axis2 must differ; both are {first}")
    rows, cols = data[first], data[second]
    length = max(min(rows + min(attrs.k, 0), cols - max(attrs.k, 0)), 0)
    rest = tuple(dim for axis, dim in enumerate(data) if axis not in (first, second))
    return shapes, [(*rest, length)]


def _diag_kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    if data.ndim == 1:
        return xp.diag(data, attrs.k)
    diagonal = xp.diagonal(data, offset=attrs.k, axis1=attrs.axis1, axis2=attrs.axis2)
    return xp.ascontiguousarray(diagonal)


register(OpDef(
    name="diag",
    aliases=("_np_diag",),
    params=(Param("k", parse_int, 0), Param("axis1", parse_int, 0), Param("axis2", parse_int, 1)),
    infer_shape=_diag_infer,
    kernel=_diag_kernel,
    doc="A vector's diagonal matrix (offset k), or the k-th diagonal of axes axis1/axis2.",
))


def _np_diagonal(xp: Any, attrs: Attrs, data: Any) -> Any:
    return xp.ascontiguousarray(xp.diagonal(data, attrs.offset, attrs.axis1, attrs.axis2))


_DIAGONAL_PARAMS = (Param("offset", parse_int, 0), Param("axis1", parse_int, 0),
                    Param("axis2", parse_int, 1))


def _as_diag_attrs(attrs: Attrs) -> Attrs:
    return Attrs({"k": attrs.offset, "axis1": attrs.axis1, "axis2": attrs.axis2})


register(OpDef(
    name="_np_diagonal",
    params=_DIAGONAL_PARAMS,
    infer_shape=lambda attrs, shapes: _diag_infer(_as_diag_attrs(attrs), shapes),
    kernel=_np_diagonal,
    doc="The offset-th diagonal of axes axis1/axis2, as the last axis.",
))
register(OpDef(
    name="_np_trace",
    params=_DIAGONAL_PARAMS,
    infer_shape=lambda attrs, shapes: (shapes, [None if shapes[0] is None else _diag_infer(
        _as_diag_attrs(attrs), shapes)[1][0][:-1]]),
    kernel=lambda xp, attrs, data: xp.asarray(
        xp.trace(data, attrs.offset, attrs.axis1, attrs.axis2), dtype=data.dtype),
    doc="Sum of the offset-th diagonal of axes axis1/axis2.",
))
register(OpDef(
    name="_np_diagflat",
    params=(Param("k", parse_int, 0),),
    infer_shape=lambda attrs, shapes: (shapes, [None if shapes[0] is None else (
        (math.prod(shapes[0]) + abs(attrs.k),) * 2)]),
    kernel=lambda xp, attrs, data: xp.diagflat(data, attrs.k),
    doc="A square matrix with the flattened input on its k-th diagonal.",
))


# --- moments ----------------------------------------------------------------------------------

def _moments_axes(attrs: Attrs, ndim: int) -> tuple[int, ...]:
    if not attrs.axes:
        raise ShapeError("moments: axes must be given (MXNet refuses an empty axes list)")
    return tuple(sorted(normalize_axis(axis, ndim, "moments axis") for axis in attrs.axes))


def _moments_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return shapes, [None, None]
    axes = _moments_axes(attrs, len(data))
    kept = tuple(1 if axis in axes else dim for axis, dim in enumerate(data))
    dropped = tuple(dim for axis, dim in enumerate(data) if axis not in axes) or (1,)
    out = kept if attrs.keepdims else dropped  # MXNet keeps one axis when all are reduced
    return shapes, [out, out]


def _moments_kernel(xp: Any, attrs: Attrs, data: Any) -> tuple[Any, Any]:
    axes = _moments_axes(attrs, data.ndim)
    mean = data.mean(axis=axes, keepdims=True)
    variance = ((data - mean) ** 2).mean(axis=axes, keepdims=True)
    _, (shape, _) = _moments_infer(attrs, [data.shape])
    return mean.reshape(shape).astype(data.dtype), variance.reshape(shape).astype(data.dtype)


register(OpDef(
    name="moments",
    params=(Param("axes", optional(parse_int_tuple), None), Param("keepdims", parse_bool, False)),
    outputs=("mean", "var"),
    infer_shape=_moments_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0], dtypes[0]]),
    kernel=_moments_kernel,
    doc="Mean and (biased) variance over axes.",
))


# --- argmax_channel ---------------------------------------------------------------------------

register(OpDef(
    name="argmax_channel",
    infer_shape=lambda attrs, shapes: (shapes, [None if shapes[0] is None else shapes[0][:-1]]),
    infer_dtype=lambda attrs, dtypes: (dtypes, [FLOAT32 if dtypes[0] is None else dtypes[0]]),
    kernel=lambda xp, attrs, data: xp.argmax(data, axis=-1).astype(data.dtype),
    doc="Index of the largest value along the last axis, as a float.",
))
