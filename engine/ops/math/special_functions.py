"""Special functions NumPy lacks (log-gamma, gamma, inverse error function), for numpy and cupy.

Each works on float64 arrays (callers widen narrower floats first and narrow the result) and
stays free of floating-point warnings: every ``log``, ``sqrt`` and ``exp`` sees a clamped
argument, and the poles, infinities and out-of-domain values are put in afterwards with
``where``. Accuracy: `lgamma` and `gamma` to about 1e-14 relative (a Lanczos sum), `erfinv` to
about 1e-9 relative (a rational fit of the normal quantile), both well past float32 precision.
"""

from __future__ import annotations

import math
from typing import Any

# Lanczos approximation, g = 7 and nine terms: Gamma(z + 1) = sqrt(2 pi) t^(z + 1/2) e^-t A(z),
# t = z + g + 1/2, A(z) = c0 + sum_k c_k / (z + k). Relative error below 1e-15 for z >= -1/2.
_LANCZOS_G = 7.0
_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
            -176.61502916214059, 12.507343278686905, -0.13857109526572012,
            9.9843695780195716e-6, 1.5056327351493116e-7)
_HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)
# Past this, lgamma(x) ~ x (log x - 1) overflows float64; below it the sum stays finite.
_LGAMMA_FINITE_UP_TO = 2.5e305
_LOG_DOUBLE_MAX = math.log(1.7976931348623157e308)

# Rational fits of the standard normal quantile (relative error below 1.2e-9): a central one in
# q = p - 1/2, and a tail one in sqrt(-2 log p) for p below _TAIL.
_CENTRAL_NUM = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
_CENTRAL_DEN = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                6.680131188771972e+01, -1.328068155288572e+01, 1.0)
_TAIL_NUM = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
             -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00)
_TAIL_DEN = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
             3.754408661907416e+00, 1.0)
_TAIL = 0.02425
_SQRT_HALF = math.sqrt(0.5)


def _polynomial(coefficients: tuple[float, ...], x: Any) -> Any:
    """Horner's rule, highest power first."""
    value = coefficients[0] + 0 * x
    for coefficient in coefficients[1:]:
        value = value * x + coefficient
    return value


def _lgamma_positive(xp: Any, x: Any) -> Any:
    """log Gamma(x) for x >= 1/2 (the caller clamps x below `_LGAMMA_FINITE_UP_TO`)."""
    z = x - 1.0
    series = _LANCZOS[0] + 0 * z
    for k, coefficient in enumerate(_LANCZOS[1:], start=1):
        series = series + coefficient / (z + k)
    t = z + _LANCZOS_G + 0.5
    return _HALF_LOG_TWO_PI + (z + 0.5) * xp.log(t) - t + xp.log(series)


def _abs_sin_pi(xp: Any, x: Any) -> Any:
    """``|sin(pi x)|`` reduced by the nearest integer first, so it stays exact near poles."""
    return xp.abs(xp.sin(math.pi * (x - xp.rint(x))))


def lgamma(xp: Any, x: Any) -> Any:
    """``log |Gamma(x)|`` of a float64 array; +inf at 0, the negative integers and +-inf."""
    finite = xp.isfinite(x)
    pole = (x <= 0) & (x == xp.floor(x)) | ~finite
    safe = xp.where(finite & ~pole, x, 1.0)
    upper = xp.minimum(xp.maximum(safe, 0.5), _LGAMMA_FINITE_UP_TO)
    # Reflection for x < 1/2: Gamma(x) Gamma(1 - x) = pi / sin(pi x).
    lower = xp.maximum(xp.minimum(safe, 0.5), -_LGAMMA_FINITE_UP_TO)
    sine = xp.maximum(_abs_sin_pi(xp, lower), 1e-300)
    reflected = math.log(math.pi) - xp.log(sine) - _lgamma_positive(xp, 1.0 - lower)
    value = xp.where(safe >= 0.5, _lgamma_positive(xp, upper), reflected)
    value = xp.where(safe > _LGAMMA_FINITE_UP_TO, math.inf, value)
    return xp.where(pole & ~xp.isnan(x), math.inf, xp.where(xp.isnan(x), x, value))


def gamma_sign(xp: Any, x: Any) -> Any:
    """The sign of Gamma(x): -1 on the intervals (-1, 0), (-3, -2), ..., else +1."""
    odd = xp.fmod(xp.floor(xp.where(xp.isfinite(x), x, 0.0)), 2.0) != 0
    return xp.where((x < 0) & odd, -1.0, 1.0)


def gamma(xp: Any, x: Any) -> Any:
    """``Gamma(x)`` of a float64 array, as C's ``tgamma``: +-inf at +-0, nan at the negative
    integers and -inf, +inf at +inf and where the value overflows."""
    log_magnitude = lgamma(xp, x)
    overflow = log_magnitude > _LOG_DOUBLE_MAX
    magnitude = xp.exp(xp.minimum(log_magnitude, _LOG_DOUBLE_MAX))
    value = gamma_sign(xp, x) * xp.where(overflow, math.inf, magnitude)
    zero = x == 0
    value = xp.where(zero, xp.copysign(math.inf, x), value)
    negative_pole = (x < 0) & (x == xp.floor(x))
    return xp.where(negative_pole, math.nan, value)


def erfinv(xp: Any, y: Any) -> Any:
    """The inverse error function of a float64 array: +-inf at +-1, nan outside [-1, 1]."""
    magnitude = xp.abs(y)
    inside = magnitude < 1
    clipped = xp.where(inside, magnitude, 0.0)
    # erfinv(y) = Phi^-1((1 + y) / 2) / sqrt(2); for |y| near 1 the lower tail (1 - |y|) / 2
    # keeps its digits, where (1 + y) / 2 would round to 1.
    tail_p = xp.maximum(0.5 * (1.0 - clipped), 1e-300)
    root = xp.sqrt(-2.0 * xp.log(tail_p))
    tail = -_polynomial(_TAIL_NUM, root) / _polynomial(_TAIL_DEN, root)
    q = 0.5 * clipped
    square = q * q
    central = q * _polynomial(_CENTRAL_NUM, square) / _polynomial(_CENTRAL_DEN, square)
    value = _SQRT_HALF * xp.where(tail_p < _TAIL, tail, central)
    value = xp.where(inside, value, xp.where(magnitude == 1, math.inf, math.nan))
    return xp.where(y < 0, -value, xp.where(xp.isnan(y), y, value))
