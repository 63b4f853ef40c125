"""NumPy-mode ``insert``: values put before an index (``_npi_insert_scalar``), before each
index of a slice (``_npi_insert_slice``) or of an index tensor (``_npi_insert_tensor``).

Each kernel joins ``arr`` and the broadcast values along the axis and gathers the result with a
permutation: for a scalar or a slice the permutation depends only on shapes and attributes (it
is made on the host once and uploaded), for an index tensor it is computed on the device from
the indices (sorted stably, as NumPy inserts repeated indices in their given order). Without an
axis, ``arr`` is flattened first. A scalar index moves the values' first axis to ``axis``, as
NumPy does; an index array of one element does not.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.kernels.workspace import uploaded
from engine.ops.attrs import optional, parse_float, parse_int
from engine.ops.dtypes import INT64
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred


def _frame(attrs: Attrs, shape: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """The shape insert works on (flattened without an axis) and the non-negative axis."""
    if attrs.axis is None:
        return (int(np.prod(shape)),), 0
    if not -len(shape) <= attrs.axis < len(shape):
        raise ShapeError(f"insert: axis {attrs.axis} is out of range for arr of shape {shape}")
    return shape, attrs.axis % len(shape)


def _aligned(values: tuple[int, ...], ndim: int) -> tuple[int, ...]:
    """``values``' shape with ndim dimensions: ones prepended, leading ones dropped."""
    extra = len(values) - ndim
    if extra > 0:
        if any(size != 1 for size in values[:extra]):
            raise ShapeError(f"insert: values of shape {values} have more dimensions than arr")
        return values[extra:]
    return (1,) * -extra + values


def _slice_positions(attrs: Attrs, length: int) -> np.ndarray:
    return np.arange(*slice(attrs.start, attrs.stop, attrs.step).indices(length))


def _count(attrs: Attrs, frame: tuple[int, ...], axis: int, values: tuple[int, ...],
           indices: int | None) -> int:
    """How many entries the insert adds along axis (``indices``: how many indices, None for
    a scalar index)."""
    aligned = _aligned(values, len(frame))
    if indices is None:
        return aligned[0]  # the values' first axis moves to axis
    return aligned[axis] if indices == 1 else indices


def _index_count(op: str, attrs: Attrs, frame: tuple[int, ...], axis: int,
                 shapes: list[MaybeShape]) -> int | None:
    if op == "scalar":
        return None
    if op == "slice":
        return len(_slice_positions(attrs, frame[axis]))
    obj = shapes[-1]
    if obj is None or len(obj) > 1:
        raise ShapeError(f"_npi_insert_tensor: obj must be a scalar or 1-D index array; got {obj}")
    return int(np.prod(obj))


def _insert_infer(op: str) -> Any:
    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        arr = shapes[0]
        values = () if attrs.val is not None else shapes[1]
        if arr is None or values is None or (op == "tensor" and shapes[-1] is None):
            return shapes, [None]
        if attrs.axis is not None and not arr:
            return shapes, [values]
        frame, axis = _frame(attrs, arr)
        added = _count(attrs, frame, axis, values, _index_count(op, attrs, frame, axis, shapes))
        return shapes, [(*frame[:axis], frame[axis] + added, *frame[axis + 1:])]

    return infer


def permutation(xp: Any, positions: Any, length: int) -> Any:
    """Source index of each output entry along the axis: entries of ``arr`` (0..length-1) in
    order, with new entry k (length + k) at output position ``positions[k]``."""
    added = positions.shape[0]
    is_new = xp.zeros(length + added, dtype=bool)
    is_new[positions] = True
    source = xp.zeros(length + added, dtype=INT64)
    source[positions] = xp.arange(length, length + added, dtype=INT64)
    old_rank = xp.cumsum(~is_new) - 1
    return xp.where(is_new, source, old_rank)


