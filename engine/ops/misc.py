"""Indexing, casting, creation, products, sums, embeddings and sequence operators."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import (
    choice,
    optional,
    parse_bool,
    parse_dtype,
    parse_float,
    parse_int,
    parse_int_tuple,
    parse_str,
)
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, Shape, register
from engine.ops.shapes import broadcast, merge, normalize_axis, same_shape

Inferred = tuple[list[MaybeShape], list[MaybeShape]]
FLOAT32 = np.dtype("float32")
INT64 = np.dtype("int64")


def _indices(xp: Any, indices: Any, size: int, mode: str) -> Any:
    """Integer indices (floats truncate toward zero), wrapped or clamped into ``[0, size)``."""
    index = indices.astype(INT64)
    if mode == "wrap":
        return xp.mod(index, size)
    return xp.clip(index, 0, size - 1)


def _keep_input_dtypes(out_dtype: Any) -> Any:
    """A dtype rule: inputs keep their dtypes, the output gets ``out_dtype(attrs, dtypes)``."""

    def infer(attrs: Attrs, dtypes: list) -> tuple[list, list]:
        return dtypes, [out_dtype(attrs, dtypes)]

    return infer


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
    infer_dtype=_keep_input_dtypes(lambda attrs, dtypes: dtypes[0]),
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
    infer_dtype=_keep_input_dtypes(lambda attrs, dtypes: dtypes[0]),
    kernel=_pick_kernel,
    doc="Pick one element along axis per position, at the given index.",
))


def _one_hot_kernel(xp: Any, attrs: Attrs, indices: Any) -> Any:
    index = indices.astype(INT64)[..., None]
    hot = index == xp.arange(attrs.depth, dtype=INT64)
    on = xp.asarray(attrs.on_value, dtype=attrs.dtype)
    off = xp.asarray(attrs.off_value, dtype=attrs.dtype)
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
    infer_dtype=_keep_input_dtypes(lambda attrs, dtypes: attrs.dtype),
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


# --- Casting ----------------------------------------------------------------------------------

def _cast(xp: Any, data: Any, dtype: np.dtype) -> Any:
    """``data.astype(dtype)``; float to integer truncates toward zero and wraps like C."""
    if np.issubdtype(data.dtype, np.floating) and np.issubdtype(dtype, np.integer):
        return data.astype(INT64).astype(dtype)
    return data.astype(dtype)


register(OpDef(
    name="Cast",
    aliases=("cast",),
    params=(Param("dtype", parse_dtype),),
    infer_shape=same_shape,
    infer_dtype=_keep_input_dtypes(lambda attrs, dtypes: attrs.dtype),
    kernel=lambda xp, attrs, data: _cast(xp, data, attrs.dtype),
    doc="Convert to dtype (float to integer truncates toward zero).",
))


def _amp_dtype(attrs: Attrs, dtypes: list) -> Any:
    source = dtypes[0]
    if source is not None and not np.issubdtype(source, np.floating):
        return source
    return attrs.dtype


def _amp_cast_kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    if not np.issubdtype(data.dtype, np.floating):
        return data.copy()
    return data.astype(attrs.dtype)


register(OpDef(
    name="amp_cast",
    params=(Param("dtype", parse_dtype),),
    infer_shape=same_shape,
    infer_dtype=_keep_input_dtypes(_amp_dtype),
    kernel=_amp_cast_kernel,
    doc="Mixed-precision cast: floating inputs become dtype, others pass through.",
))


# --- Creation ---------------------------------------------------------------------------------

def _fill_like(value: float | None) -> Any:
    def kernel(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
        fill = attrs.fill_value if value is None else value
        dtype = data.dtype if attrs.get("dtype") is None else attrs.dtype
        if out is None:
            return xp.full(data.shape, fill, dtype=dtype)
        out.fill(fill)
        return out

    return kernel


def _like_dtype(attrs: Attrs, dtypes: list) -> Any:
    return dtypes[0] if attrs.get("dtype") is None else attrs.dtype


register(OpDef(
    name="zeros_like",
    aliases=("_np_zeros_like",),
    infer_shape=same_shape,
    kernel=_fill_like(0.0),
    writes_out=True,
    doc="An array of zeros with the input's shape and dtype.",
))
register(OpDef(
    name="ones_like",
    aliases=("_np_ones_like",),
    infer_shape=same_shape,
    kernel=_fill_like(1.0),
    writes_out=True,
    doc="An array of ones with the input's shape and dtype.",
))
register(OpDef(
    name="_npi_full_like",
    params=(
        Param("fill_value", parse_float),
        Param("ctx", parse_str, ""),
        Param("dtype", optional(parse_dtype), None),
    ),
    inputs=("a",),
    infer_shape=same_shape,
    infer_dtype=_keep_input_dtypes(_like_dtype),
    kernel=_fill_like(None),
    writes_out=True,
    doc="An array of fill_value with the input's shape (and its dtype unless dtype is given).",
))


def _source_shape(numpy_mode: bool) -> Any:
    """Shape inference for a creation op: ``shape`` from the attrs, 0 dims left unknown.

    In legacy mode an empty shape is unknown; in NumPy mode it is a scalar.
    """

    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        shape: MaybeShape = tuple(max(dim, 0) for dim in attrs.shape)
        if not shape and not numpy_mode:
            shape = None
        return [], [shape]

    return infer


def _fill(value: float | None) -> Any:
    def kernel(xp: Any, attrs: Attrs, out: Any = None) -> Any:
        fill = attrs.value if value is None else value
        if out is not None:
            out.fill(fill)
            return out
        shape = tuple(attrs.shape)
        if any(dim <= 0 for dim in shape):
            raise ShapeError(f"shape {shape} still has unknown (0) dimensions; infer the graph's "
                             "shapes first so that they are filled in")
        return xp.full(shape, fill, dtype=attrs.dtype)

    return kernel


def _source_params(value: bool) -> tuple[Param, ...]:
    params = (
        Param("shape", parse_int_tuple, ()),
        Param("ctx", parse_str, ""),
        Param("dtype", parse_dtype, FLOAT32),
    )
    return (*params, Param("value", parse_float)) if value else params


for _name, _value, _numpy in (("_zeros", 0.0, False), ("_ones", 1.0, False),
                              ("_full", None, False), ("_npi_zeros", 0.0, True),
                              ("_npi_ones", 1.0, True), ("_npi_full", None, True)):
    register(OpDef(
        name=_name,
        params=_source_params(_value is None),
        inputs=(),
        infer_shape=_source_shape(_numpy),
        infer_dtype=lambda attrs, dtypes: ([], [attrs.dtype]),
        kernel=_fill(_value),
        writes_out=True,
        doc="A new array of the given shape and dtype, filled with a constant (0 dims are "
            "inferred from the graph).",
    ))


# --- Products and sums ------------------------------------------------------------------------

def _dot_split(shape: Shape, transpose: bool, left: bool) -> tuple[Shape, int]:
    """(kept dims, contracted size) of one dot operand, as MXNet views N-D operands."""
    if len(shape) == 1:
        return (), shape[0]
    if left != transpose:
        return shape[:-1], shape[-1]
    return shape[1:], shape[0]


def _dot_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    lhs, rhs = shapes
    if lhs is None or rhs is None:
        return shapes, [None]
    if len(lhs) == 1 and len(rhs) == 1:
        if attrs.transpose_a or attrs.transpose_b:
            raise ShapeError("dot of two vectors takes no transpose")
        merge(lhs, rhs, "dot vector lengths")
        return shapes, [(1,)]
    kept_lhs, inner_lhs = _dot_split(lhs, attrs.transpose_a, True)
    kept_rhs, inner_rhs = _dot_split(rhs, attrs.transpose_b, False)
    if inner_lhs and inner_rhs and inner_lhs != inner_rhs:
        raise ShapeError(f"dot: lhs {lhs} and rhs {rhs} do not contract "
                         f"(transpose_a={attrs.transpose_a}, transpose_b={attrs.transpose_b})")
    return shapes, [(*kept_lhs, *kept_rhs)]


def _dot_kernel(xp: Any, attrs: Attrs, lhs: Any, rhs: Any) -> Any:
    if lhs.ndim == 1 and rhs.ndim == 1:
        return xp.dot(lhs, rhs).reshape(1)
    if attrs.transpose_a:
        left = lhs.reshape(lhs.shape[0], -1).T
    else:
        left = lhs.reshape(-1, lhs.shape[-1])
    if attrs.transpose_b:
        right = rhs.reshape(-1, rhs.shape[-1]).T
    else:
        right = rhs.reshape(rhs.shape[0], -1)
    if left.shape[1] != right.shape[0]:
        raise ShapeError(f"dot: lhs {lhs.shape} and rhs {rhs.shape} do not contract")
    _, (shape,) = _dot_infer(attrs, [lhs.shape, rhs.shape])
    return xp.matmul(left, right).reshape(shape)


_PRODUCT_PARAMS = (
    Param("transpose_a", parse_bool, False),
    Param("transpose_b", parse_bool, False),
    Param("forward_stype", optional(choice("default", "row_sparse", "csr")), None),
)

register(OpDef(
    name="dot",
    params=_PRODUCT_PARAMS,
    inputs=("lhs", "rhs"),
    infer_shape=_dot_infer,
    kernel=_dot_kernel,
    doc="Dot product: contracts lhs's last axis (first if transpose_a) with rhs's first.",
))


def _batch_dot_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    lhs, rhs = shapes
    if lhs is None or rhs is None:
        return shapes, [None]
    if len(lhs) < 3 or len(lhs) != len(rhs):
        raise ShapeError(f"batch_dot needs operands of equal rank >= 3, got {lhs} and {rhs}")
    batch = merge(lhs[:-2], rhs[:-2], "batch_dot batch dimensions")
    rows, inner_lhs = (lhs[-1], lhs[-2]) if attrs.transpose_a else (lhs[-2], lhs[-1])
    inner_rhs, cols = (rhs[-1], rhs[-2]) if attrs.transpose_b else (rhs[-2], rhs[-1])
    if inner_lhs and inner_rhs and inner_lhs != inner_rhs:
        raise ShapeError(f"batch_dot: lhs {lhs} and rhs {rhs} do not contract")
    assert batch is not None
    return [(*batch, *lhs[-2:]), (*batch, *rhs[-2:])], [(*batch, rows, cols)]


def _batch_dot_kernel(xp: Any, attrs: Attrs, lhs: Any, rhs: Any) -> Any:
    left = xp.swapaxes(lhs, -1, -2) if attrs.transpose_a else lhs
    right = xp.swapaxes(rhs, -1, -2) if attrs.transpose_b else rhs
    return xp.matmul(left, right)


register(OpDef(
    name="batch_dot",
    params=_PRODUCT_PARAMS,
    inputs=("lhs", "rhs"),
    infer_shape=_batch_dot_infer,
    kernel=_batch_dot_kernel,
    doc="Matrix products over leading batch axes (the last two axes, optionally transposed).",
))


def _broadcast_partial(first: Shape, second: Shape) -> Shape:
    """Broadcast two shapes where 0 is an unknown dimension (unknown against 1 stays unknown)."""
    if all(first) and all(second):
        return broadcast(first, second)
    length = max(len(first), len(second))
    padded_a = (1,) * (length - len(first)) + tuple(first)
    padded_b = (1,) * (length - len(second)) + tuple(second)
    result = []
    for x, y in zip(padded_a, padded_b, strict=True):
        if x and y and x != y and 1 not in (x, y):
            raise ShapeError(f"shapes {first} and {second} do not broadcast")
        result.append(x if y == 1 else y if x == 1 else (x or y))
    return tuple(result)


def _matmul_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    a, b = shapes
    if a is None or b is None:
        return shapes, [None]
    if not a or not b:
        raise ShapeError("matmul does not take scalars")
    left = (1, *a) if len(a) == 1 else a
    right = (*b, 1) if len(b) == 1 else b
    if left[-1] and right[-2] and left[-1] != right[-2]:
        raise ShapeError(f"matmul: {a} and {b} do not contract")
    batch = _broadcast_partial(left[:-2], right[:-2])
    rows = left[-2:-1] if len(a) > 1 else ()
    cols = right[-1:] if len(b) > 1 else ()
    return shapes, [(*batch, *rows, *cols)]


register(OpDef(
    name="_npi_matmul",
    inputs=("a", "b"),
    infer_shape=_matmul_infer,
    kernel=lambda xp, attrs, a, b: xp.matmul(a, b),
    doc="NumPy matmul (broadcast batch axes; 1-D operands are promoted and dropped).",
))


def _np_dot_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    a, b = shapes
    if a is None or b is None:
        return shapes, [None]
    if not a or not b:
        return shapes, [b if not a else a]
    inner_b = b[0] if len(b) == 1 else b[-2]
    if a[-1] and inner_b and a[-1] != inner_b:
        raise ShapeError(f"dot: {a} and {b} do not contract")
    kept_b = () if len(b) == 1 else (*b[:-2], b[-1])
    return shapes, [(*a[:-1], *kept_b)]


register(OpDef(
    name="_np_dot",
    inputs=("a", "b"),
    infer_shape=_np_dot_infer,
    kernel=lambda xp, attrs, a, b: xp.asarray(xp.dot(a, b)),
    doc="NumPy dot: a's last axis against b's second-to-last (or only) axis.",
))


def _add_n_kernel(xp: Any, attrs: Attrs, *arrays: Any, out: Any = None) -> Any:
    if out is None:
        out = arrays[0].copy()
    else:
        xp.copyto(out, arrays[0], casting="unsafe")
    for array in arrays[1:]:
        out += array
    return out


register(OpDef(
    name="add_n",
    aliases=("ElementWiseSum",),
    params=(Param("num_args", parse_int),),
    inputs=lambda attrs: tuple(f"arg{index}" for index in range(attrs.num_args)),
    infer_shape=same_shape,
    kernel=_add_n_kernel,
    writes_out=True,
    doc="Elementwise sum of num_args arrays of one shape.",
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


# --- Sequence operators -----------------------------------------------------------------------

def _sequence_inputs(attrs: Attrs) -> tuple[str, ...]:
    return ("data", "sequence_length") if attrs.use_sequence_length else ("data",)


def _sequence_params(value: bool) -> tuple[Param, ...]:
    params = (Param("use_sequence_length", parse_bool, False), Param("axis", parse_int, 0))
    return (*params, Param("value", parse_float, 0.0)) if value else params


def _batch_axis(attrs: Attrs, ndim: int) -> tuple[int, int]:
    if ndim < 2:
        raise ShapeError(f"sequence ops need at least 2 axes (time and batch), got {ndim}")
    axis = normalize_axis(attrs.axis, ndim, "sequence axis")
    if axis > 1:
        raise ShapeError(f"sequence axis must be 0 or 1, got {attrs.axis}")
    return axis, 1 - axis


def _sequence_infer(drop_axis: bool) -> Any:
    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        data = shapes[0]
        if data is None:
            return shapes, [None]
        axis, batch = _batch_axis(attrs, len(data))
        result = [data]
        if attrs.use_sequence_length:
            result.append(merge(shapes[1], (data[batch],), "sequence_length"))
        out = (*data[:axis], *data[axis + 1:]) if drop_axis else data
        return result, [out]

    return infer


def _time_major(xp: Any, attrs: Attrs, data: Any) -> Any:
    """``data`` as (time, batch, ...) whatever the sequence axis."""
    axis, _ = _batch_axis(attrs, data.ndim)
    return data if axis == 0 else xp.swapaxes(data, 0, 1)


def _sequence_last(xp: Any, attrs: Attrs, data: Any, lengths: Any = None) -> Any:
    steps = _time_major(xp, attrs, data)
    if lengths is None:
        return steps[-1].copy()
    last = xp.clip(lengths.astype(INT64) - 1, 0, steps.shape[0] - 1)
    return steps[last, xp.arange(steps.shape[1])]


def _valid_steps(xp: Any, steps: Any, lengths: Any) -> Any:
    """(time, batch) mask of the steps inside each sequence's length."""
    return xp.arange(steps.shape[0])[:, None] < lengths.astype(INT64)[None, :]


