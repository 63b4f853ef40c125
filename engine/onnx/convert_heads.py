"""Converters for loss heads with a computed forward and for assignment ops.

``softmax_cross_entropy`` is LogSoftmax, a gather of each row's label and a sum (a label
outside the classes gives NaN, as the engine does); ``_scatter_set_nd`` is ScatterND onto
``lhs``; slice assignment and the scalar boolean-mask assignment are a Where over a mask, with
the slice's values spread over the whole array by constant Gathers. The loss heads whose
forward is the identity are in `convert_math`'s table.
"""

from __future__ import annotations

import numpy as np

from engine.onnx.context import NodeContext, converts
from engine.ops.tensor.slicing import slices


@converts("softmax_cross_entropy")
def softmax_cross_entropy(ctx: NodeContext) -> str:
    dtype = ctx.in_dtypes[0]
    data = ctx.inputs[0]
    if dtype == np.float16:  # accumulate in float32, as the engine's kernel does
        data = ctx.cast(data, np.float32)
    log_probs = ctx.op("LogSoftmax", [data], axis=1)
    # Cast truncates a fractional label towards zero, as MXNet reads it.
    classes = ctx.cast(ctx.inputs[1], np.int64)
    inside = ctx.op("And", [ctx.op("GreaterOrEqual", [classes, ctx.ints([0])]),
                            ctx.op("Less", [classes, ctx.ints([ctx.static_dim(0, 1)])])])
    safe = ctx.unsqueeze(ctx.op("Where", [inside, classes, ctx.ints([0])]), [1])
    picked = ctx.squeeze(ctx.op("GatherElements", [log_probs, safe], axis=1), [1])
    nan = ctx.builder.const(np.array(np.nan, np.float32), f"{ctx.hint}_nan")
    if dtype != np.float16:
        nan = ctx.cast(nan, dtype)
    losses = ctx.op("Where", [inside, ctx.op("Neg", [picked]), nan])
    total = ctx.reduce("ReduceSum", losses, None, keepdims=True)
    return ctx.cast(total, dtype) if dtype == np.float16 else total


@converts("_scatter_set_nd")
def scatter_set_nd(ctx: NodeContext) -> str:
    # MXNet's index tuples run along the indices' first axis; ONNX's along their last.
    rank = ctx.rank(2)
    indices = ctx.op("Transpose", [ctx.cast(ctx.inputs[2], np.int64)],
                     perm=[*range(1, rank), 0])
    return ctx.op("ScatterND", [ctx.inputs[0], indices, ctx.inputs[1]])


@converts("_npi_boolean_mask_assign_scalar")
def boolean_mask_assign_scalar(ctx: NodeContext) -> str:
    start, data_rank, mask_rank = int(ctx.params.start_axis), ctx.rank(0), ctx.rank(1)
    mask = ctx.inputs[1]
    if ctx.in_dtypes[1] != np.bool_:
        mask = ctx.op("Not", [ctx.op("Equal", [mask, ctx.scalar(0, like=1)])])
    # Size-1 axes before and after, so the mask broadcasts over the data's other axes.
    axes = [*range(start), *range(start + mask_rank, data_rank)]
    if axes:
        mask = ctx.unsqueeze(mask, axes)
    value = ctx.builder.const(np.array(ctx.params.value).astype(ctx.in_dtypes[0]),
                              f"{ctx.hint}_value")
    return ctx.op("Where", [mask, value, ctx.inputs[0]])


def _region(ctx: NodeContext) -> list[tuple[int, np.ndarray]]:
    """Per sliced axis that the slice does not cover whole, in order: the positions it takes.

    Only those axes need their size at export, so an untouched batch axis stays dynamic.
    """
    taken = []
    for axis, index in enumerate(slices(ctx.params, ctx.rank(0))):
        whole = index.start in (None, 0) and index.stop is None and index.step in (None, 1)
        if not whole:
            size = ctx.static_dim(0, axis)
            taken.append((axis, np.arange(size)[index]))
    return taken


def _region_mask(ctx: NodeContext, taken: list[tuple[int, np.ndarray]]) -> str:
    shape = [1] * ctx.rank(0)
    mask = np.ones(shape, bool)
    for axis, positions in taken:
        inside = np.zeros(ctx.in_shapes[0][axis], bool)
        inside[positions] = True
        shape_at = [1] * ctx.rank(0)
        shape_at[axis] = -1
        mask = mask & inside.reshape(shape_at)
    return ctx.builder.const(mask, f"{ctx.hint}_region")


@converts("_slice_assign", "_slice_assign_scalar")
def slice_assign(ctx: NodeContext) -> str:
    taken = _region(ctx)
    if any(len(positions) == 0 for _, positions in taken):
        return ctx.op("Identity", [ctx.inputs[0]])  # an empty region assigns nothing
    mask = _region_mask(ctx, taken)
    if ctx.op_name == "_slice_assign_scalar":
        value = ctx.builder.const(np.array(ctx.params.scalar).astype(ctx.in_dtypes[0]),
                                  f"{ctx.hint}_value")
        return ctx.op("Where", [mask, value, ctx.inputs[0]])
    # Each position of a sliced axis reads its row of rhs (any row outside the region: the
    # mask discards it), which spreads rhs over the shape of lhs.
    spread = ctx.inputs[1]
    for axis, positions in taken:
        rows = np.zeros(ctx.in_shapes[0][axis], np.int64)
        rows[positions] = np.arange(len(positions))
        spread = ctx.op("Gather", [spread, ctx.builder.const(rows, f"{ctx.hint}_rows")],
                        axis=axis)
    return ctx.op("Where", [mask, spread, ctx.inputs[0]])
