"""Bound matrix products: `gemm_kernel` where it measured faster than BLAS, else NumPy.

Our kernel runs on one thread. Where BLAS may use more (`blas_threads`, read at every call:
the server sets one, `threadpoolctl` may change it, a library caller gets every core), BLAS
runs the products of `THREADED_MACS` or more multiply-adds, which it spreads over its threads:
two threads against ours on one (Zen 4, 2 cores): 128×576×784 0.70× ours' time, 256×576×196
0.57×, 960×160×64 0.59×, 64×512×256 0.88×; below that it mostly loses (64×256×128 1.10×,
16×512×512 1.15×, 64×384×196 1.02×).

Where ours wins (one thread, Zen 4 with AVX-512, best of 200, against numpy's OpenBLAS):
many rows and whole vectors of columns, e.g. 64×512×256 152 against 174 µs, 128×576×784
1.01 against 1.11 ms, 512×512×16 81 against 103 µs, 24×144×3136 204 against 251 µs. Where
it loses: fewer rows than a tile (4×512×256 17 against 10 µs; one row, a matrix-vector product,
16 against 6.5 µs), and columns that leave most of a vector empty (49 columns are computed
as 64: 960×160×49 181 against 164 µs, where 48 columns take 136). `worthwhile` encodes that.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from engine.ops import gemm_kernel

# Below this share of computed lanes doing useful work, BLAS runs the product (49 of 64: no).
MIN_LANE_USE = 0.9
THREADED_MACS = 4 << 20  # from here BLAS runs the product whenever it has several threads

_blas: dict[str, Any] = {}


def blas_threads() -> int:
    """The threads numpy's bundled OpenBLAS uses now (0.2 µs: asked at every call); where
    numpy has no OpenBLAS of its own (macOS's Accelerate, a custom build), 1."""
    if "threads" not in _blas:
        _blas["threads"] = _openblas_threads_function()
    function = _blas["threads"]
    return function() if function is not None else 1


def _openblas_threads_function() -> Any:
    folder = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in sorted(glob.glob(os.path.join(folder, "*openblas*"))):
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                     "openblas_get_num_threads"):
            function = getattr(library, name, None)
            if function is not None:
                function.restype = ctypes.c_int
                return function
    return None


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
        return _unless_threaded(partial(gemm_kernel.multiply_packed, packed, right, out),
                                weight, right, out)
    return None


def product_with_weight(xp: Any, left: Any, weight: Any, out: Any,
                        workspace: Any) -> Callable[[], Any] | None:
    """``out = left @ weight`` by our kernel as one call, where ``weight`` never changes (a
    read-only plan constant, or a value derived from one): packed into column panels once and
    shared by the model's plans; None where BLAS should run it."""
    if xp is np and gemm_kernel.applies(left, weight, out) and worthwhile(*out.shape):
        panels = workspace.derived(weight, "gemm panels", gemm_kernel.pack_columns)
        return _unless_threaded(partial(gemm_kernel.multiply_packed_columns, left, panels, out),
                                left, weight, out)
    return None


def _unless_threaded(ours: Callable[[], Any], left: Any, right: Any,
                     out: Any) -> Callable[[], Any]:
    """``ours``, or for a product of `THREADED_MACS` or more, a call choosing at every run
    between ours and BLAS by the threads BLAS has then."""
    if left.shape[0] * left.shape[1] * right.shape[1] < THREADED_MACS:
        return ours
    return partial(_ours_or_blas, ours, partial(np.matmul, left, right, out))


def _ours_or_blas(ours: Callable[[], Any], blas: Callable[[], Any]) -> None:
    if blas_threads() > 1:
        blas()
    else:
        ours()
