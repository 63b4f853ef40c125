"""Numpy's floating-point warnings off around a model run, at little cost.

MXNet returns inf and nan silently (log(0), overflow); numpy warns. `np.errstate(all="ignore")`
says so but costs about 1.6 µs per use, as much as a small layer at batch 1. NumPy 2 keeps the
error state in one context variable, so switching it is a ``set`` and a ``reset`` (0.3 µs).
Where that private variable is missing, `np.errstate` does the same job.

Usage::

    token = quiet_floats()
    try:
        ...
    finally:
        restore_floats(token)
"""

from __future__ import annotations

from typing import Any

import numpy as np

try:
    from numpy._core._ufunc_config import _extobj_contextvar as _ERROR_STATE
except ImportError:  # another NumPy layout: fall back to the public context manager
    _ERROR_STATE = None

if _ERROR_STATE is not None:
    with np.errstate(all="ignore"):
        _IGNORE_ALL = _ERROR_STATE.get()


def quiet_floats() -> Any:
    """Ignore overflow, underflow, invalid and divide-by-zero in this context until restored."""
    if _ERROR_STATE is not None:
        return _ERROR_STATE.set(_IGNORE_ALL)
    state = np.errstate(all="ignore")
    state.__enter__()
    return state


def restore_floats(token: Any) -> None:
    """Put back the error state `quiet_floats` replaced."""
    if _ERROR_STATE is not None:
        _ERROR_STATE.reset(token)
    else:
        token.__exit__(None, None, None)
