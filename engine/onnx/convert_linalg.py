"""Converters for matrix products, diagonals and triangles, Einsum and tensordot.

Diagonal and triangle extraction is a fixed selection of a matrix's entries, so it is written
as a Gather of precomputed flat positions; building a matrix from a vector is the linear map
that the op's own kernel gives on a basis, written as one MatMul.
"""

from __future__ import annotations

import string

import numpy as np

from engine.onnx.context import NodeContext, converts, normalize_axis


def _to_matrix_axes(ctx: NodeContext, data: str, rank: int, first: int, second: int) -> str:
    """``data`` with axes ``first`` and ``second`` moved to the end, in that order."""
    rest = [axis for axis in range(rank) if axis not in (first, second)]
    if rest + [first, second] == list(range(rank)):
        return data
    return ctx.op("Transpose", [data], perm=[*rest, first, second])


def _select(ctx: NodeContext, data: str, rows: int, columns: int, positions: np.ndarray) -> str:
    """The entries at flat ``positions`` of the trailing ``(rows, columns)`` matrices."""
    flat = ctx.op("Reshape", [data, ctx.op("Concat", [
        ctx.op("Shape", [data], end=-2), ctx.ints([rows * columns])], axis=0)])
    return ctx.op("Gather", [flat, ctx.builder.const(positions.astype(np.int64),
                                                     f"{ctx.hint}_positions")], axis=-1)


def _diagonal(ctx: NodeContext, offset: int, first: int, second: int) -> str:
    rank = ctx.rank()
    first, second = normalize_axis(first, rank), normalize_axis(second, rank)
    rows, columns = ctx.static_dim(0, first), ctx.static_dim(0, second)
    matrices = _to_matrix_axes(ctx, ctx.inputs[0], rank, first, second)
    positions = np.diagonal(np.arange(rows * columns).reshape(rows, columns), offset)
    return _select(ctx, matrices, rows, columns, positions)


def _by_basis(ctx: NodeContext, size: int) -> str:
    """The op's linear map from vectors of ``size`` to matrices, as one MatMul."""
    basis = np.asarray(ctx.node.opdef.kernel(np, ctx.params, np.eye(size, dtype=ctx.in_dtypes[0])))
    matrix = ctx.builder.const(basis.reshape(size, -1), f"{ctx.hint}_basis")
    product = ctx.op("MatMul", [ctx.inputs[0], matrix])
    return ctx.op("Reshape", [product, ctx.op("Concat", [
        ctx.op("Shape", [ctx.inputs[0]], end=-1), ctx.ints(basis.shape[1:])], axis=0)])


@converts("diag")
def diag(ctx: NodeContext) -> str:
    if ctx.rank() == 1:
        return _vector_on_diagonal(ctx, ctx.inputs[0], int(ctx.params.k))
    return _diagonal(ctx, int(ctx.params.k), ctx.params.axis1, ctx.params.axis2)


@converts("_np_diagonal", "_np_trace")
def np_diagonal(ctx: NodeContext) -> str:
    params = ctx.params
    diagonal = _diagonal(ctx, int(params.offset), params.axis1, params.axis2)
    if ctx.op_name == "_np_diagonal":
        return diagonal
    return ctx.reduce("ReduceSum", diagonal, [-1], False)


@converts("_np_diagflat")
def np_diagflat(ctx: NodeContext) -> str:
    flat = ctx.op("Reshape", [ctx.inputs[0], ctx.ints([-1])])
    return _vector_on_diagonal(ctx, flat, int(ctx.params.k))


def _vector_on_diagonal(ctx: NodeContext, vector: str, offset: int) -> str:
    """A 1-D vector placed on diagonal ``offset`` of a zero matrix (one MatMul with 0/1)."""
    size = int(np.prod(ctx.in_shapes[0]))
    basis = np.stack([np.diag(row, offset) for row in np.eye(size)])
    matrix = ctx.builder.const(basis.reshape(size, -1).astype(ctx.in_dtypes[0]),
                               f"{ctx.hint}_basis")
    return ctx.op("Reshape", [ctx.op("MatMul", [vector, matrix]), ctx.ints(ctx.out_shapes[0])])


@converts("_linalg_extractdiag")
def extractdiag(ctx: NodeContext) -> str:
    return _diagonal(ctx, int(ctx.params.offset), -2, -1)


@converts("_linalg_sumlogdiag")
def sumlogdiag(ctx: NodeContext) -> str:
    diagonal = _diagonal(ctx, 0, -2, -1)
    return ctx.reduce("ReduceSum", ctx.op("Log", [diagonal]), [-1], False)


@converts("_linalg_extracttrian")
def extracttrian(ctx: NodeContext) -> str:
    rows, columns = ctx.in_shapes[0][-2:]
    index = np.arange(rows * columns, dtype=np.float64).reshape(rows, columns)
    positions = np.asarray(ctx.node.opdef.kernel(np, ctx.params, index)).round()
    return _select(ctx, ctx.inputs[0], rows, columns, positions.astype(np.int64))


