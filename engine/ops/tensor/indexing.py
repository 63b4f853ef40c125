"""Indexing: ``take``, ``pick``, ``one_hot``, ``where`` and ``Embedding``."""

from __future__ import annotations

from typing import Any

from engine.ops.attrs import (
    choice,
    optional,
    parse_bool,
    parse_dtype,
    parse_float,
    parse_int,
)
from engine.ops.dtypes import FLOAT32, INT64
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, keep_input_dtypes, register
from engine.ops.shapes import Inferred, merge, normalize_axis


def _indices(xp: Any, indices: Any, size: int, mode: str) -> Any:
    """Integer indices (floats truncate toward zero), wrapped or clamped into ``[0, size)``."""
    index = indices.astype(INT64)
    if mode == "wrap":
        return xp.mod(index, size)
    return xp.clip(index, 0, size - 1)


# --- Indexing ---------------------------------------------------------------------------------

def _take_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data, indices = shapes
    if data is None or indices is None:
        return shapes, [None]
    axis = normalize_axis(attrs.axis, len(data), "take axis")
    return shapes, [(*data[:axis], *indices, *data[axis + 1:])]


def _take_kernel(xp: Any, attrs: Attrs, data: Any, indices: Any) -> Any:
    axis = normalize_axis(attrs.axis, data.ndim, "take axis")
    index = _indices(xp, indices, data.shape[axis], attrs.mode)
    return xp.take(data, index, axis=axis)


register(OpDef(
    name="take",
    params=(
        Param("axis", parse_int, 0),
        Param("mode", choice("clip", "wrap", "raise"), "clip"),
    ),
    inputs=("a", "indices"),
    infer_shape=_take_infer,
    infer_dtype=keep_input_dtypes(lambda attrs, dtypes: dtypes[0]),
    kernel=_take_kernel,
    doc="Gather slices of a along axis at indices (clip clamps, wrap wraps; raise = clip).",
))


def _pick_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data, index = shapes
    if data is None:
        return shapes, [None]
    if attrs.axis is None:
        return shapes, [(1,) * len(data) if attrs.keepdims else (1,)]
    axis = normalize_axis(attrs.axis, len(data), "pick axis")
    kept = (*data[:axis], 1, *data[axis + 1:])
    dropped = (*data[:axis], *data[axis + 1:])
    if index is not None and len(index) == len(data):
        index = merge(index, kept, "pick index")
    else:
        index = merge(index, dropped, "pick index")
    return [data, index], [kept if attrs.keepdims else dropped]


def _pick_kernel(xp: Any, attrs: Attrs, data: Any, index: Any) -> Any:
    if attrs.axis is None:
        flat = data.reshape(-1)
        picked = flat[_indices(xp, index.reshape(-1)[:1], flat.shape[0], attrs.mode)]
        return picked.reshape((1,) * data.ndim if attrs.keepdims else (1,))
    axis = normalize_axis(attrs.axis, data.ndim, "pick axis")
    position = _indices(xp, index, data.shape[axis], attrs.mode)
    if position.ndim < data.ndim:
        position = xp.expand_dims(position, axis)
    picked = xp.take_along_axis(data, position, axis=axis)
    return picked if attrs.keepdims else picked.reshape(
        data.shape[:axis] + data.shape[axis + 1:])


register(OpDef(
    name="pick",
    params=(
        Param("axis", optional(parse_int), -1),
        Param("keepdims", parse_bool, False),
        Param("mode", choice("clip", "wrap"), "clip"),
    ),
    inputs=("data", "index"),
    infer_shape=_pick_infer,
    infer_dtype=keep_input_dtypes(lambda attrs, dtypes: dtypes[0]),
    kernel=_pick_kernel,
    doc="Pick one element along axis per position, at the given index.",
))


def _one_hot_kernel(xp: Any, attrs: Attrs, indices: Any) -> Any:
    index = indices.astype(INT64)[..., None]
    hot = index == xp.arange(attrs.depth, dtype=INT64)
    # Filled on the device, not copied from the host (a copy would block graph capture).
    on = xp.full((), attrs.on_value, dtype=attrs.dtype)
    off = xp.full((), attrs.off_value, dtype=attrs.dtype)
    return xp.where(hot, on, off)


register(OpDef(
    name="one_hot",
    params=(
        Param("depth", parse_int),
        Param("on_value", parse_float, 1.0),
        Param("off_value", parse_float, 0.0),
        Param("dtype", parse_dtype, FLOAT32),
    ),
    inputs=("indices",),
    infer_shape=lambda attrs, shapes: (
        shapes, [None if shapes[0] is None else (*shapes[0], attrs.depth)]),
    infer_dtype=keep_input_dtypes(lambda attrs, dtypes: attrs.dtype),
    kernel=_one_hot_kernel,
    doc="One-hot vectors of length depth; indices outside [0, depth) give all off_value.",
))


def _where_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    condition, x, y = shapes
    common = merge(x, y, "where x and y")
    if condition is not None and len(condition) == 1 and (common is None or len(common) > 1):
        if common is not None:
            condition = merge(condition, common[:1], "where condition (1-D) and x's rows")
        return [condition, common, common], [common]
    common = merge(common, condition, "where condition and x")
    return [common, common, common], [common]


def _where_kernel(xp: Any, attrs: Attrs, condition: Any, x: Any, y: Any) -> Any:
    if condition.ndim == 1 and x.ndim > 1:
        condition = condition.reshape((-1,) + (1,) * (x.ndim - 1))
    return xp.where(condition != 0, x, y)


def _where_dtype(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    known = dtypes[1] if dtypes[1] is not None else dtypes[2]
    return [dtypes[0], known, known], [known]


register(OpDef(
    name="where",
    inputs=("condition", "x", "y"),
    infer_shape=_where_infer,
    infer_dtype=_where_dtype,
    kernel=_where_kernel,
    doc="x where condition is non-zero, else y; a 1-D condition selects whole rows.",
))


# --- Embedding --------------------------------------------------------------------------------

def _embedding_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data, weight = shapes
    weight = merge(weight, (attrs.input_dim, attrs.output_dim), "Embedding weight")
    return [data, weight], [None if data is None else (*data, attrs.output_dim)]


def _embedding_dtype(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    data, weight = dtypes
    weight = attrs.dtype if weight is None else weight
    return [FLOAT32 if data is None else data, weight], [weight]


def _embedding_kernel(xp: Any, attrs: Attrs, data: Any, weight: Any) -> Any:
    return xp.take(weight, _indices(xp, data, weight.shape[0], "clip"), axis=0)


register(OpDef(
    name="Embedding",
    params=(
        Param("input_dim", parse_int),
        Param("output_dim", parse_int),
        Param("dtype", parse_dtype, FLOAT32),
        Param("sparse_grad", parse_bool, False),
    ),
    inputs=("data", "weight"),
    infer_shape=_embedding_infer,
    infer_dtype=_embedding_dtype,
    kernel=_embedding_kernel,
    doc="Rows of weight at integer (or integer-valued float) indices, clamped to the range.",
))
