"""NumPy-mode assignment through a boolean mask: ``_npi_boolean_mask_assign_scalar``
(``x[mask] = 2.5``) and ``_npi_boolean_mask_assign_tensor`` (``x[mask] = values``).

The mask covers the data's axes from ``start_axis`` on (``x[:, mask]`` has ``start_axis`` 1).
MXNet runs these in place (NDArray item assignment); as nodes of a graph built with the
operators themselves they give the data with the masked elements replaced, and the data itself
is left as it was. The output has the data's shape, so the
number of true mask elements never sets a shape: the k-th true element takes the k-th row of
the values (along the axis at ``start_axis``), found from a running count of the mask rather
than by selecting the masked elements, which keeps the kernel free of host reads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import InputError, ShapeError
from engine.ops.attrs import parse_float, parse_int
from engine.ops.dtypes import INT64
from engine.ops.registry import REQUIRED, Attrs, MaybeShape, OpDef, Param, Shape, register
from engine.ops.shapes import Inferred

DTypes = list["np.dtype | None"]


def _check_mask(attrs: Attrs, data: Shape, mask: Shape) -> None:
    start = attrs.start_axis
    if not 0 <= start <= len(data) - len(mask):
        raise ShapeError(f"boolean mask assignment: a {len(mask)}-D mask from start_axis "
                         f"{start} does not fit data of shape {data}")
    for offset, size in enumerate(mask):
        dim = data[start + offset]
        if size and dim and size != dim:
            raise ShapeError(f"boolean mask assignment: mask {mask} does not match data {data} "
                             f"along axis {start + offset} (start_axis {start})")


def _check_value(attrs: Attrs, data: Shape, mask: Shape, value: Shape) -> None:
    # The values read as (data's axes before the mask, one row per true element, the rest).
    trailing = data[attrs.start_axis + len(mask):]
    most = attrs.start_axis + 1 + len(trailing)
    if len(value) > most:
        raise ShapeError(f"boolean mask assignment: value of shape {value} has more than the "
                         f"{most} axes data {data} under mask {mask} takes")
    if int(np.prod(value)) == 1:
        return
    for axis in range(1, min(len(value), len(trailing)) + 1):
        want, got = trailing[-axis], value[-axis]
        if want and got and got not in (1, want):
            raise ShapeError(f"boolean mask assignment: value of shape {value} does not match "
                             f"the data's trailing axes {trailing}")


def _shape(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data, mask, *value = shapes
    if data is not None and mask is not None:
        _check_mask(attrs, data, mask)
        if value and value[0] is not None:
            _check_value(attrs, data, mask, value[0])
    return shapes, [data]


def _dtype(attrs: Attrs, dtypes: DTypes) -> tuple[DTypes, DTypes]:
    data, *rest = dtypes
    return [data, *(data if dtype is None else dtype for dtype in rest)], [data]


def _mask_on_batch(attrs: Attrs) -> str:
    # From start_axis 0 the mask (and the tensor form's k-th value row) is read per position
    # of axis 0.
    return "assigns through a mask over axis 0" if attrs.start_axis == 0 else ""


def _mask_over_data(mask: Any, start: int, ndim: int) -> Any:
    """The mask as a boolean array that broadcasts against the data."""
    trailing = ndim - start - mask.ndim
    return (mask != 0).reshape((1,) * start + mask.shape + (1,) * trailing)


def _scalar_kernel(xp: Any, attrs: Attrs, data: Any, mask: Any) -> Any:
    where = _mask_over_data(mask, attrs.start_axis, data.ndim)
    # The scalar is cast to the data's dtype first (an integer array truncates it, as MXNet).
    value = np.array(attrs.value).astype(data.dtype)[()]
    return xp.where(where, value, data)


def _rows_for_elements(xp: Any, attrs: Attrs, data: Any, mask: Any, value: Any) -> Any:
    """The values laid over the data: each true mask element gets its row of ``value``."""
    start = attrs.start_axis
    trailing = data.ndim - start - mask.ndim
    full = start + 1 + trailing
    value = value.reshape((1,) * (full - value.ndim) + value.shape)
    rows = value.shape[start]
    truth = (mask != 0).reshape(-1)
    if xp is np and rows != 1 and rows != int(truth.sum()):
        # On a device the count would need a host read, which CUDA-graph capture forbids.
        raise InputError(f"boolean mask assignment: {rows} value rows for {int(truth.sum())} "
                         f"true mask elements")
    ordinal = xp.cumsum(truth.astype(INT64)) - 1
    picked = xp.take(value, xp.clip(ordinal, 0, rows - 1), axis=start)
    picked = picked.reshape(value.shape[:start] + mask.shape + value.shape[start + 1:])
    return xp.broadcast_to(picked, data.shape)


def _tensor_kernel(xp: Any, attrs: Attrs, data: Any, mask: Any, value: Any) -> Any:
    where = _mask_over_data(mask, attrs.start_axis, data.ndim)
    if value.size == 1:
        laid = value.reshape(()).astype(data.dtype)
    else:
        laid = _rows_for_elements(xp, attrs, data, mask, value).astype(data.dtype, copy=False)
    return xp.where(where, laid, data)


register(OpDef(
    name="_npi_boolean_mask_assign_scalar",
    params=(Param("value", parse_float, REQUIRED), Param("start_axis", parse_int, 0)),
    inputs=("data", "mask"),
    infer_shape=_shape,
    infer_dtype=_dtype,
    kernel=_scalar_kernel,
    batch_positions=_mask_on_batch,
    doc="data with value written where the mask (over the axes from start_axis) is true.",
))

register(OpDef(
    name="_npi_boolean_mask_assign_tensor",
    params=(Param("start_axis", parse_int, 0),),
    inputs=("data", "mask", "value"),
    infer_shape=_shape,
    infer_dtype=_dtype,
    kernel=_tensor_kernel,
    batch_positions=_mask_on_batch,
    doc="data with the k-th true mask element set to the k-th row of value (one value "
        "broadcasts to all).",
))
