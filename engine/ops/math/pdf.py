"""Probability densities of samples: ``_random_pdf_<distribution>`` (alias ``random_pdf_*``).

The first input holds samples; the others hold one distribution's parameters each. Parameter
arrays share a shape that is the leading part of the samples' shape, so every trailing sample
index reads the parameters at its leading index. Dirichlet samples are vectors: their last axis
pairs with ``alpha``'s last axis and the output drops it. ``is_log`` gives the log-density.

Computed in float64 and cast to the common dtype, as MXNet computes in the input dtype; outside
a distribution's support the value is whatever the formula gives (nan or +-inf), silently, as
in MXNet (uniform does not check its support at all).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import parse_bool
from engine.ops.dtypes import FLOAT64
from engine.ops.math.special import narrow
from engine.ops.math.special_functions import lgamma
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, default_dtype, register
from engine.ops.shapes import Inferred, merge

LogDensity = Callable[..., Any]  # (xp, sample, *params) -> float64 log-density


def _uniform(xp: Any, x: Any, low: Any, high: Any) -> Any:
    return -xp.log(high - low) + xp.zeros_like(x)  # no support check, as in MXNet


def _normal(xp: Any, x: Any, mu: Any, sigma: Any) -> Any:
    return -0.5 * ((x - mu) / sigma) ** 2 - xp.log(math.sqrt(2 * math.pi) * sigma)


def _gamma(xp: Any, x: Any, alpha: Any, beta: Any) -> Any:
    # beta is a rate: density beta^alpha x^(alpha - 1) e^(-beta x) / Gamma(alpha).
    return alpha * xp.log(beta) + (alpha - 1) * xp.log(x) - beta * x - lgamma(xp, alpha)


def _exponential(xp: Any, x: Any, lam: Any) -> Any:
    return xp.log(lam) - lam * x


def _poisson(xp: Any, x: Any, lam: Any) -> Any:
    return x * xp.log(lam) - lgamma(xp, x + 1) - lam


def _negative_binomial(xp: Any, x: Any, k: Any, p: Any) -> Any:
    """Failures ``x`` before the ``k``-th success; ``p`` is MXNet's success probability."""
    return (lgamma(xp, x + k) - lgamma(xp, x + 1) - lgamma(xp, k)
            + k * xp.log(p) + x * xp.log(1 - p))


def _generalized_negative_binomial(xp: Any, x: Any, mu: Any, alpha: Any) -> Any:
    # Mean mu and dispersion alpha: k = 1 / alpha, p = 1 / (mu alpha + 1).
    return _negative_binomial(xp, x, 1 / alpha, 1 / (mu * alpha + 1))


def _dirichlet(xp: Any, x: Any, alpha: Any) -> Any:
    return (((alpha - 1) * xp.log(x)).sum(axis=-1) + lgamma(xp, alpha.sum(axis=-1))
            - lgamma(xp, alpha).sum(axis=-1))


def _pdf_infer(vector: bool) -> Callable[[Attrs, list[MaybeShape]], Inferred]:
    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        sample, *params = shapes
        common: MaybeShape = None
        for shape in params:
            common = merge(common, shape, "pdf parameter shapes")
        if sample is not None and common is not None:
            if len(common) > len(sample) or (vector and not common):
                raise ShapeError(f"pdf parameters {common} must be a leading part of the sample "
                                 f"shape {sample}")
            prefix = sample[:len(common)]
            if vector:
                prefix = (*prefix[:-1], sample[-1])
            common = merge(common, prefix, "pdf parameter and sample shapes")
        if sample is None:
            out = None
        elif vector:
            out = sample[:-1] if len(sample) > 1 else (1,)
        else:
            out = sample
        return [sample, *([common] * len(params))], [out]

    return infer


def _pdf_kernel(log_density: LogDensity, vector: bool) -> Callable[..., Any]:
    def kernel(xp: Any, attrs: Attrs, sample: Any, *params: Any) -> Any:
        # A parameter's leading index addresses every trailing sample index.
        trailing = sample.ndim - params[0].ndim
        widened = [param.astype(FLOAT64).reshape(param.shape[:-1] + (1,) * trailing +
                                                 param.shape[-1:]) if vector
                   else param.astype(FLOAT64).reshape(param.shape + (1,) * trailing)
                   for param in params]
        with np.errstate(all="ignore"):  # nan and inf outside the support, silently
            value = log_density(xp, sample.astype(FLOAT64), *widened)
            if not attrs.is_log:
                value = xp.exp(value)
        if vector and sample.ndim == 1:
            value = value.reshape(1)
        return narrow(xp, value, sample.dtype)

    return kernel


# (distribution, parameter names, log-density, vector samples, doc)
_DISTRIBUTIONS = (
    ("uniform", ("low", "high"), _uniform, False, "Uniform on [low, high)."),
    ("normal", ("mu", "sigma"), _normal, False, "Normal with mean mu and deviation sigma."),
    ("gamma", ("alpha", "beta"), _gamma, False, "Gamma with shape alpha and rate beta."),
    ("exponential", ("lam",), _exponential, False, "Exponential with rate lam."),
    ("poisson", ("lam",), _poisson, False, "Poisson with rate lam."),
    ("negative_binomial", ("k", "p"), _negative_binomial, False,
     "Negative binomial: failures before k successes of probability p."),
    ("generalized_negative_binomial", ("mu", "alpha"), _generalized_negative_binomial, False,
     "Negative binomial with mean mu and dispersion alpha."),
    ("dirichlet", ("alpha",), _dirichlet, True,
     "Dirichlet over the samples' last axis, with concentration alpha."),
)

for _name, _params, _log_density, _vector, _doc in _DISTRIBUTIONS:
    register(OpDef(
        name=f"_random_pdf_{_name}",
        aliases=(f"random_pdf_{_name}",),
        params=(Param("is_log", parse_bool, False),),
        inputs=("sample", *_params),
        infer_shape=_pdf_infer(_vector),
        infer_dtype=default_dtype,
        kernel=_pdf_kernel(_log_density, _vector),
        doc=f"Density (or, with is_log, log-density) of samples: {_doc}",
    ))