def output_positions(xp: Any, indices: Any, length: int) -> Any:
    """Where each index's new entry lands: indices shifted past the entries inserted before
    them (stably sorted, so repeated indices keep their order)."""
    indices = xp.where(indices < 0, indices + length, indices).astype(INT64)
    order = xp.argsort(indices, kind="stable")
    positions = xp.empty_like(indices)
    positions[order] = indices[order] + xp.arange(indices.shape[0], dtype=INT64)
    return positions


def _values_block(xp: Any, attrs: Attrs, arr: Any, values: Any, axis: int, moved: bool,
                  added: int) -> Any:
    """The values cast to arr's dtype and broadcast to arr's shape with ``added`` on axis."""
    if values is None:
        values = xp.full((), attrs.val, arr.dtype)
    block = values.astype(arr.dtype).reshape(_aligned(values.shape, arr.ndim))
    if moved:
        block = xp.moveaxis(block, 0, axis)
    shape = (*arr.shape[:axis], added, *arr.shape[axis + 1:])
    return xp.broadcast_to(block, shape)


def _insert(xp: Any, attrs: Attrs, op: str, arr: Any, values: Any, obj: Any) -> Any:
    if attrs.axis is not None and arr.ndim == 0:
        return (xp.full((), attrs.val, arr.dtype) if values is None else values.astype(arr.dtype))
    frame, axis = _frame(attrs, arr.shape)
    arr = arr.reshape(frame)
    length = frame[axis]
    shape = () if values is None else values.shape
    if op == "tensor":
        count = int(np.prod(obj.shape))
        added = _count(attrs, frame, axis, shape, count)
        if count == 1:
            first = obj.reshape(1).astype(INT64)
            positions = xp.where(first < 0, first + length, first) + xp.arange(added,
                                                                              dtype=INT64)
        else:
            positions = output_positions(xp, obj.reshape(-1), length)
        order = permutation(xp, positions, length)
        moved = False
    else:
        count = None if op == "scalar" else len(_slice_positions(attrs, length))
        added = _count(attrs, frame, axis, shape, count)
        order = uploaded(xp, ("insert", op, attrs.int_ind, attrs.start, attrs.stop,
                              attrs.step, length, added),
                         lambda: _host_permutation(attrs, op, length, added))
        moved = op == "scalar"
    block = _values_block(xp, attrs, arr, values, axis, moved, added)
    return xp.take(xp.concatenate([arr, block], axis=axis), order, axis=axis)


def _host_permutation(attrs: Attrs, op: str, length: int, added: int) -> np.ndarray:
    indices = (np.array([attrs.int_ind]) if op == "scalar"
               else _slice_positions(attrs, length))
    if op == "scalar" or len(indices) == 1:
        first = int(indices[0]) + (length if indices[0] < 0 else 0)
        if not 0 <= first <= length:
            raise ShapeError(f"insert: index {int(indices[0])} is out of bounds for an axis "
                             f"of size {length}")
        return permutation(np, first + np.arange(added), length)
    return permutation(np, output_positions(np, indices, length), length)


_PARAMS = (Param("val", optional(parse_float), None),
           Param("start", optional(parse_int), None),
           Param("stop", optional(parse_int), None),
           Param("step", optional(parse_int), None),
           Param("int_ind", optional(parse_int), None),
           Param("axis", optional(parse_int), None))


def _register(op: str, doc: str) -> None:
    extra = ("obj",) if op == "tensor" else ()

    def kernel(xp: Any, attrs: Attrs, arr: Any, *rest: Any) -> Any:
        values = None if attrs.val is not None else rest[0]
        return _insert(xp, attrs, op, arr, values, rest[-1] if extra else None)

    register(OpDef(
        name=f"_npi_insert_{op}", params=_PARAMS,
        inputs=lambda attrs: ("arr", *(() if attrs.val is not None else ("values",)), *extra),
        infer_shape=_insert_infer(op),
        infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
        kernel=kernel, doc=doc))


_register("scalar", "Insert values (or val) before index int_ind along axis.")
_register("slice", "Insert values (or val) before each index of start:stop:step along axis.")
_register("tensor", "Insert values (or val) before each index in obj along axis.")
