"""Arrays of indices and reads or writes by them: ``index_array``, ``index_copy``,
``batch_take`` and multi-index ravel/unravel."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.kernels.workspace import uploaded
from engine.ops.attrs import optional, parse_int_tuple
from engine.ops.dtypes import INT64
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred, normalize_axis


def _keep_first(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    return dtypes, [dtypes[0]]


# --- index_array ------------------------------------------------------------------------------

def _index_axes(attrs: Attrs, ndim: int) -> tuple[int, ...]:
    if attrs.axes is None:
        return tuple(range(ndim))
    return tuple(normalize_axis(axis, ndim, "index_array axes") for axis in attrs.axes)


def _index_array(xp: Any, attrs: Attrs, data: Any) -> Any:
    grids = xp.indices(data.shape, dtype=INT64)
    return xp.stack([grids[axis] for axis in _index_axes(attrs, data.ndim)], axis=-1)


register(OpDef(
    name="_contrib_index_array",
    params=(Param("axes", optional(parse_int_tuple), None),),
    infer_shape=lambda attrs, shapes: (shapes, [None if shapes[0] is None else (
        *shapes[0], len(_index_axes(attrs, len(shapes[0]))))]),
    infer_dtype=lambda attrs, dtypes: (dtypes, [INT64]),
    kernel=_index_array,
    doc="Every element's index (along axes, all by default) as the last axis, int64.",
))


# --- index_copy, batch_take -------------------------------------------------------------------

def _index_copy(xp: Any, attrs: Attrs, old: Any, index: Any, new: Any) -> Any:
    result = old.copy()
    result[index.astype(INT64)] = new
    return result


register(OpDef(
    name="_contrib_index_copy",
    inputs=("old_tensor", "index_vector", "new_tensor"),
    infer_shape=lambda attrs, shapes: (shapes, [shapes[0]]),
    infer_dtype=_keep_first,
    kernel=_index_copy,
    batch_positions="copies rows to the positions its index names along axis 0",
    doc="old_tensor with the rows at index_vector replaced by new_tensor's rows.",
))


def _batch_take_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    a, indices = shapes
    if a is not None and len(a) != 2:
        raise ShapeError(f"batch_take: a must be 2-D; got {a}")
    return shapes, [indices if indices is not None else (None if a is None else a[:1])]


def _batch_take(xp: Any, attrs: Attrs, a: Any, indices: Any) -> Any:
    column = xp.clip(indices.astype(INT64), 0, a.shape[1] - 1)
    return a[xp.arange(a.shape[0]), column.reshape(-1)].reshape(indices.shape)


register(OpDef(
    name="batch_take",
    inputs=("a", "indices"),
    infer_shape=_batch_take_infer,
    infer_dtype=_keep_first,
    kernel=_batch_take,
    doc="a[i, indices[i]] for every row i (indices clipped to the row).",
))


# --- ravel / unravel --------------------------------------------------------------------------

def _ravel_strides(shape: tuple[int, ...], ndim: int, dtype: Any) -> np.ndarray:
    """Row-major strides of ``shape``, shaped to broadcast along the coordinates' first axis."""
    strides = np.cumprod((*shape[1:], 1)[::-1])[::-1]
    return strides.astype(dtype).reshape(-1, *([1] * (ndim - 1)))


def _ravel(xp: Any, attrs: Attrs, data: Any) -> Any:
    weights = uploaded(xp, ("ravel_strides", attrs.shape, data.ndim, data.dtype.str),
                       lambda: _ravel_strides(attrs.shape, data.ndim, data.dtype))
    return (data * weights).sum(axis=0).astype(data.dtype)


def _unravel(xp: Any, attrs: Attrs, data: Any) -> Any:
    flat = data.astype(INT64)
    coordinates = []
    for size in reversed(attrs.shape):
        coordinates.append(flat % size)
        flat = flat // size
    return xp.stack(coordinates[::-1]).astype(data.dtype)


register(OpDef(
    name="_ravel_multi_index",
    params=(Param("shape", parse_int_tuple),),
    infer_shape=lambda attrs, shapes: (shapes, [None if shapes[0] is None else shapes[0][1:]]),
    kernel=_ravel,
    doc="Flat indices into shape from coordinates along the first axis.",
))
register(OpDef(
    name="_unravel_index",
    params=(Param("shape", parse_int_tuple),),
    infer_shape=lambda attrs, shapes: (shapes, [None if shapes[0] is None else (
        len(attrs.shape), *shapes[0])]),
    kernel=_unravel,
    doc="Coordinates in shape (along a new first axis) of flat indices.",
))
