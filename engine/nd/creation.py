"""Array creation: ``array``, ``zeros``, ``ones``, ``full``, ``arange``, ... (float32)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.context import Context, resolve_context
from engine.nd.ndarray import NDArray, apply_op, wrap
from engine.nd.placement import device_for, place
from engine.ops.registry import has_op

DEFAULT_DTYPE = np.float32
Shape = int | tuple[int, ...] | list[int]


def _shape(shape: Shape) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)


def _dtype(dtype: Any) -> np.dtype:
    return np.dtype(DEFAULT_DTYPE if dtype is None else dtype)


def build(ctx: Context | str | None, make: Callable[[Any], Any]) -> NDArray:
    """An NDArray on ``ctx`` made by ``make(xp)`` with that context's array module.

    Raises:
        EngineError: ``ctx`` is a GPU and CuPy or the GPU is missing.
    """
    ctx = resolve_context(ctx)
    if ctx.device_type == "cpu":
        return wrap(np.asarray(make(np)), ctx)
    device = device_for(ctx)
    with device.activate():
        return wrap(place(make(device.xp), ctx), ctx)


def array(source_array: Any, ctx: Context | None = None, dtype: Any = None) -> NDArray:
    """An NDArray copied from an NDArray, NumPy array or nested list (float32 unless told).

    Example: ``nd.array([[1, 2]])`` prints as ``[[1. 2.]] <NDArray 1x2 @cpu(0)>``.
    """
    if isinstance(source_array, NDArray):
        dtype = source_array.dtype if dtype is None else dtype
        source_array = source_array.asnumpy()
    return NDArray(np.array(source_array, dtype=_dtype(dtype)), resolve_context(ctx))


def zeros(shape: Shape, ctx: Context | None = None, dtype: Any = None, **kwargs: Any) -> NDArray:
    """An array of zeros."""
    return build(ctx, lambda xp: xp.zeros(_shape(shape), _dtype(dtype)))


def ones(shape: Shape, ctx: Context | None = None, dtype: Any = None, **kwargs: Any) -> NDArray:
    """An array of ones."""
    return build(ctx, lambda xp: xp.ones(_shape(shape), _dtype(dtype)))


def full(shape: Shape, val: float, ctx: Context | None = None, dtype: Any = None,
         out: NDArray | None = None) -> NDArray:
    """An array filled with ``val`` (written into ``out`` when given)."""
    if out is not None:
        out[:] = val
        return out
    return build(ctx, lambda xp: xp.full(_shape(shape), val, _dtype(dtype)))


def empty(shape: Shape, ctx: Context | None = None, dtype: Any = None) -> NDArray:
    """An array whose contents are not initialised (zeros here, for determinism)."""
    return zeros(shape, ctx, dtype)


def arange(start: float, stop: float | None = None, step: float = 1.0, repeat: int = 1,
           infer_range: Any = None, ctx: Context | None = None, dtype: Any = None) -> NDArray:
    """Evenly spaced values in ``[start, stop)``, each repeated ``repeat`` times."""
    if stop is None:
        start, stop = 0, start
    values = np.arange(start, stop, step, dtype=np.float64).astype(_dtype(dtype))
    if repeat != 1:
        values = np.repeat(values, repeat)
    return NDArray(values, resolve_context(ctx))


def zeros_like(data: NDArray, **kwargs: Any) -> NDArray:
    """Zeros with the shape, dtype and context of ``data``."""
    return build(data.context, lambda xp: xp.zeros(data.shape, data.dtype))


def ones_like(data: NDArray, **kwargs: Any) -> NDArray:
    """Ones with the shape, dtype and context of ``data``."""
    return build(data.context, lambda xp: xp.ones(data.shape, data.dtype))


def concat(*data: NDArray, dim: int = 1, out: NDArray | None = None, **kwargs: Any) -> NDArray:
    """Join arrays along ``dim`` (MXNet's ``Concat``; the default axis is 1)."""
    if has_op("Concat"):
        return apply_op("Concat", data, {"dim": dim, "num_args": len(data)}, out, "nd.concat")
    result = NDArray(np.concatenate([array.asnumpy() for array in data], axis=dim),
                     data[0].context)
    return result if out is None else result.copyto(out)


def stack(*data: NDArray, axis: int = 0, out: NDArray | None = None, **kwargs: Any) -> NDArray:
    """Join arrays along a new axis ``axis``."""
    if has_op("stack"):
        return apply_op("stack", data, {"axis": axis, "num_args": len(data)}, out, "nd.stack")
    result = NDArray(np.stack([array.asnumpy() for array in data], axis=axis), data[0].context)
    return result if out is None else result.copyto(out)