@converts("_linalg_makediag", "_linalg_maketrian")
def make_matrix(ctx: NodeContext) -> str:
    return _by_basis(ctx, ctx.in_shapes[0][-1])


@converts("_linalg_det")
def det(ctx: NodeContext) -> str:
    return ctx.op("Det", [ctx.inputs[0]])


def _swap_last(ctx: NodeContext, data: str, rank: int) -> str:
    perm = list(range(rank))
    perm[-2:] = perm[-1], perm[-2]
    return ctx.op("Transpose", [data], perm=perm)


def _rows_axis_last_but_one(ctx: NodeContext, data: str, rank: int) -> str:
    """Move MXNet's ``axis`` (the matrix rows) to ``-2``; the same Transpose moves it back."""
    axis = normalize_axis(ctx.params.axis, rank)
    if axis == rank - 2:
        return data
    perm = list(range(rank))
    perm[axis], perm[rank - 2] = perm[rank - 2], perm[axis]
    return ctx.op("Transpose", [data], perm=perm)


def _product(ctx: NodeContext) -> str:
    rank = ctx.rank()
    lhs, rhs = (_rows_axis_last_but_one(ctx, name, rank) for name in ctx.inputs[:2])
    if ctx.params.transpose_a:
        lhs = _swap_last(ctx, lhs, rank)
    if ctx.params.transpose_b:
        rhs = _swap_last(ctx, rhs, rank)
    return ctx.op("Mul", [ctx.op("MatMul", [lhs, rhs]), ctx.scalar(ctx.params.alpha)])


@converts("_linalg_gemm2")
def gemm2(ctx: NodeContext) -> str:
    return _rows_axis_last_but_one(ctx, _product(ctx), ctx.rank())


@converts("_linalg_gemm")
def gemm(ctx: NodeContext) -> str:
    addend = _rows_axis_last_but_one(ctx, ctx.inputs[2], ctx.rank())
    total = ctx.op("Add", [_product(ctx), ctx.op("Mul", [addend, ctx.scalar(ctx.params.beta)])])
    return _rows_axis_last_but_one(ctx, total, ctx.rank())


@converts("_linalg_syrk")
def syrk(ctx: NodeContext) -> str:
    data, rank = ctx.inputs[0], ctx.rank()
    pair = [_swap_last(ctx, data, rank), data] if ctx.params.transpose else [
        data, _swap_last(ctx, data, rank)]
    return ctx.op("Mul", [ctx.op("MatMul", pair), ctx.scalar(ctx.params.alpha)])


@converts("_linalg_trmm")
def trmm(ctx: NodeContext) -> str:
    params, rank = ctx.params, ctx.rank()
    triangle = ctx.op("Trilu", [ctx.inputs[0]], upper=int(not params.lower))
    if params.transpose:
        triangle = _swap_last(ctx, triangle, rank)
    pair = [ctx.inputs[1], triangle] if params.rightside else [triangle, ctx.inputs[1]]
    return ctx.op("Mul", [ctx.op("MatMul", pair), ctx.scalar(params.alpha)])


@converts("_npi_einsum")
def einsum(ctx: NodeContext) -> str:
    equation = ctx.params.subscripts.replace(" ", "")
    if "->" not in equation:  # NumPy's implicit output: the letters seen once, sorted
        letters = equation.replace(",", "")
        equation += "->" + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    return ctx.op("Einsum", ctx.inputs, equation=equation)


@converts("_npi_tensordot", "_npi_tensordot_int_axes")
def tensordot(ctx: NodeContext) -> str:
    lhs_rank, rhs_rank = ctx.rank(0), ctx.rank(1)
    if ctx.op_name == "_npi_tensordot_int_axes":
        count = int(ctx.params.axes)
        lhs_axes, rhs_axes = list(range(lhs_rank - count, lhs_rank)), list(range(count))
    else:
        lhs_axes = [normalize_axis(a, lhs_rank) for a in _tuple(ctx.params.a_axes_summed)]
        rhs_axes = [normalize_axis(a, rhs_rank) for a in _tuple(ctx.params.b_axes_summed)]
    letters = iter(string.ascii_lowercase)
    lhs = [next(letters) for _ in range(lhs_rank)]
    rhs = [next(letters) for _ in range(rhs_rank)]
    for left, right in zip(lhs_axes, rhs_axes):
        rhs[right] = lhs[left]
    kept = [c for k, c in enumerate(lhs) if k not in lhs_axes] + [
        c for k, c in enumerate(rhs) if k not in rhs_axes]
    equation = f"{''.join(lhs)},{''.join(rhs)}->{''.join(kept)}"
    return ctx.op("Einsum", ctx.inputs[:2], equation=equation)


def _tuple(value: object) -> tuple:
    return value if isinstance(value, tuple) else (value,)
