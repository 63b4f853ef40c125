"""Matrix factorisations and their relatives: ``_linalg_gelqf``/``_linalg_syevd`` and the
NumPy-mode ``eig``/``eigh``/``eigvals``/``eigvalsh``, ``svd``, ``pinv``, ``tensorinv`` and
``tensorsolve``.

Factors are unique only up to signs; MXNet fixes them, and so do these kernels: ``syevd`` and
``eigh`` make each eigenvector's largest-magnitude entry positive, ``svd`` each right singular
vector's (flipping the matching left one). ``gelqf`` takes LAPACK's own signs, which a QR
factorisation of the transpose reproduces. ``eig`` keeps LAPACK's eigenvector scaling as MXNet
does (it accepts only real spectra).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import choice, parse_bool, parse_float, parse_int, parse_int_tuple
from engine.ops.dtypes import FLOAT32
from engine.ops.math.linalg import CUPY_LINALG
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred, broadcast


def _t(matrix: Any) -> Any:
    return matrix.swapaxes(-1, -2)


def _float_dtype(dtype: np.dtype | None) -> np.dtype | None:
    """Float inputs keep their dtype; others give float32 (LAPACK works in floats)."""
    if dtype is None:
        return None
    return np.dtype(dtype) if np.dtype(dtype).kind == "f" else FLOAT32


def _float_outputs(count: int) -> Any:
    return lambda attrs, dtypes: (dtypes, [_float_dtype(dtypes[0])] * count)


def _square(shape: MaybeShape, what: str) -> None:
    if shape is not None and (len(shape) < 2 or (shape[-1] and shape[-2]
                                                 and shape[-1] != shape[-2])):
        raise ShapeError(f"{what}: A must be a batch of square matrices; got {shape}")


def _wide(shape: MaybeShape, what: str) -> None:
    if shape is not None and (len(shape) < 2 or (shape[-1] and shape[-2]
                                                 and shape[-2] > shape[-1])):
        raise ShapeError(f"{what}: A must be a batch of matrices with rows <= columns "
                         f"(shape (..., m, n), m <= n); got {shape}")


def _positive_largest(rows: Any, xp: Any) -> Any:
    """+1 or -1 per row: the sign that makes the row's largest-magnitude entry positive
    (the first one on ties, as MXNet's scan finds it)."""
    largest = xp.argmax(xp.abs(rows), axis=-1)[..., None]
    picked = xp.take_along_axis(rows, largest, axis=-1)
    return xp.where(picked < 0, rows.dtype.type(-1), rows.dtype.type(1))


# --- gelqf and syevd (legacy linalg) ----------------------------------------------------------

def _gelqf_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    a = shapes[0]
    _wide(a, "linalg_gelqf")
    return shapes, [a, None if a is None else (*a[:-1], a[-2])]


def _gelqf(xp: Any, attrs: Attrs, a: Any) -> tuple[Any, Any]:
    """A = L Q from A^T = Q' R: Q = Q'^T, L = R^T (Householder signs, as LAPACK's gelqf)."""
    q, r = xp.linalg.qr(_t(a))
    return xp.ascontiguousarray(_t(q)).astype(a.dtype), xp.ascontiguousarray(_t(r)).astype(
        a.dtype)


register(OpDef(
    name="_linalg_gelqf",
    aliases=("linalg_gelqf",),
    inputs=("A",),
    outputs=("Q", "L"),
    infer_shape=_gelqf_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0], dtypes[0]]),
    kernel=_gelqf,
    uncapturable=CUPY_LINALG,
    doc="LQ factorisation A = L Q of matrices with rows <= columns (outputs Q, L).",
))


def _eigen_infer(vectors_first: bool) -> Any:
    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        a = shapes[0]
        _square(a, "eigendecomposition")
        values = None if a is None else a[:-1]
        return shapes, [a, values] if vectors_first else [values, a]

    return infer


def _symmetric_eigen(xp: Any, a: Any, uplo: str) -> tuple[Any, Any]:
    """Ascending eigenvalues and eigenvectors as rows, each row's largest entry positive."""
    values, vectors = xp.linalg.eigh(a, UPLO=uplo)
    rows = _t(vectors)
    return values, rows * _positive_largest(rows, xp)


def _syevd(xp: Any, attrs: Attrs, a: Any) -> tuple[Any, Any]:
    values, rows = _symmetric_eigen(xp, a, "L")
    return xp.ascontiguousarray(rows).astype(a.dtype), values.astype(a.dtype)


