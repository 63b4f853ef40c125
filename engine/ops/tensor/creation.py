"""Casting (``Cast``, ``amp_cast``), filled arrays (``_zeros``, ``_ones``, ``_full``, their
NumPy-mode and ``*_like`` forms) and small utilities (``shape_array``, ``size_array``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.kernels.workspace import uploaded
from engine.ops.attrs import (
    optional,
    parse_dtype,
    parse_float,
    parse_int_tuple,
    parse_str,
)
from engine.ops.dtypes import FLOAT32, INT64
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, keep_input_dtypes, register
from engine.ops.shapes import Inferred, same_shape

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
    infer_dtype=keep_input_dtypes(lambda attrs, dtypes: attrs.dtype),
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
    infer_dtype=keep_input_dtypes(_amp_dtype),
    kernel=_amp_cast_kernel,
    doc="Mixed-precision cast: floating inputs become dtype, others pass through.",
))


# --- Creation ---------------------------------------------------------------------------------

def _fill_like(value: float | None) -> Any:
    def kernel(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
        fill = attrs.fill_value if value is None else value
        dtype = data.dtype if value is not None or attrs.dtype is None else attrs.dtype
        if out is None:
            return xp.full(data.shape, fill, dtype=dtype)
        out.fill(fill)
        return out

    return kernel


def _like_dtype(attrs: Attrs, dtypes: list) -> Any:
    return dtypes[0] if attrs.get("dtype") is None else attrs.dtype


# MXNet parses no attributes for zeros_like/ones_like: a `dtype` (GluonCV's CenterNet decoder
# writes one) stays in the JSON and is ignored, the input's dtype wins.
IGNORED_DTYPE = (Param("dtype", parse_str, ""),)

register(OpDef(
    name="zeros_like",
    aliases=("_np_zeros_like",),
    params=IGNORED_DTYPE,
    infer_shape=same_shape,
    kernel=_fill_like(0.0),
    writes_out=True,
    doc="An array of zeros with the input's shape and dtype.",
))
register(OpDef(
    name="ones_like",
    aliases=("_np_ones_like",),
    params=IGNORED_DTYPE,
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
    infer_dtype=keep_input_dtypes(_like_dtype),
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
    kernel=lambda xp, attrs, data: uploaded(xp, ("shape_array", data.shape),
                                            lambda: np.asarray(data.shape, INT64)).copy(),
    doc="The input's shape as a 1-D int64 array.",
))
register(OpDef(
    name="size_array",
    infer_shape=lambda attrs, shapes: (shapes, [(1,)]),
    infer_dtype=lambda attrs, dtypes: (dtypes, [INT64]),
    kernel=lambda xp, attrs, data: xp.full((1,), data.size, INT64),
    doc="The input's element count as a (1,) int64 array.",
))
