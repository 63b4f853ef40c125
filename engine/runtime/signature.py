"""`Signature`: the names, shapes and dtypes of a call's inputs — the key of a model's caches.

A `Model` compiles a plan and infers shapes once per signature. Every cache keyed by inputs
uses this one type, so a key built from a feed, from shapes and dtypes, or padded to a batch
bucket always compares equal when it describes the same inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


class Signature(tuple):
    """``(name, shape, dtype)`` of each input, in feed order; frozen and hashable.

    A tuple subclass rather than a dataclass: hashing and comparing stay C-level, and a plain
    tuple of the same entries (`lookup_key`) finds it in a dict, which is what keeps a batch-1
    `Model.infer` on a seen signature one dict lookup.

    Example:
        >>> key = Signature.of({"data": np.zeros((3, 4), np.float32)})
        >>> key.with_rows(8).shapes()
        {'data': (8, 4)}
    """

    __slots__ = ()

    @classmethod
    def of(cls, feed: Mapping[str, Any]) -> Signature:
        """The signature of arrays (anything with ``shape`` and ``dtype``) by name."""
        return cls((name, tuple(array.shape), np.dtype(array.dtype))
                   for name, array in feed.items())

    @staticmethod
    def lookup_key(inputs: Mapping[str, Any]) -> tuple | None:
        """A key that finds ``inputs``' signature in a dict keyed by signatures, when every
        value is exactly an ``np.ndarray``; else None (lists, subclasses and other objects need
        converting before a key means much). A plain tuple equal, and hash-equal, to
        ``Signature.of(inputs)``: building the subclass would cost the batch-1 path 0.1 µs."""
        entries = tuple([(name, value.shape, value.dtype) for name, value in inputs.items()
                         if type(value) is np.ndarray])
        return entries if len(entries) == len(inputs) else None

    @classmethod
    def from_specs(cls, shapes: Mapping[str, tuple[int, ...]],
                   dtypes: Mapping[str, Any]) -> Signature:
        """The signature of inputs with these shapes and dtypes, in the order of ``shapes``."""
        return cls((name, tuple(int(dim) for dim in shape), np.dtype(dtypes[name]))
                   for name, shape in shapes.items())

    def names(self) -> list[str]:
        """Input names, in order."""
        return [name for name, _, _ in self]

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Input shapes by name."""
        return {name: shape for name, shape, _ in self}

    def dtypes(self) -> dict[str, np.dtype]:
        """Input dtypes by name."""
        return {name: dtype for name, _, dtype in self}

    def rows(self) -> int | None:
        """The batch size: the first dimension shared by every input, or None (a scalar input,
        no inputs, or inputs with different first dimensions)."""
        rows = {shape[0] if shape else None for _, shape, _ in self}
        return rows.pop() if len(rows) == 1 else None

    def with_rows(self, rows: int) -> Signature:
        """This signature with every input's first dimension set to ``rows`` (a batch bucket);
        scalar inputs are kept as they are."""
        return Signature((name, (rows, *shape[1:]) if shape else shape, dtype)
                         for name, shape, dtype in self)

    def __repr__(self) -> str:
        inputs = ", ".join(f"{name}: {list(shape)} {dtype.name}" for name, shape, dtype in self)
        return f"Signature({inputs})"