register(OpDef(
    name="_linalg_syevd",
    inputs=("A",),
    outputs=("U", "L"),
    infer_shape=_eigen_infer(vectors_first=True),
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0], dtypes[0]]),
    kernel=_syevd,
    uncapturable=CUPY_LINALG,
    doc="Symmetric eigendecomposition U A = diag(L) U (eigenvectors as rows, L ascending).",
))


# --- NumPy-mode eigen solvers -----------------------------------------------------------------

def _eig(xp: Any, attrs: Attrs, a: Any) -> tuple[Any, Any]:
    # CuPy's eig always answers in complex numbers; MXNet refuses complex spectra, so the
    # real parts are the whole answer.
    values, vectors = xp.linalg.eig(a)
    dtype = _float_dtype(a.dtype)
    return xp.real(values).astype(dtype), xp.ascontiguousarray(xp.real(vectors)).astype(dtype)


def _eigh(xp: Any, attrs: Attrs, a: Any) -> tuple[Any, Any]:
    values, rows = _symmetric_eigen(xp, a, attrs.UPLO)
    dtype = _float_dtype(a.dtype)
    return values.astype(dtype), xp.ascontiguousarray(_t(rows)).astype(dtype)


_UPLO = (Param("UPLO", choice("L", "U"), "L"),)
for _name, _params, _kernel, _doc in (
    ("_npi_eig", (), _eig, "Eigenvalues w and right eigenvectors v (columns) of real spectra."),
    ("_npi_eigh", _UPLO, _eigh,
     "Eigenvalues (ascending) and eigenvectors (columns) of symmetric matrices, read from "
     "the UPLO triangle."),
):
    register(OpDef(name=_name, params=_params, inputs=("A",), outputs=("w", "v"),
                   infer_shape=_eigen_infer(vectors_first=False),
                   infer_dtype=_float_outputs(2), kernel=_kernel, uncapturable=CUPY_LINALG,
                   doc=_doc))


def _values_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    _square(shapes[0], "eigvals")
    return shapes, [None if shapes[0] is None else shapes[0][:-1]]


register(OpDef(
    name="_npi_eigvals",
    inputs=("A",),
    infer_shape=_values_infer,
    infer_dtype=_float_outputs(1),
    kernel=lambda xp, attrs, a: xp.real(xp.linalg.eigvals(a)).astype(_float_dtype(a.dtype)),
    uncapturable=CUPY_LINALG,
    doc="Eigenvalues of matrices with real spectra.",
))
register(OpDef(
    name="_npi_eigvalsh",
    params=_UPLO,
    inputs=("A",),
    infer_shape=_values_infer,
    infer_dtype=_float_outputs(1),
    kernel=lambda xp, attrs, a: xp.linalg.eigvalsh(a, UPLO=attrs.UPLO).astype(
        _float_dtype(a.dtype)),
    uncapturable=CUPY_LINALG,
    doc="Eigenvalues (ascending) of symmetric matrices, read from the UPLO triangle.",
))


# --- svd and pinv -----------------------------------------------------------------------------

def _svd_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    a = shapes[0]
    _wide(a, "_npi_svd")
    if a is None:
        return shapes, [None, None, None]
    return shapes, [(*a[:-1], a[-2]), a[:-1], a]


def _svd(xp: Any, attrs: Attrs, a: Any) -> tuple[Any, Any, Any]:
    """(UT, L, V) with A = UT diag(L) V; each row of V has its largest entry positive."""
    u, values, v = xp.linalg.svd(a, full_matrices=False)
    signs = _positive_largest(v, xp)
    return (xp.ascontiguousarray(u * _t(signs)).astype(a.dtype), values.astype(a.dtype),
            xp.ascontiguousarray(v * signs).astype(a.dtype))


register(OpDef(
    name="_npi_svd",
    inputs=("A",),
    outputs=("UT", "L", "V"),
    infer_shape=_svd_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]] * 3),
    kernel=_svd,
    uncapturable=CUPY_LINALG,
    doc="Singular value decomposition A = UT diag(L) V of matrices with rows <= columns.",
))


def _pinv_of(xp: Any, a: Any, rcond: Any) -> Any:
    """Pseudo-inverse: singular values at most ``rcond`` times the largest are dropped."""
    u, values, v = xp.linalg.svd(a, full_matrices=False)
    cutoff = rcond[..., None] * values.max(axis=-1, keepdims=True)
    kept = values > cutoff
    inverse = xp.where(kept, 1 / xp.where(kept, values, 1), 0).astype(values.dtype)
    return xp.ascontiguousarray(xp.matmul(_t(v) * inverse[..., None, :], _t(u))).astype(a.dtype)


