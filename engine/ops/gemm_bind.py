"""Bound matrix products: `gemm_kernel` where it measured faster than BLAS, else NumPy.

Where ours wins (one thread, Zen 4 with AVX-512, best of 200, against numpy's OpenBLAS):
many rows and whole vectors of columns, e.g. 64×512×256 152 against 174 µs, 128×576×784
1.01 against 1.11 ms, 512×512×16 81 against 103 µs, 24×144×3136 204 against 251 µs. Where
it loses: fewer rows than a tile (4×512×256 17 against 10 µs; one row, a matrix-vector product,
16 against 6.5 µs), and columns that leave most of a vector empty (49 columns are computed
as 64: 960×160×49 181 against 164 µs, where 48 columns take 136). `worthwhile` encodes that.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from engine.ops import gemm_kernel

# Below this share of computed lanes doing useful work, BLAS runs the product (49 of 64: no).
MIN_LANE_USE = 0.9


def worthwhile(rows: int, columns: int) -> bool:
    """Whether our kernel beats BLAS on a product of this many output rows and columns."""
    if not gemm_kernel.available():
        return False
    shape = gemm_kernel.tile()
    lanes = -(-columns // shape.width) * shape.width
    return rows >= shape.rows and columns / lanes >= MIN_LANE_USE


def weight_product(xp: Any, weight: Any, right: Any, out: Any,
                   workspace: Any) -> Callable[[], Any] | None:
    """``out = weight @ right`` by our kernel as one call, where ``weight`` is a read-only
    plan constant (packed once and shared by the model's plans, `Workspace.derived`); None
    where BLAS should run it."""
    if (xp is np and not weight.flags.writeable and gemm_kernel.applies(weight, right, out)
            and worthwhile(*out.shape)):
        packed = workspace.derived(weight, "gemm packed", gemm_kernel.pack)
        return partial(gemm_kernel.multiply_packed, packed, right, out)
    return None


def product_with_weight(xp: Any, left: Any, weight: Any, out: Any,
                        workspace: Any) -> Callable[[], Any] | None:
    """``out = left @ weight`` by our kernel as one call, where ``weight`` never changes (a
    read-only plan constant, or a value derived from one): packed into column panels once and
    shared by the model's plans; None where BLAS should run it."""
    if xp is np and gemm_kernel.applies(left, weight, out) and worthwhile(*out.shape):
        panels = workspace.derived(weight, "gemm panels", gemm_kernel.pack_columns)
        return partial(gemm_kernel.multiply_packed_columns, left, panels, out)
    return None
