"""MXNet's ``_linalg_*`` operators over batches of matrices (the last two axes).

Products (``gemm``, ``gemm2``, ``syrk``, triangular ``trmm``/``trsm``) and the small dense
factorisations (``det``, ``inverse``, ``slogdet``, Cholesky ``potrf``/``potri``). All kernels use
``xp.matmul`` and ``xp.linalg``, which numpy and cupy share.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.kernels.workspace import uploaded
from engine.ops.attrs import parse_bool, parse_float, parse_int
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred


def _square(shape: MaybeShape, what: str) -> None:
    if shape is not None and (len(shape) < 2 or (shape[-1] and shape[-2]
                                                 and shape[-1] != shape[-2])):
        raise ShapeError(f"{what}: A must be a batch of square matrices; got {shape}")


def _t(matrix: Any) -> Any:
    return matrix.swapaxes(-1, -2)


def _alpha(attrs: Attrs, array: Any) -> Any:
    return array.dtype.type(attrs.alpha)


# --- gemm / gemm2 -----------------------------------------------------------------------------

def _product_shape(attrs: Attrs, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    axis = attrs.axis % len(a)
    rows = a[-1] if attrs.transpose_a else a[axis]
    inner_a = a[axis] if attrs.transpose_a else a[-1]
    inner_b = b[-1] if attrs.transpose_b else b[axis]
    cols = b[axis] if attrs.transpose_b else b[-1]
    if inner_a and inner_b and inner_a != inner_b:
        raise ShapeError(f"linalg_gemm: A {a} and B {b} do not multiply (inner sizes "
                         f"{inner_a} and {inner_b})")
    out = list(a)
    out[axis], out[-1] = rows, cols
    return tuple(out)


def _gemm_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    a, b = shapes[0], shapes[1]
    if a is None or b is None:
        return shapes, [shapes[2] if len(shapes) == 3 else None]
    return shapes, [_product_shape(attrs, a, b)]


def _product(xp: Any, attrs: Attrs, a: Any, b: Any) -> Any:
    """``alpha * op(A) @ op(B)`` with the row axis at ``attrs.axis``."""
    a, b = xp.moveaxis(a, attrs.axis, -2), xp.moveaxis(b, attrs.axis, -2)
    result = xp.matmul(_t(a) if attrs.transpose_a else a, _t(b) if attrs.transpose_b else b)
    return xp.moveaxis(result * _alpha(attrs, result), -2, attrs.axis)


_PRODUCT_PARAMS = (Param("transpose_a", parse_bool, False),
                   Param("transpose_b", parse_bool, False),
                   Param("alpha", parse_float, 1.0))

register(OpDef(
    name="_linalg_gemm2",
    params=(*_PRODUCT_PARAMS, Param("axis", parse_int, -2)),
    inputs=("A", "B"),
    infer_shape=_gemm_infer,
    kernel=lambda xp, attrs, a, b: xp.ascontiguousarray(_product(xp, attrs, a, b)),
    doc="alpha * op(A) @ op(B) over batches of matrices (rows on axis).",
))
register(OpDef(
    name="_linalg_gemm",
    params=(*_PRODUCT_PARAMS, Param("beta", parse_float, 1.0), Param("axis", parse_int, -2)),
    inputs=("A", "B", "C"),
    infer_shape=_gemm_infer,
    kernel=lambda xp, attrs, a, b, c: xp.ascontiguousarray(
        _product(xp, attrs, a, b) + c * c.dtype.type(attrs.beta)),
    doc="alpha * op(A) @ op(B) + beta * C over batches of matrices.",
))


# --- syrk, trmm, trsm -------------------------------------------------------------------------

def _triangle(xp: Any, attrs: Attrs, a: Any) -> Any:
    """The triangle of A that ``lower`` selects, transposed when ``transpose``."""
    part = xp.tril(a) if attrs.lower else xp.triu(a)
    return _t(part) if attrs.transpose else part


def _trmm(xp: Any, attrs: Attrs, a: Any, b: Any) -> Any:
    op_a = _triangle(xp, attrs, a)
    result = xp.matmul(b, op_a) if attrs.rightside else xp.matmul(op_a, b)
    return result * _alpha(attrs, result)


def _trsm(xp: Any, attrs: Attrs, a: Any, b: Any) -> Any:
    op_a = _triangle(xp, attrs, a)
    scaled = b * _alpha(attrs, b)
    if attrs.rightside:  # X op(A) = B  <=>  op(A)^T X^T = B^T
        return xp.ascontiguousarray(_t(xp.linalg.solve(_t(op_a), _t(scaled))))
    return xp.linalg.solve(op_a, scaled)


# cupy.linalg calls cuSOLVER (and cuBLAS) through CuPy, which refuses them during stream capture.
CUPY_LINALG = "calls cupy.linalg, whose cuSOLVER and cuBLAS calls CuPy refuses during capture"

_TRIANGULAR_PARAMS = (Param("transpose", parse_bool, False), Param("rightside", parse_bool, False),
                      Param("lower", parse_bool, True), Param("alpha", parse_float, 1.0))
for _name, _kernel, _doc in (
    ("_linalg_trmm", _trmm, "alpha * op(A) @ B (or B @ op(A)) for triangular A."),
    ("_linalg_trsm", _trsm, "X solving op(A) X = alpha B (or X op(A) = alpha B), triangular A."),
):
    register(OpDef(name=_name, params=_TRIANGULAR_PARAMS, inputs=("A", "B"),
                   infer_shape=lambda attrs, shapes: (shapes, [shapes[1]]), kernel=_kernel,
                   uncapturable=CUPY_LINALG if _kernel is _trsm else "", doc=_doc))


def _syrk_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    a = shapes[0]
    if a is None:
        return shapes, [None]
    side = a[-1] if attrs.transpose else a[-2]
    return shapes, [(*a[:-2], side, side)]


def _syrk(xp: Any, attrs: Attrs, a: Any) -> Any:
    result = xp.matmul(_t(a), a) if attrs.transpose else xp.matmul(a, _t(a))
    return result * _alpha(attrs, result)


register(OpDef(
    name="_linalg_syrk",
    params=(Param("transpose", parse_bool, False), Param("alpha", parse_float, 1.0)),
    inputs=("A",),
    infer_shape=_syrk_infer,
    kernel=_syrk,
    doc="alpha * A @ A^T (or A^T @ A when transpose).",
))


# --- square-matrix functions ------------------------------------------------------------------

def _batch_shape(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    _square(shapes[0], "linalg")
    return shapes, [None if shapes[0] is None else shapes[0][:-2]]


def _same_square(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    _square(shapes[0], "linalg")
    return shapes, [shapes[0]]


def _potri(xp: Any, attrs: Attrs, factor: Any) -> Any:
    lower = xp.tril(factor)
    return xp.linalg.inv(xp.matmul(lower, _t(lower)))


def _slogdet(xp: Any, attrs: Attrs, a: Any) -> tuple[Any, Any]:
    sign, logabs = xp.linalg.slogdet(a)
    return sign.astype(a.dtype), logabs.astype(a.dtype)


_SQUARE: tuple[tuple[str, Callable[..., Any], Any, int, str], ...] = (
    ("_linalg_det", lambda xp, attrs, a: xp.linalg.det(a).astype(a.dtype), _batch_shape, 2,
     "Determinant of each matrix."),
    ("_linalg_inverse", lambda xp, attrs, a: xp.linalg.inv(a), _same_square, 0,
     "Inverse of each matrix."),
    ("_linalg_potrf", lambda xp, attrs, a: xp.linalg.cholesky(a), _same_square, 0,
     "Lower Cholesky factor L of each symmetric positive-definite A = L L^T."),
    ("_linalg_potri", _potri, _same_square, 0,
     "Inverse of L L^T from a lower Cholesky factor L."),
    ("_linalg_sumlogdiag",
     lambda xp, attrs, a: xp.log(xp.diagonal(a, axis1=-2, axis2=-1)).sum(axis=-1),
     _batch_shape, 0, "Sum of the logarithms of each matrix's diagonal."),
)
for _name, _kernel, _infer, _hidden, _doc in _SQUARE:
    register(OpDef(name=_name, inputs=("A",), infer_shape=_infer, kernel=_kernel,
                   hidden_outputs=_hidden, doc=_doc,
                   uncapturable="" if _name == "_linalg_sumlogdiag" else CUPY_LINALG))


def _slogdet_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    _, (batch,) = _batch_shape(attrs, shapes)
    return shapes, [batch, batch]


register(OpDef(
    name="_linalg_slogdet",
    inputs=("A",),
    outputs=("sign", "logdet"),
    hidden_outputs=2,
    infer_shape=_slogdet_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0], dtypes[0]]),
    kernel=_slogdet,
    uncapturable=CUPY_LINALG,
    doc="Sign and log-absolute value of each matrix's determinant.",
))


# --- diagonals --------------------------------------------------------------------------------

def _extractdiag_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    a = shapes[0]
    if a is None:
        return shapes, [None]
    length = max(min(a[-2] + min(attrs.offset, 0), a[-1] - max(attrs.offset, 0)), 0)
    return shapes, [(*a[:-2], length)]


def _makediag(xp: Any, attrs: Attrs, a: Any) -> Any:
    size = a.shape[-1] + abs(attrs.offset)
    out = xp.zeros((*a.shape[:-1], size, size), a.dtype)
    index = xp.arange(a.shape[-1])
    rows = index + max(-attrs.offset, 0)
    cols = index + max(attrs.offset, 0)
    out[..., rows, cols] = a
    return out


OFFSET = (Param("offset", parse_int, 0),)
register(OpDef(
    name="_linalg_extractdiag",
    params=OFFSET,
    inputs=("A",),
    infer_shape=_extractdiag_infer,
    kernel=lambda xp, attrs, a: xp.ascontiguousarray(
        xp.diagonal(a, offset=attrs.offset, axis1=-2, axis2=-1)),
    doc="The offset-th diagonal of each matrix.",
))
register(OpDef(
    name="_linalg_makediag",
    params=OFFSET,
    inputs=("A",),
    infer_shape=lambda attrs, shapes: (shapes, [None if shapes[0] is None else (
        *shapes[0][:-1], shapes[0][-1] + abs(attrs.offset), shapes[0][-1] + abs(attrs.offset))]),
    kernel=_makediag,
    doc="Square matrices with each vector on their offset-th diagonal.",
))


# --- triangles --------------------------------------------------------------------------------

def _triangle_index(attrs: Attrs, size: int) -> tuple[Any, Any]:
    """Row-major (rows, cols) of the band that offset/lower select in a size x size matrix."""
    if attrs.lower:
        return np.tril_indices(size, k=-abs(attrs.offset))
    return np.triu_indices(size, k=abs(attrs.offset))


def _maketrian_size(attrs: Attrs, count: int) -> int:
    band = int((math.isqrt(8 * count + 1) - 1) // 2)  # band * (band + 1) / 2 == count
    if band * (band + 1) // 2 != count:
        raise ShapeError(f"linalg_maketrian: {count} values do not fill a triangle")
    return band + abs(attrs.offset)


def _device_triangle_index(xp: Any, attrs: Attrs, size: int) -> tuple[Any, Any]:
    """`_triangle_index` on ``xp``'s device, uploaded once per band (see `uploaded`)."""
    return uploaded(xp, ("triangle", attrs.lower, attrs.offset, size),
                    lambda: _triangle_index(attrs, size))


