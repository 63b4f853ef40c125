"""Products and sums: ``dot``, ``batch_dot``, NumPy-mode ``matmul`` and ``dot``, ``add_n``."""

from __future__ import annotations

from typing import Any

from engine.errors import ShapeError
from engine.ops.attrs import (
    choice,
    optional,
    parse_bool,
    parse_int,
)
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, Shape, register
from engine.ops.shapes import Inferred, broadcast, merge, same_shape


def _dot_split(shape: Shape, transpose: bool, left: bool) -> tuple[Shape, int]:
    """(kept dims, contracted size) of one dot operand, as MXNet views N-D operands."""
    if len(shape) == 1:
        return (), shape[0]
    if left != transpose:
        return shape[:-1], shape[-1]
    return shape[1:], shape[0]


def _dot_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    lhs, rhs = shapes
    if lhs is None or rhs is None:
        return shapes, [None]
    if len(lhs) == 1 and len(rhs) == 1:
        if attrs.transpose_a or attrs.transpose_b:
            raise ShapeError("dot of two vectors takes no transpose")
        merge(lhs, rhs, "dot vector lengths")
        return shapes, [(1,)]
    kept_lhs, inner_lhs = _dot_split(lhs, attrs.transpose_a, True)
    kept_rhs, inner_rhs = _dot_split(rhs, attrs.transpose_b, False)
    if inner_lhs and inner_rhs and inner_lhs != inner_rhs:
        raise ShapeError(f"dot: lhs {lhs} and rhs {rhs} do not contract "
                         f"(transpose_a={attrs.transpose_a}, transpose_b={attrs.transpose_b})")
    return shapes, [(*kept_lhs, *kept_rhs)]


def _dot_kernel(xp: Any, attrs: Attrs, lhs: Any, rhs: Any) -> Any:
    if lhs.ndim == 1 and rhs.ndim == 1:
        return xp.dot(lhs, rhs).reshape(1)
    if attrs.transpose_a:
        left = lhs.reshape(lhs.shape[0], -1).T
    else:
        left = lhs.reshape(-1, lhs.shape[-1])
    if attrs.transpose_b:
        right = rhs.reshape(-1, rhs.shape[-1]).T
    else:
        right = rhs.reshape(rhs.shape[0], -1)
    if left.shape[1] != right.shape[0]:
        raise ShapeError(f"dot: lhs {lhs.shape} and rhs {rhs.shape} do not contract")
    _, (shape,) = _dot_infer(attrs, [lhs.shape, rhs.shape])
    return xp.matmul(left, right).reshape(shape)


_PRODUCT_PARAMS = (
    Param("transpose_a", parse_bool, False),
    Param("transpose_b", parse_bool, False),
    Param("forward_stype", optional(choice("default", "row_sparse", "csr")), None),
)

register(OpDef(
    name="dot",
    params=_PRODUCT_PARAMS,
    inputs=("lhs", "rhs"),
    infer_shape=_dot_infer,
    kernel=_dot_kernel,
    doc="Dot product: contracts lhs's last axis (first if transpose_a) with rhs's first.",
))


def _batch_dot_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    lhs, rhs = shapes
    if lhs is None or rhs is None:
        return shapes, [None]
    if len(lhs) < 3 or len(lhs) != len(rhs):
        raise ShapeError(f"batch_dot needs operands of equal rank >= 3, got {lhs} and {rhs}")
    batch = merge(lhs[:-2], rhs[:-2], "batch_dot batch dimensions")
    rows, inner_lhs = (lhs[-1], lhs[-2]) if attrs.transpose_a else (lhs[-2], lhs[-1])
    inner_rhs, cols = (rhs[-1], rhs[-2]) if attrs.transpose_b else (rhs[-2], rhs[-1])
    if inner_lhs and inner_rhs and inner_lhs != inner_rhs:
        raise ShapeError(f"batch_dot: lhs {lhs} and rhs {rhs} do not contract")
    assert batch is not None
    return [(*batch, *lhs[-2:]), (*batch, *rhs[-2:])], [(*batch, rows, cols)]


