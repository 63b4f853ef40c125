"""Filling a plan's preallocated input buffers, on the CPU or in pinned host memory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def fill_rows(buffer: Any, array: Any, copy: Callable[[Any, Any], Any] | None = None) -> None:
    """``array`` into ``buffer``; when it has fewer rows (a batch padded up to a bucket), into
    the first rows, with the others zeroed. ``copy(target, source)`` defaults to assignment."""
    if copy is None:
        copy = _assign
    if array.shape == buffer.shape or not getattr(array, "ndim", 0) \
            or array.shape[1:] != buffer.shape[1:]:
        copy(buffer, array)  # the usual case first: one tuple comparison on the batch-1 path
        return
    rows = array.shape[0]
    copy(buffer[:rows], array)
    buffer[rows:] = 0


def _assign(target: Any, source: Any) -> None:
    target[...] = source
