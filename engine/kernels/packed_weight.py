"""`PackedWeight`: a dense layer's weight held only as the column panels our GEMM reads.

A FullyConnected layer computes ``x · Wᵀ``, and our GEMM reads ``Wᵀ`` packed into panels of
NR columns (`gemm_kernel.pack_columns`). Where every product a weight takes part in runs on
our GEMM in float32 (`packs`), the panels are the only form a model needs: it keeps them in
place of the weight (`engine.compiler.pack_weights`), so the weight is held once, and every
plan it compiles binds the same panels, whatever its batch size (`product`). The panels hold
the weight's values exactly (a copy, padded with zero columns), so what asks for the plain
weight now and then (the reference interpreter, the ONNX exporter) gets it rebuilt from them
(`unpacked`), a new array it does not keep.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.kernels import gemm_bind, gemm_kernel
from engine.kernels.workspace import HugePageArena


class PackedWeight:
    """A FullyConnected weight (units, inputs) as `gemm_kernel.pack_columns` of its transpose.

    It answers ``shape``, ``dtype``, ``ndim`` and ``nbytes`` (the panels': what is held) as
    the weight would, for shape and dtype inference; NumPy's ``np.asarray`` gets the weight
    itself (`unpacked`).
    """

    __slots__ = ("panels", "shape", "dtype")
    ndim = 2

    def __init__(self, panels: np.ndarray, shape: tuple[int, int]) -> None:
        self.panels = panels
        self.shape = (int(shape[0]), int(shape[1]))
        self.dtype = panels.dtype

    @property
    def nbytes(self) -> int:
        """Bytes held: the panels, zero columns of the last one included."""
        return int(self.panels.nbytes)

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    def unpacked(self) -> np.ndarray:
        """The weight (units, inputs), a new array in column-major order (as the
        ``layout_weights`` pass lays a dense weight out): the panels side by side, less the
        zero columns."""
        units, inputs = self.shape
        panels, _, width = self.panels.shape
        columns = self.panels.transpose(1, 0, 2).reshape(inputs, panels * width)
        return np.ascontiguousarray(columns[:, :units]).T

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        weight = self.unpacked()
        return weight if dtype is None else weight.astype(dtype)

    def __repr__(self) -> str:
        return f"PackedWeight(shape={self.shape}, dtype={self.dtype}, nbytes={self.nbytes})"


def packs(weight: Any) -> bool:
    """Whether our GEMM runs every float32 product of a FullyConnected layer with this constant
    weight (`gemm_bind.product_with_weight`), so its panels can stand for it: float32, 2-D,
    at most `gemm_bind.PACK_LIMIT_BYTES` (larger weights stream from memory anyway, and BLAS
    multiplies them), and units that fill the kernel's vector lanes (`gemm_bind.worthwhile`:
    any number of rows does)."""
    return (type(weight) is np.ndarray and weight.dtype == np.float32 and weight.ndim == 2
            and weight.shape[1] > 0 and weight.nbytes <= gemm_bind.PACK_LIMIT_BYTES
            and gemm_bind.worthwhile(1, weight.shape[0]))


def pack(weight: np.ndarray, arena: HugePageArena | None = None) -> PackedWeight:
    """``weight`` (units, inputs) held as the column panels of its transpose; in ``arena``
    where given (a model's packed weights on huge pages, one after another:
    `engine.compiler.pack_weights`)."""
    panels = gemm_kernel.pack_columns(weight.T)
    return PackedWeight(panels if arena is None else arena.copy(panels), weight.shape)


def product(left: Any, weight: PackedWeight, out: Any) -> Callable[[], Any] | None:
    """``out = left @ weightᵀ`` on our GEMM, reading the weight's panels, as one call (a
    `gemm_bind.Spread` for a product BLAS would have spread over its threads); None where the
    kernel cannot take these operands (then the caller multiplies `unpacked`)."""
    if not _takes(left, weight, out):
        return None
    whole = gemm_kernel.bind_packed_columns(left, weight.panels, out)
    return gemm_bind.spread(whole, out.shape[0], left.shape[1], out.shape[1])


def _takes(left: Any, weight: PackedWeight, out: Any) -> bool:
    """Float32 NumPy matrices of matching shapes, at least one row, ``out`` with contiguous
    rows and apart from ``left`` (as `gemm_kernel.applies` asks of a plain weight)."""
    if not all(type(x) is np.ndarray and x.dtype == np.float32 and x.ndim == 2
               for x in (left, out)):
        return False
    units, inputs = weight.shape
    return (left.shape[1] == inputs and out.shape == (left.shape[0], units) and left.shape[0] > 0
            and (out.strides[1] == 4 or units == 1) and not np.may_share_memory(out, left)
            and gemm_kernel.available())
