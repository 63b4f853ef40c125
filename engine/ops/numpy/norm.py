"""NumPy-mode ``norm`` (``_npi_norm``), as MXNet's front end calls it.

MXNet's Python ``np.linalg.norm`` picks ``flag`` from ``ord``: -2 flattens everything into one
L2 norm, 1 is the Frobenius norm, 2 the nuclear norm, 0 a spectral norm (``ord`` ±2) and -1 the
plain ``ord``. One axis gives vector p-norms (zeros are skipped, so negative orders stay finite,
and order 0 counts non-zeros); two axes give matrix norms: Frobenius, nuclear, largest or
smallest singular value, or the largest (``ord`` > 0) or smallest absolute column sums (``ord``
±1) or row sums (other orders). The op has three more outputs MXNet never exposes.
"""

from __future__ import annotations

from typing import Any

from engine.errors import ShapeError
from engine.ops.attrs import optional, parse_bool, parse_float, parse_int, parse_int_tuple
from engine.ops.math.linalg import CUPY_LINALG
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred

FLATTENED, FROBENIUS, NUCLEAR = -2, 1, 2


def norm_axes(attrs: Attrs, ndim: int) -> tuple[int, ...] | None:
    """The reduced axes (non-negative), or None for the flattened norm."""
    if attrs.flag == FLATTENED and attrs.axis is None:
        return None
    if attrs.axis is None:
        return (ndim - 2, ndim - 1) if ndim >= 2 else (max(ndim - 1, 0),)
    if len(attrs.axis) > 2:
        raise ShapeError(f"_npi_norm: axis {attrs.axis} has more than two axes")
    if any(not -ndim <= axis < max(ndim, 1) for axis in attrs.axis):
        raise ShapeError(f"_npi_norm: axis {attrs.axis} is out of range for {ndim} dimensions")
    axes = tuple(axis % ndim if ndim else 0 for axis in attrs.axis)
    if len(axes) == 2 and axes[0] == axes[1]:
        raise ShapeError(f"_npi_norm: axis {attrs.axis} names one axis twice")
    return axes


def _norm_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    shape = shapes[0]
    if shape is None:
        return shapes, [None]
    axes = norm_axes(attrs, len(shape))
    reduced = range(len(shape)) if axes is None else axes
    if attrs.keepdims:
        return shapes, [tuple(1 if k in reduced else size for k, size in enumerate(shape))]
    return shapes, [tuple(size for k, size in enumerate(shape) if k not in reduced)]


def _vector_norm(xp: Any, x: Any, order: float, axis: tuple[int, ...], keepdims: bool) -> Any:
    magnitude = xp.abs(x)
    nonzero = magnitude != 0
    if order == 0:
        return nonzero.sum(axis=axis, keepdims=keepdims).astype(x.dtype)
    powered = xp.where(nonzero, xp.where(nonzero, magnitude, 1) ** order, 0)
    total = powered.sum(axis=axis, keepdims=keepdims)
    safe = xp.where(total != 0, total, 1)
    return xp.where(total != 0, safe ** (1.0 / order), 0).astype(x.dtype)


def _matrix_norm(xp: Any, attrs: Attrs, x: Any, axes: tuple[int, ...]) -> Any:
    if attrs.flag == FROBENIUS:
        return xp.sqrt((x * x).sum(axis=axes, keepdims=attrs.keepdims))
    if attrs.ord not in (2, -2):
        summed = 0 if attrs.ord in (1, -1) else 1
        sums = xp.abs(x).sum(axis=axes[summed], keepdims=True)
        pick = xp.max if attrs.ord > 0 else xp.min
        return pick(sums, axis=axes, keepdims=attrs.keepdims)
    matrices = xp.moveaxis(x, axes, (-2, -1))
    values = xp.linalg.svd(matrices, compute_uv=False)
    if attrs.flag == NUCLEAR:
        result = values.sum(axis=-1)
    else:
        result = values.max(axis=-1) if attrs.ord > 0 else values.min(axis=-1)
    if attrs.keepdims:
        result = xp.expand_dims(result, axis=tuple(sorted(axes)))
    return result


def _norm(xp: Any, attrs: Attrs, x: Any) -> Any:
    axes = norm_axes(attrs, x.ndim)
    if x.size == 0:
        _, (shape,) = _norm_infer(attrs, [x.shape])
        return xp.zeros(shape, x.dtype)
    if axes is None:
        flat = xp.sqrt((x * x).sum())
        return flat.reshape((1,) * x.ndim if attrs.keepdims else ()).astype(x.dtype)
    if len(axes) == 2:
        return xp.asarray(_matrix_norm(xp, attrs, x, axes)).astype(x.dtype)
    return _vector_norm(xp, x, attrs.ord, axes, attrs.keepdims)


register(OpDef(
    name="_npi_norm",
    params=(Param("ord", parse_float, 2.0),
            Param("axis", optional(parse_int_tuple), None),
            Param("keepdims", parse_bool, False),
            Param("flag", parse_int, -1)),
    hidden_outputs=3,
    infer_shape=_norm_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=_norm,
    uncapturable=CUPY_LINALG,
    doc="Vector or matrix norm over axis (ord and flag as MXNet's np.linalg.norm sets them).",
))
