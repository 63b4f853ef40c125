"""MXNet's small internal operators: ``_square_sum``, ``_zeros_without_dtype``,
``amp_multicast``, the legacy NDArray functions ``_onehot_encode`` and ``fill_element_0index``,
and the assertion ``_npx_constraint_check``."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import InputError, ShapeError
from engine.ops.attrs import optional, parse_bool, parse_int, parse_int_tuple, parse_str
from engine.ops.dtypes import BOOL, FLOAT32
from engine.ops.math.reduce import reduced_axes, reduced_shape
from engine.ops.math.special import narrow
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred, merge

# MXNet's dtype codes (mshadow's type flags), as ``_zeros_without_dtype`` takes them.
_TYPE_FLAGS = {0: "float32", 1: "float64", 2: "float16", 3: "uint8", 4: "int32", 5: "int8",
               6: "int64", 7: "bool", 8: "int16", 9: "uint16", 10: "uint32", 11: "uint64"}
_AMP_FLOATS = (np.dtype(np.float16), FLOAT32)


# --- _square_sum ------------------------------------------------------------------------------

def _square_sum_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return shapes, [None]
    axes = reduced_axes(attrs.axis, attrs.exclude, len(data))
    return shapes, [reduced_shape(data, axes, attrs.keepdims)]


def _square_sum(xp: Any, attrs: Attrs, data: Any) -> Any:
    axes = reduced_axes(attrs.axis, attrs.exclude, data.ndim)
    accumulate = FLOAT32 if data.dtype == np.float16 else data.dtype
    total = xp.sum(data * data, axis=axes, keepdims=True, dtype=accumulate)
    return total.reshape(reduced_shape(data.shape, axes, attrs.keepdims)).astype(data.dtype)


register(OpDef(
    name="_square_sum",
    params=(Param("axis", optional(parse_int_tuple), None), Param("keepdims", parse_bool, False),
            Param("exclude", parse_bool, False)),
    infer_shape=_square_sum_infer,
    kernel=_square_sum,
    doc="Sum of squares over axis (MXNet runs it for row-sparse storage; here on dense arrays).",
))


# --- _zeros_without_dtype ---------------------------------------------------------------------

def parse_type_flag(value: Any) -> np.dtype | None:
    """One of MXNet's integer dtype codes (``"0"`` is float32); -1 means "not given"."""
    code = parse_int(value)
    if code == -1:
        return None
    if code not in _TYPE_FLAGS:
        raise ValueError(f"unknown dtype code {code}; expected -1 or one of {sorted(_TYPE_FLAGS)}")
    return np.dtype(_TYPE_FLAGS[code])


def _zeros_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    shape = tuple(max(dim, 0) for dim in attrs.shape)
    return [], [shape or None]


def _zeros_kernel(xp: Any, attrs: Attrs) -> Any:
    shape = tuple(attrs.shape)
    if not shape or any(dim <= 0 for dim in shape):
        raise ShapeError(f"_zeros_without_dtype: shape {shape} still has unknown (0) "
                         "dimensions; infer the graph's shapes first so that they are filled in")
    return xp.zeros(shape, dtype=attrs.dtype or FLOAT32)


register(OpDef(
    name="_zeros_without_dtype",
    params=(Param("shape", parse_int_tuple, ()), Param("ctx", parse_str, ""),
            Param("dtype", parse_type_flag, None)),
    inputs=(),
    infer_shape=_zeros_infer,
    infer_dtype=lambda attrs, dtypes: ([], [attrs.dtype or FLOAT32]),
    kernel=_zeros_kernel,
    doc="Zeros of the given shape; dtype is an MXNet type code, float32 when not given.",
))


# --- amp_multicast ----------------------------------------------------------------------------

def amp_target(attrs: Attrs, dtypes: list[np.dtype | None]) -> np.dtype | None:
    """The dtype every float16/float32 input becomes: float32 if any input is float32 (else
    input 0's dtype); with cast_narrow, float16 if any input is float16 (else float32)."""
    if attrs.cast_narrow:
        return np.dtype(np.float16) if np.dtype(np.float16) in dtypes else FLOAT32
    return FLOAT32 if FLOAT32 in dtypes else dtypes[0]


