"""``nd.random``: seeded sampling (``normal``, ``uniform``) into float32 NDArrays."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.context import Context, resolve_context
from engine.nd.ndarray import NDArray

_STATE = {"generator": np.random.default_rng()}


def seed(seed_state: int, ctx: Any = "all") -> None:
    """Reseed the generator used by ``nd.random`` (and ``np.random``) sampling."""
    _STATE["generator"] = np.random.default_rng(int(seed_state))


def generator() -> np.random.Generator:
    """The current random generator."""
    return _STATE["generator"]


def _sample(draw: Any, first: Any, second: Any, shape: Any, dtype: Any, ctx: Context | None,
            out: NDArray | None) -> NDArray:
    if out is not None:
        shape = out.shape
    shape = (1,) if shape is None or shape == () else (
        (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape))
    if ctx is None and out is not None:
        ctx = out.context
    if isinstance(first, NDArray) or isinstance(second, NDArray):
        if ctx is None:
            ctx = (first if isinstance(first, NDArray) else second).context
        # Parameter arrays: one sample block of `shape` per parameter element.
        first_values = np.asarray(first, np.float64)
        second_values = np.asarray(second, np.float64)
        base = np.broadcast_shapes(first_values.shape, second_values.shape)
        full = base + shape
        expand = (...,) + (None,) * len(shape)
        values = draw(first_values[expand], second_values[expand], full)
    else:
        values = draw(float(first), float(second), shape)
    # Drawn on the host from one seeded generator, so a seed gives the same values everywhere.
    host = np.asarray(values).astype(np.dtype(dtype or np.float32))
    result = NDArray(host, resolve_context(ctx))
    return result if out is None else result.copyto(out)


def normal(loc: Any = 0.0, scale: Any = 1.0, shape: Any = None, dtype: Any = None,
           ctx: Context | None = None, out: NDArray | None = None, **kwargs: Any) -> NDArray:
    """Samples from N(loc, scale²); ``shape`` defaults to (1,) as in MXNet."""
    return _sample(generator().normal, loc, scale, shape, dtype, ctx, out)


def uniform(low: Any = 0.0, high: Any = 1.0, shape: Any = None, dtype: Any = None,
            ctx: Context | None = None, out: NDArray | None = None, **kwargs: Any) -> NDArray:
    """Samples from U[low, high); ``shape`` defaults to (1,) as in MXNet."""
    return _sample(generator().uniform, low, high, shape, dtype, ctx, out)


def randn(*shape: int, loc: float = 0.0, scale: float = 1.0, dtype: Any = None,
          ctx: Context | None = None) -> NDArray:
    """Standard normal samples of the given shape."""
    return normal(loc, scale, shape or None, dtype, ctx)
