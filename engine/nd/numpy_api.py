"""NumPy-style creation functions for ``np``/``F.np`` (``np.ones(shape, dtype)``, ``size=``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from engine.context import Context, resolve_context
from engine.nd import random as nd_random
from engine.nd.creation import build
from engine.nd.ndarray import NDArray

DEFAULT_DTYPE = np.float32


def _dtype(dtype: Any) -> np.dtype:
    return np.dtype(DEFAULT_DTYPE if dtype is None else dtype)


def array(object: Any, dtype: Any = None, ctx: Context | None = None) -> NDArray:
    """An array from data; NumPy/NDArray sources keep their dtype, lists become float32."""
    if isinstance(object, NDArray):
        object = object.asnumpy()
    if dtype is None and isinstance(object, np.ndarray):
        dtype = object.dtype
    return NDArray(np.array(object, dtype=_dtype(dtype)), resolve_context(ctx))


def zeros(shape: Any, dtype: Any = None, order: str = "C", ctx: Context | None = None) -> NDArray:
    """An array of zeros (float32 by default)."""
    return build(ctx, lambda xp: xp.zeros(shape, _dtype(dtype)))


def ones(shape: Any, dtype: Any = None, order: str = "C", ctx: Context | None = None) -> NDArray:
    """An array of ones (float32 by default)."""
    return build(ctx, lambda xp: xp.ones(shape, _dtype(dtype)))


def full(shape: Any, fill_value: float, dtype: Any = None, order: str = "C",
         ctx: Context | None = None) -> NDArray:
    """An array filled with ``fill_value``."""
    return build(ctx, lambda xp: xp.full(shape, fill_value, _dtype(dtype)))


def empty(shape: Any, dtype: Any = None, order: str = "C", ctx: Context | None = None) -> NDArray:
    """An uninitialised array (zeros here, for determinism)."""
    return zeros(shape, dtype, order, ctx)


def arange(start: float, stop: float | None = None, step: float = 1, dtype: Any = None,
           ctx: Context | None = None) -> NDArray:
    """Evenly spaced values in ``[start, stop)`` (float32 by default)."""
    if stop is None:
        start, stop = 0, start
    return NDArray(np.arange(start, stop, step).astype(_dtype(dtype)), resolve_context(ctx))


def _normal(loc: float = 0.0, scale: float = 1.0, size: Any = None, dtype: Any = None,
            ctx: Context | None = None, out: NDArray | None = None) -> NDArray:
    """Samples from N(loc, scale²) with NumPy's ``size`` (a scalar-shaped (1,) when omitted)."""
    return nd_random.normal(loc, scale, size, dtype, ctx, out)


def _uniform(low: float = 0.0, high: float = 1.0, size: Any = None, dtype: Any = None,
             ctx: Context | None = None, out: NDArray | None = None) -> NDArray:
    """Samples from U[low, high) with NumPy's ``size``."""
    return nd_random.uniform(low, high, size, dtype, ctx, out)


random = SimpleNamespace(normal=_normal, uniform=_uniform, seed=nd_random.seed,
                         __name__="engine.np.random")

FUNCTIONS = {"array": array, "zeros": zeros, "ones": ones, "full": full, "empty": empty,
             "arange": arange, "random": random, "ndarray": NDArray}