def _amp_multicast_dtype(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    target = amp_target(attrs, dtypes)
    return dtypes, [target if dtype in _AMP_FLOATS else dtype for dtype in dtypes]


def _amp_multicast(xp: Any, attrs: Attrs, *data: Any) -> tuple[Any, ...]:
    _, dtypes = _amp_multicast_dtype(attrs, [array.dtype for array in data])
    return tuple(narrow(xp, array, dtype) for array, dtype in zip(data, dtypes, strict=True))


register(OpDef(
    name="amp_multicast",
    params=(Param("num_outputs", parse_int), Param("cast_narrow", parse_bool, False)),
    inputs=lambda attrs: tuple(f"data_{k}" for k in range(attrs.num_outputs)),
    outputs=lambda attrs: tuple(f"output{k}" for k in range(attrs.num_outputs)),
    infer_shape=lambda attrs, shapes: (shapes, list(shapes)),
    infer_dtype=_amp_multicast_dtype,
    kernel=_amp_multicast,
    doc="Cast float16/float32 inputs to one common float type (the widest, or with cast_narrow "
        "the narrowest); other dtypes pass through.",
))


# --- legacy NDArray functions -----------------------------------------------------------------

def _rows_infer(matrix: int, vectors: tuple[int, ...]) -> Any:
    """Input ``matrix`` is (N, M), inputs ``vectors`` are (N,); the output has the matrix shape."""

    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        rows = shapes[matrix][0] if shapes[matrix] is not None else 0
        for index in vectors:
            if shapes[index] is not None:
                rows = merge((rows,), shapes[index][:1], "row counts")[0]
        if shapes[matrix] is not None and len(shapes[matrix]) != 2:
            raise ShapeError(f"expected a matrix (N, M); got {shapes[matrix]}")
        filled = list(shapes)
        for index in vectors:
            filled[index] = merge(shapes[index], (rows,), "index vector shape")
        out = None if shapes[matrix] is None else (rows, shapes[matrix][1])
        filled[matrix] = out
        return filled, [out]

    return infer


def _onehot_encode(xp: Any, attrs: Attrs, lhs: Any, rhs: Any) -> Any:
    columns = xp.arange(rhs.shape[1])
    return (columns[None, :] == lhs.astype(np.int64)[:, None]).astype(rhs.dtype)


def _fill_element_0index(xp: Any, attrs: Attrs, lhs: Any, mhs: Any, rhs: Any) -> Any:
    columns = xp.arange(lhs.shape[1])
    # An index outside the row matches no column: that row stays as it was.
    chosen = columns[None, :] == rhs.astype(np.int64)[:, None]
    return xp.where(chosen, mhs[:, None].astype(lhs.dtype), lhs)


register(OpDef(
    name="_onehot_encode",
    inputs=("lhs", "rhs"),
    infer_shape=_rows_infer(1, (0,)),
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[1]]),
    kernel=_onehot_encode,
    doc="Rows of zeros shaped like rhs, with a 1 at column lhs[i] of row i (deprecated in MXNet "
        "for one_hot).",
))
register(OpDef(
    name="fill_element_0index",
    inputs=("lhs", "mhs", "rhs"),
    infer_shape=_rows_infer(0, (1, 2)),
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=_fill_element_0index,
    doc="lhs with element (i, rhs[i]) of each row i set to mhs[i].",
))


# --- _npx_constraint_check --------------------------------------------------------------------

def _constraint_check(xp: Any, attrs: Attrs, data: Any) -> Any:
    holds = xp.all(data)
    if not bool(holds):
        raise InputError(f"ValueError: {attrs.msg}")
    return holds.astype(BOOL).reshape(())


def _constraint_dtype(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    if dtypes[0] is not None and np.dtype(dtypes[0]) != BOOL:
        raise ShapeError(f"_npx_constraint_check: input must be bool; got {dtypes[0]}")
    return [BOOL], [BOOL]


register(OpDef(
    name="_npx_constraint_check",
    params=(Param("msg", parse_str, "Constraint violated."),),
    inputs=("input",),
    infer_shape=lambda attrs, shapes: (shapes, [()]),
    infer_dtype=_constraint_dtype,
    kernel=_constraint_check,
    uncapturable="reads whether the constraint holds on the host, to raise its message",
    doc="True when every element of a bool array is true; otherwise raises msg.",
))
