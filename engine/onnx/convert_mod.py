"""Converters for MXNet's mod family: the remainder takes the divisor's sign, and is 0 where
the divisor is 0 (as the engine's ``_mod`` kernel and MXNet compute it)."""

from __future__ import annotations

import numpy as np

from engine.onnx.context import NodeContext, converts

BINARY_MOD = ("_mod", "broadcast_mod")
# name -> scalar is the dividend (reversed operands)
SCALAR_MOD = {"_mod_scalar": False, "_npi_mod_scalar": False, "_rmod_scalar": True,
              "_npi_rmod_scalar": True}


@converts(*BINARY_MOD)
def mod(ctx: NodeContext) -> str:
    operands = [ctx.inputs[k] if ctx.in_dtypes[k] == ctx.out_dtypes[0]
                else ctx.cast(ctx.inputs[k], ctx.out_dtypes[0]) for k in range(2)]
    return mxnet_mod(ctx, *operands)


@converts(*SCALAR_MOD)
def mod_scalar(ctx: NodeContext) -> str:
    dtype = np.dtype(ctx.out_dtypes[0])
    data = ctx.inputs[0] if ctx.in_dtypes[0] == dtype else ctx.cast(ctx.inputs[0], dtype)
    value = ctx.params.scalar
    # The engine truncates the scalar to the data's integer dtype, as MXNet does.
    scalar = _const(ctx, int(value) if np.issubdtype(dtype, np.integer) else value)
    if SCALAR_MOD[ctx.op_name]:
        return mxnet_mod(ctx, scalar, data)
    return mxnet_mod(ctx, data, scalar)


def mxnet_mod(ctx: NodeContext, dividend: str, divisor: str) -> str:
    """``dividend mod divisor`` with the divisor's sign, and 0 where the divisor is 0.

    Both operands have the output dtype. ONNX integer Mod (fmod=0) already takes the divisor's
    sign; float Mod needs fmod=1 (C fmod, the dividend's sign), then a nonzero remainder whose
    sign differs from the divisor's moves by one divisor, as numpy's and MXNet's kernels do.
    """
    zero = ctx.op("Equal", [divisor, _const(ctx, 0)])
    # A 0 divisor would be undefined behaviour for integer Mod: divide by 1 and mask instead.
    safe = ctx.op("Where", [zero, _const(ctx, 1), divisor])
    if np.issubdtype(np.dtype(ctx.out_dtypes[0]), np.integer):
        remainder = ctx.op("Mod", [dividend, safe], fmod=0)
    else:
        remainder = _to_divisor_sign(ctx, ctx.op("Mod", [dividend, safe], fmod=1), safe)
    return ctx.op("Where", [zero, _const(ctx, 0), remainder])


def _to_divisor_sign(ctx: NodeContext, remainder: str, divisor: str) -> str:
    nonzero = ctx.op("Not", [ctx.op("Equal", [remainder, _const(ctx, 0)])])
    signs_differ = ctx.op("Xor", [ctx.op("Less", [remainder, _const(ctx, 0)]),
                                  ctx.op("Less", [divisor, _const(ctx, 0)])])
    moved = ctx.op("Add", [remainder, divisor])
    return ctx.op("Where", [ctx.op("And", [nonzero, signs_differ]), moved, remainder])


def _const(ctx: NodeContext, value: float) -> str:
    """A 0-D constant of the output dtype."""
    return ctx.builder.const(np.asarray(value, ctx.out_dtypes[0]), f"{ctx.hint}_scalar")
