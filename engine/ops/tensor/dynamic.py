"""Operators whose output shape depends on the input values: ``boolean_mask``, ``nonzero``,
``unique``, ``bincount`` and ``delete`` with a tensor of indices.

Their shape rules leave the data-dependent dimensions unknown (0) and each record says why in
``dynamic_shape``; a compiled model runs them between static stages (`engine.runtime.staged`).
The kernels read their inputs' values to size the outputs, so none can run inside a CUDA graph.
Semantics follow MXNet 1.9.1, including where it differs from NumPy (``delete`` drops negative
and out-of-range tensor indices instead of refusing them; ``nonzero`` of a 0-d array has one
column).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import InputError, ShapeError
from engine.ops.attrs import optional, parse_bool, parse_int
from engine.ops.dtypes import INT64
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, first_dtype, register
from engine.ops.shapes import Inferred, normalize_axis

_HOST = "sizes its output from its input values, read on the host"


# --- boolean_mask -------------------------------------------------------------------------------

def _mask_axis(attrs: Attrs) -> None:
    if attrs.axis != 0:
        raise ShapeError(f"axis {attrs.axis} is not supported; MXNet 1.9.1's boolean_mask "
                         "selects along axis 0 only")


def boolean_mask_shape(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    """Rows of ``data`` where ``index`` is nonzero: the row count is unknown until run time."""
    _mask_axis(attrs)
    data, index = shapes
    if index is not None and len(index) != 1:
        raise ShapeError(f"index must be 1-D; got shape {index}")
    if data is None:
        return shapes, [None]
    if not data:
        raise ShapeError("data must have at least one dimension")
    if index is not None and data[0] and index[0] and data[0] != index[0]:
        raise ShapeError(f"index has {index[0]} entries; expected {data[0]}, the length of "
                         "data's axis 0")
    return [data, index or (data[0],)], [(0, *data[1:])]


def boolean_mask_kernel(xp: Any, attrs: Attrs, data: Any, index: Any) -> Any:
    """``data[index != 0]`` along axis 0."""
    if index.shape != data.shape[:1]:
        raise InputError(f"index has shape {tuple(index.shape)}; expected "
                         f"({data.shape[0]},) to match data's axis 0")
    return data[xp.nonzero(index)[0]]


register(OpDef(
    name="_contrib_boolean_mask", aliases=("_npi_boolean_mask",),
    inputs=("data", "index"), params=(Param("axis", parse_int, 0),),
    kernel=boolean_mask_kernel, infer_shape=boolean_mask_shape, infer_dtype=first_dtype,
    dynamic_shape="keeps the rows whose mask entry is nonzero, a count known only at run time",
    uncapturable=_HOST, doc="Rows of data whose index entry is nonzero."))


# --- nonzero ------------------------------------------------------------------------------------

def nonzero_shape(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    """One row per nonzero element, one column per dimension (one for a 0-d input)."""
    (x,) = shapes
    return shapes, [None if x is None else (0, max(len(x), 1))]


def nonzero_kernel(xp: Any, attrs: Attrs, x: Any) -> Any:
    """Indices of the nonzero elements as an (elements, dimensions) int64 array."""
    if x.ndim == 0:  # MXNet treats a 0-d array as one element with a single index column
        x = x.reshape(1)
    return xp.stack(xp.nonzero(x), axis=1).astype(INT64)


register(OpDef(
    name="_npx_nonzero", aliases=("_npi_nonzero",), inputs=("x",), kernel=nonzero_kernel,
    infer_shape=nonzero_shape, infer_dtype=lambda attrs, dtypes: (dtypes, [INT64]),
    dynamic_shape="has one row per nonzero element, a count known only at run time",
    uncapturable=_HOST, doc="Indices of nonzero elements, one row each."))


# --- unique -------------------------------------------------------------------------------------

def unique_outputs(attrs: Attrs) -> tuple[str, ...]:
    """``output``, then index, inverse and counts as asked (MXNet numbers several outputs)."""
    count = 1 + attrs.return_index + attrs.return_inverse + attrs.return_counts
    return ("output",) if count == 1 else tuple(f"output{k}" for k in range(count))


def unique_shape(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    """The unique values' count is unknown; the inverse has one entry per element (or slice)."""
    (data,) = shapes
    extras = [attrs.return_index, attrs.return_inverse, attrs.return_counts]
    if data is None:
        return shapes, [None] * (1 + sum(extras))
    if attrs.axis is None:
        size = int(np.prod(data)) if all(data) else 0
        values, along = (0,), size
    else:
        axis = normalize_axis(attrs.axis, len(data))
        values, along = (*data[:axis], 0, *data[axis + 1:]), data[axis]
    outputs: list[MaybeShape] = [values]
    outputs += [shape for shape, wanted in zip([(0,), (along,), (0,)], extras) if wanted]
    return shapes, outputs


