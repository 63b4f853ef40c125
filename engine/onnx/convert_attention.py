"""Converters for GluonNLP's interleaved attention matmuls, their scaling and ``arange_like``.

The interleaved projections are ``(length, batch, heads * parts * width)``; each head's part is
cut out with Reshape + Gather and laid out as ``(batch * heads, length, width)``, as MXNet does.
"""

from __future__ import annotations

import math

import numpy as np

from engine.onnx.context import NodeContext, converts, normalize_axis


def _split_heads(ctx: NodeContext, data: str, parts: int, part: int) -> str:
    """Part ``part`` of every head of an interleaved input, as ``(batch * heads, length, w)``."""
    heads = int(ctx.params.heads)
    grouped = ctx.op("Reshape", [data, ctx.ints([0, 0, heads, parts, -1])])
    chosen = ctx.op("Gather", [grouped, ctx.builder.const(np.int64(part), "part")], axis=3)
    by_head = ctx.op("Transpose", [chosen], perm=[1, 2, 0, 3])  # batch, heads, length, width
    return ctx.op("Reshape", [by_head, _merged_leading(ctx, by_head)])


def _merged_leading(ctx: NodeContext, data: str) -> str:
    """The shape ``(-1, *shape[2:])`` of a 4-D tensor: its first two axes merged."""
    tail = ctx.op("Shape", [data], start=2)
    return ctx.op("Concat", [ctx.ints([-1]), tail], axis=0)


def _merge_heads(ctx: NodeContext, data: str) -> str:
    """``(batch * heads, length, width)`` back to ``(length, batch, heads * width)``."""
    heads = int(ctx.params.heads)
    tail = ctx.op("Shape", [data], start=1)
    split = ctx.op("Reshape", [data, ctx.op("Concat", [ctx.ints([-1, heads]), tail], axis=0)])
    by_position = ctx.op("Transpose", [split], perm=[2, 0, 1, 3])
    return ctx.op("Reshape", [by_position, ctx.ints([0, 0, -1])])


def _scores(ctx: NodeContext, queries: str, keys: str, width: int) -> str:
    # MXNet scales the queries (not the product) by 1 / sqrt(width).
    scale = ctx.builder.const(np.asarray(1.0 / math.sqrt(width), ctx.in_dtypes[0]),
                              f"{ctx.hint}_scale")
    scaled = ctx.op("Mul", [queries, scale])
    return ctx.op("MatMul", [scaled, ctx.op("Transpose", [keys], perm=[0, 2, 1])])


def _width(ctx: NodeContext, index: int, parts: int) -> int:
    return ctx.in_shapes[index][2] // (int(ctx.params.heads) * parts)


@converts("_contrib_interleaved_matmul_selfatt_qk")
def selfatt_qk(ctx: NodeContext) -> str:
    qkv = ctx.inputs[0]
    return _scores(ctx, _split_heads(ctx, qkv, 3, 0), _split_heads(ctx, qkv, 3, 1),
                   _width(ctx, 0, 3))


@converts("_contrib_interleaved_matmul_encdec_qk")
def encdec_qk(ctx: NodeContext) -> str:
    queries, keys_values = ctx.inputs[:2]
    return _scores(ctx, _split_heads(ctx, queries, 1, 0), _split_heads(ctx, keys_values, 2, 0),
                   _width(ctx, 0, 1))


@converts("_contrib_interleaved_matmul_selfatt_valatt", "_contrib_interleaved_matmul_encdec_valatt")
def valatt(ctx: NodeContext) -> str:
    parts = 3 if ctx.op_name.endswith("selfatt_valatt") else 2
    values = _split_heads(ctx, ctx.inputs[0], parts, parts - 1)
    return _merge_heads(ctx, ctx.op("MatMul", [ctx.inputs[1], values]))


@converts("_contrib_div_sqrt_dim")
def div_sqrt_dim(ctx: NodeContext) -> str:
    root = np.sqrt(np.float64(ctx.in_shapes[0][-1]))
    return ctx.op("Div", [ctx.inputs[0], ctx.scalar(root)])


@converts("_contrib_arange_like")
def arange_like(ctx: NodeContext) -> str:
    params, data = ctx.params, ctx.inputs[0]
    shape = ctx.op("Shape", [data])
    if params.axis is not None:
        axis = normalize_axis(params.axis, ctx.rank())
        shape = ctx.op("Shape", [data], start=axis, end=axis + 1)
    count = ctx.op("ReduceProd", [shape], keepdims=0)
    positions = ctx.op("Range", [ctx.builder.const(np.int64(0), "zero"), count,
                                 ctx.builder.const(np.int64(1), "one")])
    # start + step * (i // repeat), in float64 as MXNet computes it, then the data's dtype.
    steps = ctx.cast(ctx.op("Div", [positions, ctx.ints([int(params.repeat)])]), np.float64)
    values = ctx.op("Add", [ctx.op("Mul", [steps, ctx.builder.const(np.float64(params.step),
                                                                     "step")]),
                            ctx.builder.const(np.float64(params.start), "start")])
    return ctx.op("Reshape", [ctx.cast(values, ctx.out_dtypes[0]), shape])
