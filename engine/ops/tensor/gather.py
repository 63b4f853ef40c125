"""Reading one array through another: ``gather_nd`` (by index) and ``reshape_like`` (by shape)."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import optional, parse_int, parse_int_tuple
from engine.ops.dtypes import INT64
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, keep_input_dtypes, register
from engine.ops.shapes import Inferred

# --- gather_nd --------------------------------------------------------------------------------

def _gather_nd_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data, indices = shapes
    if data is None or indices is None:
        return shapes, [None]
    depth = indices[0]
    if depth > len(data):
        raise ShapeError(f"gather_nd: indices address {depth} dimensions (their first axis); "
                         f"data {data} has only {len(data)}")
    return shapes, [(*indices[1:], *data[depth:])]


def _gather_nd_kernel(xp: Any, attrs: Attrs, data: Any, indices: Any) -> Any:
    # Negative indices count from the end, as in NumPy (MXNet 1.9 does the same).
    index = indices.astype(INT64)
    return data[tuple(index[k] for k in range(index.shape[0]))]


register(OpDef(
    name="gather_nd",
    aliases=("_npi_gather_nd", "_npx_gather_nd"),
    inputs=("data", "indices"),
    infer_shape=_gather_nd_infer,
    infer_dtype=keep_input_dtypes(lambda attrs, dtypes: dtypes[0]),
    kernel=_gather_nd_kernel,
    doc="Elements or slices of data at the coordinates along indices' first axis.",
))


def _scatter_nd_kernel(xp: Any, attrs: Attrs, data: Any, indices: Any) -> Any:
    # Positions written twice keep one of the values, as in MXNet (which leaves it unspecified).
    out = xp.zeros(attrs.shape, data.dtype)
    index = indices.astype(INT64)
    out[tuple(index[k] for k in range(index.shape[0]))] = data
    return out


register(OpDef(
    name="scatter_nd",
    params=(Param("shape", parse_int_tuple),),
    inputs=("data", "indices"),
    infer_shape=lambda attrs, shapes: (shapes, [tuple(attrs.shape)]),
    infer_dtype=keep_input_dtypes(lambda attrs, dtypes: dtypes[0]),
    kernel=_scatter_nd_kernel,
    doc="A zero array of shape with data written at the coordinates along indices' first axis.",
))


# --- reshape_like -----------------------------------------------------------------------------

def _span(begin: int | None, end: int | None, ndim: int, what: str) -> tuple[int, int]:
    """A ``[begin, end)`` range of axes; None means the start or the end, negatives count back."""
    first = 0 if begin is None else begin + ndim if begin < 0 else begin
    last = ndim if end is None else end + ndim if end < 0 else end
    if not 0 <= first <= last <= ndim:
        raise ShapeError(f"reshape_like: {what} axes [{begin}, {end}) are out of range for "
                         f"{ndim} dimensions")
    return first, last


def _reshape_like_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    lhs, rhs = shapes
    if lhs is None or rhs is None:
        return shapes, [None]
    lhs_first, lhs_last = _span(attrs.lhs_begin, attrs.lhs_end, len(lhs), "lhs")
    rhs_first, rhs_last = _span(attrs.rhs_begin, attrs.rhs_end, len(rhs), "rhs")
    result = (*lhs[:lhs_first], *rhs[rhs_first:rhs_last], *lhs[lhs_last:])
    if all(lhs) and all(result) and np.prod(result) != np.prod(lhs):
        raise ShapeError(f"reshape_like: lhs {lhs} cannot take shape {result} from rhs {rhs}: "
                         "the sizes differ")
    return shapes, [result]


def _reshape_like_kernel(xp: Any, attrs: Attrs, lhs: Any, rhs: Any) -> Any:
    _, (shape,) = _reshape_like_infer(attrs, [lhs.shape, rhs.shape])
    return lhs.reshape(shape)


register(OpDef(
    name="reshape_like",
    aliases=("_npx_reshape_like",),
    params=tuple(Param(name, optional(parse_int), None)
                 for name in ("lhs_begin", "lhs_end", "rhs_begin", "rhs_end")),
    inputs=("lhs", "rhs"),
    infer_shape=_reshape_like_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=_reshape_like_kernel,
    view=True,
    doc="lhs with axes [lhs_begin, lhs_end) replaced by rhs's axes [rhs_begin, rhs_end).",
))