def _sequence_mask(xp: Any, attrs: Attrs, data: Any, lengths: Any = None) -> Any:
    if lengths is None:
        return data.copy()
    steps = _time_major(xp, attrs, data)
    mask = _valid_steps(xp, steps, lengths).reshape(steps.shape[:2] + (1,) * (steps.ndim - 2))
    masked = xp.where(mask, steps, xp.asarray(attrs.value, dtype=data.dtype))
    return masked if attrs.axis % data.ndim == 0 else xp.swapaxes(masked, 0, 1).copy()


def _sequence_reverse(xp: Any, attrs: Attrs, data: Any, lengths: Any = None) -> Any:
    steps = _time_major(xp, attrs, data)
    if lengths is None:
        reversed_steps = steps[::-1]
    else:
        time = xp.arange(steps.shape[0])[:, None]
        length = lengths.astype(INT64)[None, :]
        source = xp.where(time < length, length - 1 - time, time)
        reversed_steps = steps[source, xp.arange(steps.shape[1])[None, :]]
    result = reversed_steps if attrs.axis % data.ndim == 0 else xp.swapaxes(reversed_steps, 0, 1)
    return result.copy()


def _sequence_dtype(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    return dtypes, [dtypes[0]]


for _name, _kernel, _drop, _value in (
        ("SequenceLast", _sequence_last, True, False),
        ("SequenceMask", _sequence_mask, False, True),
        ("SequenceReverse", _sequence_reverse, False, False)):
    register(OpDef(
        name=_name,
        params=_sequence_params(_value),
        inputs=_sequence_inputs,
        infer_shape=_sequence_infer(_drop),
        infer_dtype=_sequence_dtype,
        kernel=_kernel,
        doc=f"{_name} over (time, batch, ...) data (axis picks time), with optional lengths.",
    ))


# --- Small utilities --------------------------------------------------------------------------

register(OpDef(
    name="_identity_with_attr_like_rhs",
    inputs=("lhs", "rhs"),
    infer_shape=lambda attrs, shapes: (shapes, [shapes[0]]),
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=lambda xp, attrs, lhs, rhs: lhs.copy(),
    doc="lhs unchanged (rhs only lends its attributes during graph construction).",
))
register(OpDef(
    name="shape_array",
    infer_shape=lambda attrs, shapes: (
        shapes, [None if shapes[0] is None else (len(shapes[0]),)]),
    infer_dtype=lambda attrs, dtypes: (dtypes, [INT64]),
    kernel=lambda xp, attrs, data: xp.asarray(data.shape, dtype=INT64),
    doc="The input's shape as a 1-D int64 array.",
))
register(OpDef(
    name="size_array",
    infer_shape=lambda attrs, shapes: (shapes, [(1,)]),
    infer_dtype=lambda attrs, dtypes: (dtypes, [INT64]),
    kernel=lambda xp, attrs, data: xp.asarray([data.size], dtype=INT64),
    doc="The input's element count as a (1,) int64 array.",
))
