"""Special functions as operators: ``gamma``, ``gammaln``, ``erfinv`` and their ``_npx_`` names.

The output keeps the input dtype, as in MXNet. Every dtype is computed in float64
(`engine.ops.math.special_functions`) and narrowed: values past a float's range become +-inf,
and an integer output takes the rounded gamma (exact for the integers whose gamma it can hold)
or the truncated gammaln, as MXNet's cast from its float result gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.ops.dtypes import FLOAT64
from engine.ops.math import special_functions
from engine.ops.registry import Attrs, OpDef, register
from engine.ops.shapes import same_shape


def narrow(xp: Any, value: Any, dtype: np.dtype) -> Any:
    """A float result cast to ``dtype`` without overflow warnings.

    Floats: magnitudes past the dtype's range become +-inf. Integers: non-finite values become
    the dtype's minimum, which is what x86's float-to-integer conversion gives MXNet.
    """
    dtype = np.dtype(dtype)
    if value.dtype == dtype:
        return value
    if np.issubdtype(dtype, np.floating):
        if dtype.itemsize >= value.dtype.itemsize:
            return value.astype(dtype)
        limit = float(np.finfo(dtype).max)
        value = xp.where(xp.abs(value) > limit, xp.copysign(np.inf, value), value)
        return value.astype(dtype)
    if dtype == np.bool_:
        return value != 0
    info = np.iinfo(dtype)
    value = value.astype(FLOAT64)
    inside = xp.isfinite(value) & (value >= info.min) & (value <= info.max)
    return xp.where(inside, value, float(info.min)).astype(dtype)


def _unary(function: Callable[[Any, Any], Any], round_integers: bool) -> Callable[..., Any]:
    def kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
        value = function(xp, data.astype(FLOAT64))
        if round_integers and not np.issubdtype(data.dtype, np.floating):
            value = xp.rint(value)
        return narrow(xp, value, data.dtype)

    return kernel


# (MXNet name, NumPy-mode name, function, round integer results, C expression, doc)
_SPECIAL = (
    ("gamma", "_npx_gamma", special_functions.gamma, True, "tgamma(a)",
     "The gamma function (+-inf at +-0, nan at negative integers)."),
    ("gammaln", "_npx_gammaln", special_functions.lgamma, False, "lgamma(a)",
     "log |gamma(x)| (+inf at the poles)."),
    ("erfinv", "_npx_erfinv", special_functions.erfinv, False, "erfinv(a)",
     "The inverse error function (+-inf at +-1, nan outside [-1, 1])."),
)

for _name, _numpy_name, _function, _round, _expression, _doc in _SPECIAL:
    register(OpDef(name=_name, aliases=(_numpy_name,), kernel=_unary(_function, _round),
                   infer_shape=same_shape, elementwise=_expression, inplace=True, doc=_doc))
