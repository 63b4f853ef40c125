"""Converters for ops whose output shape depends on the data: ONNX has ``Compress``,
``NonZero`` and ``Unique``, whose outputs are sized at run time the same way.

``_npi_bincount`` and ``_npi_delete`` are refused (see `engine.onnx.refused`).
"""

from __future__ import annotations

import numpy as np

from engine.onnx.context import NodeContext, converts, normalize_axis

INT64 = np.dtype(np.int64)
# ONNX Runtime's Unique takes float32, int64 and int8 only: other dtypes go through one that
# holds every value exactly, and the values come back in the input's dtype.
_UNIQUE_CARRIER = {"i": INT64, "u": INT64, "b": INT64, "h": np.dtype(np.float32)}


@converts("_contrib_boolean_mask")
def boolean_mask(ctx: NodeContext) -> str:
    # Compress takes a bool condition; a cast makes every nonzero mask entry true, as in MXNet.
    return ctx.op("Compress", [ctx.inputs[0], ctx.cast(ctx.inputs[1], np.bool_)], axis=0)


@converts("_npx_nonzero")
def nonzero(ctx: NodeContext) -> str:
    data = ctx.inputs[0]
    if ctx.rank() == 0:  # MXNet: a 0-d array is one element with one index column
        data = ctx.op("Reshape", [data, ctx.ints([1])])
    return ctx.op("Transpose", [ctx.op("NonZero", [data])], perm=[1, 0])


@converts("_npi_unique")
def unique(ctx: NodeContext) -> str | list[str]:
    params = ctx.params
    data = ctx.inputs[0]
    if params.axis is None:
        data, attrs = ctx.op("Reshape", [data, ctx.ints([-1])]), {}
    else:
        attrs = {"axis": normalize_axis(params.axis, ctx.rank())}
    dtype = ctx.in_dtypes[0]
    carrier = _UNIQUE_CARRIER.get(dtype.kind if dtype != np.float16 else "h")
    if carrier is not None:
        data = ctx.cast(data, carrier)
    values, index, inverse, counts = ctx.op("Unique", [data], outputs=4, sorted=1, **attrs)
    if carrier is not None:
        values = ctx.cast(values, dtype)
    wanted = [values] + [name for name, flag in ((index, params.return_index),
                                                  (inverse, params.return_inverse),
                                                  (counts, params.return_counts)) if flag]
    return wanted if len(wanted) > 1 else wanted[0]
