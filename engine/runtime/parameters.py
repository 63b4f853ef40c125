"""`Parameters`: a model's parameters by name, each in the one form the model holds it in.

Most are arrays. A dense weight the model's plans read only as our GEMM's panels is held as
those (`engine.kernels.packed_weight.PackedWeight`, put in place by the ``pack_weights`` pass):
asked for by name, it is rebuilt as an array (the reference interpreter, the ONNX exporter),
which the caller holds for as long as it needs it and no longer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from engine.kernels.packed_weight import PackedWeight


class Parameters(Mapping[str, np.ndarray]):
    """Arrays by name, where a packed dense weight is unpacked on each access (a new array)."""

    def __init__(self, held: Mapping[str, Any]) -> None:
        self._held = dict(held)

    @classmethod
    def packed_where(cls, params: Mapping[str, Any], before: Mapping[str, Any],
                     after: Mapping[str, Any]) -> Parameters:
        """``params`` with each array that a graph's constants held as it is (``before``) and
        now hold packed (``after``, `PackedWeight`) taken in that form, so that the plain
        array goes. A parameter the graph holds another value for (a weight with a BatchNorm
        folded into it) stays as it is."""
        held = dict(params)
        for name, value in after.items():
            if isinstance(value, PackedWeight) and name in held and held[name] is before[name]:
                held[name] = value
        return cls(held)

    def __getitem__(self, name: str) -> np.ndarray:
        value = self._held[name]
        return value.unpacked() if isinstance(value, PackedWeight) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def held(self, name: str) -> Any:
        """The parameter in the form it is held in: an array, or a `PackedWeight`."""
        return self._held[name]

    @property
    def nbytes(self) -> int:
        """Bytes held: each array's, and each packed weight's panels."""
        return sum(int(value.nbytes) for value in self._held.values())
