"""FullyConnected: ``y = x · Wᵀ + b`` with MXNet's ``flatten`` rule."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.kernels import gemm_bind, packed_weight
from engine.kernels.packed_weight import PackedWeight
from engine.ops.attrs import parse_bool, parse_int
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import merge


def _inputs(attrs: Attrs) -> tuple[str, ...]:
    return ("data", "weight") if attrs.no_bias else ("data", "weight", "bias")


def _infer_shape(attrs: Attrs, shapes: list[MaybeShape]) -> tuple[list[MaybeShape],
                                                                   list[MaybeShape]]:
    data = shapes[0]
    in_units = 0
    out: MaybeShape = None
    if data is not None:
        if attrs.flatten:
            in_units = 1
            for dim in data[1:]:
                in_units *= dim
            out = (data[0], attrs.num_hidden)
        else:
            in_units = data[-1]
            out = (*data[:-1], attrs.num_hidden)
    weight = merge(shapes[1], (attrs.num_hidden, in_units), "FullyConnected weight")
    if data is not None and weight is not None and weight[1] and not in_units:
        # The data width is only known through the weight (deferred data shape).
        if not attrs.flatten:
            data = (*data[:-1], weight[1])
            out = (*data[:-1], attrs.num_hidden)
        else:
            data = _fill_flattened(data, weight[1])
    result: list[MaybeShape] = [data, weight]
    if not attrs.no_bias:
        result.append(merge(shapes[2], (attrs.num_hidden,), "FullyConnected bias"))
    return result, [out]


def _fill_flattened(data: tuple[int, ...], in_units: int) -> tuple[int, ...]:
    """With flatten=True the trailing axes multiply to the weight's width: one unknown trailing
    axis (0) is that width over the known ones (an exported MLP's input learns its features)."""
    unknown = [axis for axis in range(1, len(data)) if not data[axis]]
    if len(unknown) != 1:
        return data
    known = 1
    for axis, dim in enumerate(data):
        if axis and dim:
            known *= dim
    if in_units % known:
        raise ShapeError(f"FullyConnected: data {data} flattens to a multiple of {known} "
                         f"features; the weight takes {in_units}")
    return (*data[:unknown[0]], in_units // known, *data[unknown[0] + 1:])


def _kernel(xp: Any, attrs: Attrs, data: Any, weight: Any, bias: Any = None,
            out: Any = None) -> Any:
    if isinstance(weight, PackedWeight):  # a product our GEMM cannot take: the plain weight
        weight = weight.unpacked()
    if attrs.flatten:  # the width spelt out: -1 cannot be resolved for zero rows
        matrix = data.reshape(data.shape[0], math.prod(data.shape[1:]))
    else:
        matrix = data.reshape(-1, data.shape[-1])
    if matrix.shape[1] != weight.shape[1]:
        raise ShapeError(f"data width {matrix.shape[1]} does not match weight {weight.shape}")
    if out is None:
        result = xp.matmul(matrix, weight.T)  # not `@`, which bypasses xp (see engine.cuda.blas)
        if bias is not None:
            result += bias
        shape = (data.shape[0], attrs.num_hidden) if attrs.flatten else (
            *data.shape[:-1], attrs.num_hidden)
        return result.reshape(shape)
    target = out.reshape(matrix.shape[0], attrs.num_hidden)
    xp.matmul(matrix, weight.T, out=target)
    if bias is not None:
        target += bias
    return out


def _bind(xp: Any, attrs: Attrs, inputs: list[Any], out: Any,
          workspace: Any = None) -> list[Callable[[], Any]]:
    """matmul straight into the output buffer, then the bias added in place."""
    data, weight = inputs[0], inputs[1]
    matrix = data.reshape(data.shape[0], -1) if attrs.flatten else data.reshape(-1, data.shape[-1])
    target = out.reshape(matrix.shape[0], attrs.num_hidden)
    if matrix.shape[1] != weight.shape[1] or not xp.shares_memory(target, out):
        return [partial(_kernel, xp, attrs, *inputs, out=out)]
    if isinstance(weight, PackedWeight):  # held only as our GEMM's panels
        ours = packed_weight.product(matrix, weight, target)
        if ours is None:  # operands the kernel cannot take: the weight rebuilt at each call
            return [partial(_kernel, xp, attrs, *inputs, out=out)]
    elif xp is np and workspace is not None and not weight.flags.writeable:  # a constant
        ours = gemm_bind.product_with_weight(xp, matrix, weight.T, target, workspace)
    else:
        ours = None
    calls = [ours or _product(xp, matrix, weight.T, target)]
    if not attrs.no_bias and gemm_bind.takes_bias(calls, inputs[2]):
        return gemm_bind.with_bias(calls, bias_columns=inputs[2])
    if not attrs.no_bias:
        # The bias as a row, of the target's own ndim: NumPy broadcasts a (N,) bias over a
        # (1, N) target through its general loop (0.74 µs at N = 256) and a (1, N) one through
        # the contiguous loop (0.23 µs), the seed MLP's batch-1 bias adds.
        calls.append(partial(xp.add, target, inputs[2].reshape(1, -1), target))
    return calls


def _product(xp: Any, left: Any, right: Any, out: Any) -> Callable[[], Any]:
    """``left @ right`` into ``out``, as one zero-argument call.

    On the CPU ``np.dot`` goes straight to BLAS where ``np.matmul`` first passes the ufunc
    machinery: one row through 512x256 takes 6.3 instead of 8.2 µs. ``np.dot`` writes ``out``
    only when it is C-contiguous and exactly the result's dtype; otherwise ``matmul`` runs.
    """
    if (xp is np and out.flags.c_contiguous and out.dtype in (np.float32, np.float64)
            and left.dtype == right.dtype == out.dtype):
        return partial(np.dot, left, right, out)
    return gemm_bind.matmul_into(xp, left, right, out)


FULLY_CONNECTED = register(OpDef(
    name="FullyConnected",
    aliases=("_npx_fully_connected",),
    params=(
        Param("num_hidden", parse_int),
        Param("no_bias", parse_bool, False),
        Param("flatten", parse_bool, True),
    ),
    inputs=_inputs,
    infer_shape=_infer_shape,
    kernel=_kernel,
    writes_out=True,
    bind=_bind,
    scratch=lambda attrs, shapes, dtype: 0,  # none, but the bind takes the plan's workspace
    doc="Affine layer: output = data · weightᵀ + bias; flatten=True folds trailing axes.",
))