def _extracttrian(xp: Any, attrs: Attrs, a: Any) -> Any:
    rows, cols = _device_triangle_index(xp, attrs, a.shape[-1])
    return a[..., rows, cols]


def _maketrian(xp: Any, attrs: Attrs, a: Any) -> Any:
    size = _maketrian_size(attrs, a.shape[-1])
    rows, cols = _device_triangle_index(xp, attrs, size)
    out = xp.zeros((*a.shape[:-1], size, size), a.dtype)
    out[..., rows, cols] = a
    return out


_TRIANGLE_PARAMS = (Param("offset", parse_int, 0), Param("lower", parse_bool, True))
register(OpDef(
    name="_linalg_extracttrian",
    params=_TRIANGLE_PARAMS,
    inputs=("A",),
    infer_shape=lambda attrs, shapes: (shapes, [None if shapes[0] is None else (
        *shapes[0][:-2], len(_triangle_index(attrs, shapes[0][-1])[0]))]),
    kernel=_extracttrian,
    doc="The lower (or upper) triangle beyond offset of each matrix, row by row.",
))
register(OpDef(
    name="_linalg_maketrian",
    params=_TRIANGLE_PARAMS,
    inputs=("A",),
    infer_shape=lambda attrs, shapes: (shapes, [None if shapes[0] is None else (
        *shapes[0][:-1], *(_maketrian_size(attrs, shapes[0][-1]),) * 2)]),
    kernel=_maketrian,
    doc="Triangular matrices filled row by row from vectors (inverse of extracttrian).",
))
register(OpDef(
    name="_npi_cholesky",
    inputs=("A",),
    infer_shape=_same_square,
    kernel=lambda xp, attrs, a: xp.linalg.cholesky(a),
    uncapturable=CUPY_LINALG,
    doc="Lower Cholesky factor (NumPy mode).",
))
register(OpDef(
    name="_npi_solve",
    inputs=("A", "B"),
    hidden_outputs=0,
    infer_shape=lambda attrs, shapes: (shapes, [shapes[1]]),
    kernel=lambda xp, attrs, a, b: xp.linalg.solve(a, b),
    uncapturable=CUPY_LINALG,
    doc="X solving A X = B (NumPy mode).",
))