def _batch_dot_kernel(xp: Any, attrs: Attrs, lhs: Any, rhs: Any) -> Any:
    left = xp.swapaxes(lhs, -1, -2) if attrs.transpose_a else lhs
    right = xp.swapaxes(rhs, -1, -2) if attrs.transpose_b else rhs
    return xp.matmul(left, right)


register(OpDef(
    name="batch_dot",
    params=_PRODUCT_PARAMS,
    inputs=("lhs", "rhs"),
    infer_shape=_batch_dot_infer,
    kernel=_batch_dot_kernel,
    doc="Matrix products over leading batch axes (the last two axes, optionally transposed).",
))


def _broadcast_partial(first: Shape, second: Shape) -> Shape:
    """Broadcast two shapes where 0 is an unknown dimension (unknown against 1 stays unknown)."""
    if all(first) and all(second):
        return broadcast(first, second)
    length = max(len(first), len(second))
    padded_a = (1,) * (length - len(first)) + tuple(first)
    padded_b = (1,) * (length - len(second)) + tuple(second)
    result = []
    for x, y in zip(padded_a, padded_b, strict=True):
        if x and y and x != y and 1 not in (x, y):
            raise ShapeError(f"shapes {first} and {second} do not broadcast")
        result.append(x if y == 1 else y if x == 1 else (x or y))
    return tuple(result)


def _matmul_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    a, b = shapes
    if a is None or b is None:
        return shapes, [None]
    if not a or not b:
        raise ShapeError("matmul does not take scalars")
    left = (1, *a) if len(a) == 1 else a
    right = (*b, 1) if len(b) == 1 else b
    if left[-1] and right[-2] and left[-1] != right[-2]:
        raise ShapeError(f"matmul: {a} and {b} do not contract")
    batch = _broadcast_partial(left[:-2], right[:-2])
    rows = left[-2:-1] if len(a) > 1 else ()
    cols = right[-1:] if len(b) > 1 else ()
    return shapes, [(*batch, *rows, *cols)]


register(OpDef(
    name="_npi_matmul",
    inputs=("a", "b"),
    infer_shape=_matmul_infer,
    kernel=lambda xp, attrs, a, b: xp.matmul(a, b),
    doc="NumPy matmul (broadcast batch axes; 1-D operands are promoted and dropped).",
))


def _np_dot_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    a, b = shapes
    if a is None or b is None:
        return shapes, [None]
    if not a or not b:
        return shapes, [b if not a else a]
    inner_b = b[0] if len(b) == 1 else b[-2]
    if a[-1] and inner_b and a[-1] != inner_b:
        raise ShapeError(f"dot: {a} and {b} do not contract")
    kept_b = () if len(b) == 1 else (*b[:-2], b[-1])
    return shapes, [(*a[:-1], *kept_b)]


register(OpDef(
    name="_np_dot",
    inputs=("a", "b"),
    infer_shape=_np_dot_infer,
    kernel=lambda xp, attrs, a, b: xp.asarray(xp.dot(a, b)),
    doc="NumPy dot: a's last axis against b's second-to-last (or only) axis.",
))


def _add_n_kernel(xp: Any, attrs: Attrs, *arrays: Any, out: Any = None) -> Any:
    if out is None:
        out = arrays[0].copy()
    else:
        xp.copyto(out, arrays[0], casting="unsafe")
    for array in arrays[1:]:
        out += array
    return out


register(OpDef(
    name="add_n",
    aliases=("ElementWiseSum",),
    params=(Param("num_args", parse_int),),
    inputs=lambda attrs: tuple(f"arg{index}" for index in range(attrs.num_args)),
    infer_shape=same_shape,
    kernel=_add_n_kernel,
    writes_out=True,
    doc="Elementwise sum of num_args arrays of one shape.",
))