def unique_dtype(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    """Values keep the data's dtype; indices, inverse and counts are int64."""
    return dtypes, [dtypes[0]] + [INT64] * (len(unique_outputs(attrs)) - 1)


def unique_kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    """Sorted unique values (or slices along ``axis``), with the outputs asked for."""
    if data.size == 0:
        raise InputError("unique of an empty array is not defined (MXNet refuses it)")
    if attrs.axis is None:
        data, axis = data.reshape(-1), None
    else:
        axis = normalize_axis(attrs.axis, data.ndim)
    results = xp.unique(data, return_index=attrs.return_index,
                        return_inverse=attrs.return_inverse,
                        return_counts=attrs.return_counts, axis=axis)
    if not isinstance(results, tuple):
        return results
    values, *rest = results
    return (values, *(extra.reshape(-1).astype(INT64) for extra in rest))


register(OpDef(
    name="_npi_unique", inputs=("data",), outputs=unique_outputs,
    params=(Param("return_index", parse_bool, False), Param("return_inverse", parse_bool, False),
            Param("return_counts", parse_bool, False), Param("axis", optional(parse_int), None)),
    kernel=unique_kernel, infer_shape=unique_shape, infer_dtype=unique_dtype,
    dynamic_shape="returns one entry per distinct value, a count known only at run time",
    uncapturable=_HOST, doc="Sorted unique elements, with first indices, inverse and counts."))


# --- bincount -----------------------------------------------------------------------------------

def bincount_inputs(attrs: Attrs) -> tuple[str, ...]:
    """``data``, and ``weights`` when ``has_weights``."""
    return ("data", "weights") if attrs.has_weights else ("data",)


def bincount_shape(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    """A count per value up to the largest in ``data`` (at least ``minlength``): unknown."""
    data = shapes[0]
    if data is not None and len(data) != 1:
        raise ShapeError(f"data must be 1-D; got shape {data}")
    if attrs.has_weights and data is not None and shapes[1] is not None \
            and tuple(shapes[1]) != tuple(data) and all(shapes[1]) and all(data):
        raise ShapeError(f"weights have shape {shapes[1]}; expected {data}, the data's")
    return shapes, [(0,)]


def bincount_dtype(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    """Counts have the data's (integer) dtype; weighted sums the weights' dtype."""
    if dtypes[0] is not None and np.dtype(dtypes[0]).kind not in "iub":
        raise ShapeError(f"data must hold integers; got {np.dtype(dtypes[0]).name}")
    return dtypes, [dtypes[-1]]


def bincount_kernel(xp: Any, attrs: Attrs, data: Any, weights: Any = None) -> Any:
    """Occurrences of each value 0..max(data) (at least ``minlength`` of them)."""
    if data.size == 0:
        raise InputError("bincount of an empty array is not defined (MXNet refuses it)")
    values = data.astype(INT64)
    if int(values.min()) < 0:
        raise InputError("data holds negative values; bincount counts values from 0")
    length = max(int(values.max()) + 1, attrs.minlength)
    if weights is None:
        return xp.bincount(values, minlength=length).astype(data.dtype)
    return xp.bincount(values, weights=weights, minlength=length).astype(weights.dtype)


register(OpDef(
    name="_npi_bincount", inputs=bincount_inputs,
    params=(Param("minlength", parse_int, 0), Param("has_weights", parse_bool, False)),
    kernel=bincount_kernel, infer_shape=bincount_shape, infer_dtype=bincount_dtype,
    dynamic_shape="has one bin per value up to the largest in data, known only at run time",
    uncapturable=_HOST, doc="Counts (or weight sums) of each non-negative integer value."))


# --- delete -------------------------------------------------------------------------------------

def _tensor_form(attrs: Attrs) -> bool:
    # MXNet's frontend always sets ``step`` for a slice and ``int_ind`` for an int.
    return attrs.step is None and attrs.int_ind is None


def delete_inputs(attrs: Attrs) -> tuple[str, ...]:
    """``arr``, and ``obj`` (the indices) when they are a tensor rather than attributes."""
    return ("arr", "obj") if _tensor_form(attrs) else ("arr",)


def _static_indices(attrs: Attrs, length: int) -> list[int]:
    """The positions an int or slice ``obj`` deletes along an axis of ``length``."""
    if attrs.int_ind is not None:
        if not -length <= attrs.int_ind < length:
            raise ShapeError(f"index {attrs.int_ind} is out of bounds for an axis of size "
                             f"{length}")
        return [attrs.int_ind % length]
    return list(range(length)[slice(attrs.start, attrs.stop, attrs.step)])


def delete_shape(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    """Static forms know how many positions go; a tensor of indices leaves it unknown."""
    arr = shapes[0]
    if arr is None:
        return shapes, [None]
    if attrs.axis is None:
        arr, axis = ((int(np.prod(arr)) if all(arr) else 0),), 0
    else:
        axis = normalize_axis(attrs.axis, len(arr))
    length = arr[axis]
    if _tensor_form(attrs) or not length:
        kept = 0
    else:
        kept = length - len(set(_static_indices(attrs, length)))
    return shapes, [(*arr[:axis], kept, *arr[axis + 1:])]


def delete_kernel(xp: Any, attrs: Attrs, arr: Any, obj: Any = None) -> Any:
    """``arr`` without the positions ``obj`` (or the int/slice attributes) names."""
    if attrs.axis is None:
        arr, axis = arr.reshape(-1), 0
    else:
        axis = normalize_axis(attrs.axis, arr.ndim)
    length = arr.shape[axis]
    keep = xp.ones(length, dtype=bool)
    if obj is None:
        keep[_static_indices(attrs, length)] = False
    else:
        if obj.dtype == np.bool_:
            raise InputError("obj holds booleans; MXNet's delete takes integer indices")
        positions = obj.reshape(-1).astype(INT64)
        # MXNet skips negative and out-of-range indices rather than refusing them.
        keep[positions[(positions >= 0) & (positions < length)]] = False
    return xp.compress(keep, arr, axis=axis)


register(OpDef(
    name="_npi_delete", inputs=delete_inputs,
    params=(Param("start", optional(parse_int), None), Param("stop", optional(parse_int), None),
            Param("step", optional(parse_int), None), Param("int_ind", optional(parse_int), None),
            Param("axis", optional(parse_int), None)),
    kernel=delete_kernel, infer_shape=delete_shape, infer_dtype=first_dtype,
    dynamic_shape=lambda attrs: ("deletes the positions a tensor names, a count known only at "
                                 "run time") if _tensor_form(attrs) else "",
    uncapturable=_HOST + " (when obj is a tensor; the int and slice forms are left "
                         "uncaptured too)",
    doc="Delete positions along an axis (or of the flattened array)."))
