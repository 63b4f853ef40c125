"""MXNet's contrib maths: ``_contrib_allclose``, ``_contrib_quadratic`` and ``khatri_rao`` (the
column-wise Kronecker product)."""

from __future__ import annotations

import math
from typing import Any

from engine.ops.attrs import parse_bool, parse_float, parse_int
from engine.ops.dtypes import UINT8
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred, same_shape

# --- allclose, quadratic ----------------------------------------------------------------------

def _allclose(xp: Any, attrs: Attrs, a: Any, b: Any) -> Any:
    close = xp.isclose(a, b, rtol=attrs.rtol, atol=attrs.atol, equal_nan=attrs.equal_nan)
    return xp.asarray(close.all(), dtype=UINT8)


register(OpDef(
    name="_contrib_allclose",
    params=(Param("rtol", parse_float, 1e-5), Param("atol", parse_float, 1e-8),
            Param("equal_nan", parse_bool, True)),
    inputs=("a", "b"),
    infer_shape=lambda attrs, shapes: (shapes, [()]),
    infer_dtype=lambda attrs, dtypes: (dtypes, [UINT8]),
    kernel=_allclose,
    doc="1 (uint8, 0-d) when |a - b| <= atol + rtol * |b| everywhere, else 0.",
))
register(OpDef(
    name="_contrib_quadratic",
    params=(Param("a", parse_float, 0.0), Param("b", parse_float, 0.0),
            Param("c", parse_float, 0.0)),
    infer_shape=same_shape,
    kernel=lambda xp, attrs, x: (x * x * x.dtype.type(attrs.a) + x * x.dtype.type(attrs.b)
                                 + x.dtype.type(attrs.c)),
    elementwise="({a} * a * a + {b} * a + {c})",
    inplace=True,
    doc="a * x^2 + b * x + c.",
))


# --- khatri_rao -------------------------------------------------------------------------------

def _khatri_rao_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    if any(shape is None for shape in shapes):
        return shapes, [None]
    return shapes, [(math.prod(shape[0] for shape in shapes), shapes[0][1])]


def _khatri_rao(xp: Any, attrs: Attrs, *matrices: Any) -> Any:
    result = matrices[0]
    for matrix in matrices[1:]:
        result = (result[:, None, :] * matrix[None, :, :]).reshape(-1, result.shape[1])
    return result


register(OpDef(
    name="khatri_rao",
    params=(Param("num_args", parse_int),),
    inputs=lambda attrs: tuple(f"arg{index}" for index in range(attrs.num_args)),
    infer_shape=_khatri_rao_infer,
    kernel=_khatri_rao,
    doc="Column-wise Kronecker product of matrices with equal column counts.",
))
