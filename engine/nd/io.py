"""``nd.save`` and ``nd.load``: NDArrays in MXNet's ``.params`` format (never pickle)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from engine.nd.ndarray import NDArray


def save(fname: str | os.PathLike[str], data: NDArray | Mapping[str, NDArray]
         | Sequence[NDArray]) -> None:
    """Write one array, a list of arrays or a dict name -> array to ``fname``."""
    from engine.graph.params import save_params

    if isinstance(data, NDArray):
        data = [data]
    if isinstance(data, Mapping):
        payload: Any = {str(key): _host(value, str(key)) for key, value in data.items()}
    else:
        payload = [_host(value, f"item {index}") for index, value in enumerate(data)]
    save_params(os.fspath(fname), payload)


def load(fname: str | os.PathLike[str] | bytes) -> dict[str, NDArray] | list[NDArray]:
    """Read a ``.params`` file: a dict when it stores names, else a list."""
    from engine.graph.params import load_params

    source = fname if isinstance(fname, bytes) else os.fspath(fname)
    loaded = load_params(source)
    arrays = [NDArray(np.asarray(array)) for array in loaded.arrays]
    if loaded.names is None or (not loaded.names and arrays):
        return arrays
    return dict(zip(loaded.names, arrays, strict=True))


def _host(value: Any, what: str) -> np.ndarray:
    if isinstance(value, NDArray):
        return value.asnumpy()
    if isinstance(value, np.ndarray):
        return value
    raise TypeError(f"nd.save: {what} must be an NDArray, got {type(value).__name__}")
