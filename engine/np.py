"""``engine.np``: the part of MXNet's NumPy-mode ``mx.np`` that seed code uses.

``np.array``, ``np.zeros``, ``np.ones``, ``np.full``, ``np.arange``, ``np.random.normal(size=...)``
return NDArrays (float32 by default); any other name resolves to a registry op named
``_np_<name>``, ``_npi_<name>`` or ``<name>`` (``np.dot`` is ``_np_dot``).
"""

from __future__ import annotations

from typing import Any

from engine.nd import np as _ops
from engine.nd.ndarray import NDArray
from engine.nd.numpy_api import arange, array, empty, full, ones, random, zeros

ndarray = NDArray
float16 = "float16"
float32 = "float32"
float64 = "float64"
int32 = "int32"
int64 = "int64"
uint8 = "uint8"


def __getattr__(name: str) -> Any:
    try:
        return getattr(_ops, name)
    except AttributeError as error:
        raise AttributeError(f"module 'engine.np' has no attribute {name!r}: {error}") from None


__all__ = ["arange", "array", "empty", "full", "ndarray", "ones", "random", "zeros"]
