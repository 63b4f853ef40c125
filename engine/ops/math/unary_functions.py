"""Named elementwise functions beyond the arithmetic families: ``degrees``, ``radians``,
``rint``, ``rcbrt`` and ``smooth_l1``."""

from __future__ import annotations

import math
from typing import Any

from engine.ops.attrs import (
    parse_float,
)
from engine.ops.registry import Attrs, OpDef, Param, register
from engine.ops.shapes import same_shape

# --- elementwise ------------------------------------------------------------------------------

def _smooth_l1(xp: Any, attrs: Attrs, data: Any) -> Any:
    sigma2 = data.dtype.type(attrs.scalar * attrs.scalar)
    magnitude = xp.abs(data)
    return xp.where(magnitude < 1 / sigma2, data.dtype.type(0.5) * sigma2 * data * data,
                    magnitude - data.dtype.type(0.5) / sigma2).astype(data.dtype)


_SMOOTH_L1 = ("(fabs(a) < 1 / ({scalar} * {scalar}) ? 0.5 * ({scalar} * {scalar}) * a * a"
              " : fabs(a) - 0.5 / ({scalar} * {scalar}))")

# (name, NumPy-mode twin, kernel, C expression or None, doc)
_UNARY = (
    ("degrees", "_npi_degrees", lambda xp, attrs, a: a * a.dtype.type(180 / math.pi),
     "(a * 57.29577951308232)", "Radians to degrees."),
    ("radians", "_npi_radians", lambda xp, attrs, a: a * a.dtype.type(math.pi / 180),
     "(a * 0.017453292519943295)", "Degrees to radians."),
    ("rint", "_npi_rint", lambda xp, attrs, a: xp.rint(a), None,
     "Round to the nearest integer, halves to even."),
    ("rcbrt", None, lambda xp, attrs, a: 1 / xp.cbrt(a), "(1 / cbrt(a))",
     "Reciprocal cube root."),
)

for _name, _numpy_name, _kernel, _expression, _doc in _UNARY:
    register(OpDef(name=_name, kernel=_kernel, infer_shape=same_shape, elementwise=_expression,
                   inplace=True, doc=_doc))
    if _numpy_name is not None:  # a separate MXNet op, whose input is called x
        register(OpDef(name=_numpy_name, kernel=_kernel, inputs=("x",), infer_shape=same_shape,
                       elementwise=_expression, inplace=True, doc=f"NumPy-mode {_name}."))

register(OpDef(
    name="smooth_l1",
    params=(Param("scalar", parse_float),),
    infer_shape=same_shape,
    kernel=_smooth_l1,
    elementwise=_SMOOTH_L1,
    inplace=True,
    doc="Smooth L1: 0.5 (sigma x)^2 where |x| < 1/sigma^2, else |x| - 0.5/sigma^2 (sigma = "
        "scalar).",
))
