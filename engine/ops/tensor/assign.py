"""Assignment into a region: ``_slice_assign``, ``_slice_assign_scalar`` and ``_scatter_set_nd``
(with their ``_crop_assign*`` and ``_npi_*`` names).

MXNet runs these in place on an NDArray (``x[1:3] = y``). A symbol graph holds them when it is
built with the operators themselves (``mx.sym._internal._slice_assign``...; MXNet 1.9.1's
symbols have no item assignment), and there each node has an output of its own: that is their
meaning here, the input with the region replaced, and the input left as it was.
"""

from __future__ import annotations

from typing import Any

from engine.errors import ShapeError
from engine.ops.attrs import parse_float, parse_int_tuple, parse_optional_int_tuple
from engine.ops.dtypes import INT64
from engine.ops.registry import (
    Attrs,
    MaybeShape,
    OpDef,
    Param,
    default_dtype,
    emit,
    register,
)
from engine.ops.shapes import Inferred, merge
from engine.ops.tensor.slicing import slice_shape, slices


def _region_params() -> tuple[Param, ...]:
    return (
        Param("begin", parse_optional_int_tuple),
        Param("end", parse_optional_int_tuple),
        Param("step", parse_optional_int_tuple, ()),
    )


def _region_on_batch(attrs: Attrs) -> str:
    begin, end, step = attrs.begin, attrs.end, attrs.step
    whole = not begin or (begin[0] in (None, 0) and end[0] is None
                          and (not step or step[0] in (None, 1)))
    return "" if whole else "assigns a fixed region of axis 0"


# --- _slice_assign ----------------------------------------------------------------------------

def _slice_assign_shape(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    lhs, rhs = shapes
    if lhs is None:
        return shapes, [None]
    rhs = merge(rhs, slice_shape(attrs, lhs),
                f"_slice_assign rhs (the region begin={attrs.begin}, end={attrs.end}, "
                f"step={attrs.step} of lhs {lhs})")
    return [lhs, rhs], [lhs]


def _slice_assign_kernel(xp: Any, attrs: Attrs, lhs: Any, rhs: Any, out: Any = None) -> Any:
    result = emit(xp, lhs, out)
    result[slices(attrs, lhs.ndim)] = rhs
    return result


register(OpDef(
    name="_slice_assign",
    aliases=("_crop_assign", "_npi_slice_assign"),
    params=_region_params(),
    inputs=("lhs", "rhs"),
    infer_shape=_slice_assign_shape,
    infer_dtype=default_dtype,
    kernel=_slice_assign_kernel,
    writes_out=True,
    batch_positions=_region_on_batch,
    doc="lhs with the slice begin:end:step replaced by rhs (which has the slice's shape).",
))


def _slice_assign_scalar_kernel(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
    result = emit(xp, data, out)
    # An integer array takes the scalar truncated, as MXNet casts it.
    result[slices(attrs, data.ndim)] = attrs.scalar
    return result


def _slice_assign_scalar_shape(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    if shapes[0] is not None:
        slice_shape(attrs, shapes[0])  # refuses a region that does not fit the data
    return shapes, [shapes[0]]


register(OpDef(
    name="_slice_assign_scalar",
    aliases=("_crop_assign_scalar", "_npi_slice_assign_scalar"),
    params=(Param("scalar", parse_float, 0.0), *_region_params()),
    infer_shape=_slice_assign_scalar_shape,
    kernel=_slice_assign_scalar_kernel,
    writes_out=True,
    batch_positions=_region_on_batch,
    doc="data with every element of the slice begin:end:step set to scalar.",
))


# --- _scatter_set_nd --------------------------------------------------------------------------

def _scatter_set_shape(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    lhs, rhs, indices = shapes
    out = tuple(attrs.shape)
    lhs = merge(lhs, out, "_scatter_set_nd lhs (the shape attribute)")
    if indices is not None:
        if not indices or indices[0] > len(out):
            raise ShapeError(f"_scatter_set_nd: indices {indices} must address at most "
                             f"{len(out)} axes along their first axis")
        if indices[0]:
            rhs = merge(rhs, (*indices[1:], *out[indices[0]:]),
                        f"_scatter_set_nd rhs (one value per index of indices {indices})")
    return [lhs, rhs, indices], [out]


def _scatter_set_dtype(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    # lhs and rhs share one dtype; the indices keep theirs.
    lhs, rhs, indices = dtypes
    lhs = rhs if lhs is None else lhs
    return [lhs, lhs if rhs is None else rhs, indices], [lhs]


def _scatter_set_kernel(xp: Any, attrs: Attrs, lhs: Any, rhs: Any, indices: Any,
                        out: Any = None) -> Any:
    result = emit(xp, lhs, out)
    # Positions written twice keep one of the values: MXNet leaves which one unspecified.
    index = indices.astype(INT64)
    result[tuple(index[k] for k in range(index.shape[0]))] = rhs
    return result


register(OpDef(
    name="_scatter_set_nd",
    aliases=("_npi_scatter_set_nd",),
    params=(Param("shape", parse_int_tuple),),
    inputs=("lhs", "rhs", "indices"),
    infer_shape=_scatter_set_shape,
    infer_dtype=_scatter_set_dtype,
    kernel=_scatter_set_kernel,
    writes_out=True,
    batch_positions="writes at the positions its indices name along axis 0",
    doc="lhs with rhs written at the coordinates along indices' first axis (scatter_nd onto "
        "lhs rather than zeros).",
))
