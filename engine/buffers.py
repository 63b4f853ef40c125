"""Filling a plan's preallocated input buffers, on the CPU or in pinned host memory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def fill_rows(buffer: Any, array: Any, copy: Callable[[Any, Any], Any] | None = None) -> None:
    """``array`` into ``buffer``; when it has fewer rows (a batch padded up to a bucket), into
    the first rows, with the others zeroed. ``copy(target, source)`` defaults to assignment."""
    if copy is None:
        copy = _assign
    rows = array.shape[0] if getattr(array, "ndim", 0) else None
    if rows is None or rows == buffer.shape[0] or array.shape[1:] != buffer.shape[1:]:
        copy(buffer, array)
        return
    copy(buffer[:rows], array)
    buffer[rows:] = 0


def _assign(target: Any, source: Any) -> None:
    target[...] = source