def _pinv_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    a = shapes[0]
    if a is None or len(a) < 2:
        return shapes, [None]
    rcond = shapes[1] if len(shapes) > 1 else ()
    if rcond is not None and all(rcond) and all(a) and len(rcond) > len(a) - 2:
        raise ShapeError(f"_npi_pinv: rcond of shape {rcond} must broadcast to A's batch "
                         f"shape {a[:-2]}")
    if rcond is not None and all(rcond) and all(a):
        broadcast(a[:-2], rcond)
    return shapes, [(*a[:-2], a[-1], a[-2])]


_HERMITIAN = Param("hermitian", parse_bool, False)
register(OpDef(
    name="_npi_pinv",
    params=(_HERMITIAN,),
    inputs=("A", "rcond"),
    infer_shape=_pinv_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=lambda xp, attrs, a, rcond: _pinv_of(xp, a, rcond.astype(a.dtype)),
    uncapturable=CUPY_LINALG,
    doc="Moore-Penrose pseudo-inverse, cutting singular values below rcond (per matrix).",
))
register(OpDef(
    name="_npi_pinv_scalar_rcond",
    params=(Param("rcond", parse_float, 1e-15), _HERMITIAN),
    inputs=("A",),
    infer_shape=_pinv_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=lambda xp, attrs, a: _pinv_of(xp, a, np.asarray(attrs.rcond, a.dtype)[()]),
    uncapturable=CUPY_LINALG,
    doc="Moore-Penrose pseudo-inverse, cutting singular values below rcond.",
))


# --- tensorinv and tensorsolve ----------------------------------------------------------------

def _tensorinv_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    a = shapes[0]
    if a is None or not all(a):
        return shapes, [None]
    front, back = a[:attrs.ind], a[attrs.ind:]
    if attrs.ind <= 0 or math.prod(front) != math.prod(back):
        raise ShapeError(f"_npi_tensorinv: a {a} must be square with ind={attrs.ind}: "
                         f"prod(a.shape[:ind]) == prod(a.shape[ind:])")
    return shapes, [(*back, *front)]


def _tensorinv(xp: Any, attrs: Attrs, a: Any) -> Any:
    front, back = a.shape[:attrs.ind], a.shape[attrs.ind:]
    inverse = xp.linalg.inv(a.reshape(math.prod(front), math.prod(back)))
    return inverse.reshape(*back, *front).astype(_float_dtype(a.dtype))


register(OpDef(
    name="_npi_tensorinv",
    params=(Param("ind", parse_int, 2),),
    inputs=("a",),
    infer_shape=_tensorinv_infer,
    infer_dtype=_float_outputs(1),
    kernel=_tensorinv,
    uncapturable=CUPY_LINALG,
    doc="Inverse of a tensor seen as a square matrix (first ind axes against the rest).",
))


def _solve_order(attrs: Attrs, ndim: int) -> list[int]:
    """a's axes with ``a_axes`` moved to the end, in that order (as NumPy's tensorsolve)."""
    order = list(range(ndim))
    for axis in attrs.a_axes:
        order.remove(axis % ndim)
        order.append(axis % ndim)
    return order


def _tensorsolve_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    a, b = shapes
    if a is None or b is None:
        return shapes, [None]
    moved = tuple(a[axis] for axis in _solve_order(attrs, len(a)))
    solution = moved[len(b):]
    if all(moved) and all(b) and (moved[:len(b)] != tuple(b)
                                  or math.prod(solution) != math.prod(b)):
        raise ShapeError(f"_npi_tensorsolve: a {a} (axes moved: {moved}) must start with "
                         f"b's shape {b} and be square (prod of the rest == prod of b)")
    return shapes, [solution]


def _tensorsolve(xp: Any, attrs: Attrs, a: Any, b: Any) -> Any:
    moved = a.transpose(_solve_order(attrs, a.ndim))
    solution = moved.shape[b.ndim:]
    matrix = moved.reshape(b.size, math.prod(solution))
    return xp.linalg.solve(matrix, b.reshape(b.size, 1)).reshape(solution).astype(
        _float_dtype(a.dtype))


register(OpDef(
    name="_npi_tensorsolve",
    params=(Param("a_axes", parse_int_tuple, ()),),
    inputs=("a", "b"),
    infer_shape=_tensorsolve_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [_float_dtype(dtypes[0])]),
    kernel=_tensorsolve,
    uncapturable=CUPY_LINALG,
    doc="x solving tensordot(a, x, x.ndim) = b (a_axes moved to the end of a first).",
))
