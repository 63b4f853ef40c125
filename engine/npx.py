"""``engine.npx``: MXNet's ``mx.npx`` — the NumPy-mode switch and extension ops (``npx.relu``).

``set_np()`` records that NumPy mode is on (the engine computes the same either way); other names
resolve to registry ops named ``_npx_<name>`` or ``<name>``.
"""

from __future__ import annotations

from typing import Any

from engine.context import cpu, current_context, gpu
from engine.nd import npx as _ops
from engine.nd import waitall

_STATE = {"shape": False, "array": False}


def set_np(shape: bool = True, array: bool = True, dtype: bool = False) -> None:
    """Turn on NumPy semantics (a flag here; engine numerics do not change)."""
    _STATE["shape"] = bool(shape)
    _STATE["array"] = bool(array)


def reset_np() -> None:
    """Turn NumPy semantics off again."""
    set_np(False, False)


def is_np_array() -> bool:
    """Whether ``set_np(array=True)`` is in effect."""
    return _STATE["array"]


def is_np_shape() -> bool:
    """Whether ``set_np(shape=True)`` is in effect."""
    return _STATE["shape"]


def __getattr__(name: str) -> Any:
    try:
        return getattr(_ops, name)
    except AttributeError as error:
        raise AttributeError(f"module 'engine.npx' has no attribute {name!r}: {error}") from None


__all__ = ["cpu", "current_context", "gpu", "is_np_array", "is_np_shape", "reset_np", "set_np",
           "waitall"]
