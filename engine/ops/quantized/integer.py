"""Integer products: convolution and matrix products of int8/uint8 arrays, accumulated exactly.

The products run as float64 BLAS calls: every int8 x int8 sum a layer makes stays far below
2**53, so float64 holds it exactly, as oneDNN's int32 accumulators do (short of their own
overflow, which a calibrated model never reaches). A fast path would hand these to an int8
GEMM in the LLVM JIT (``engine/kernels``): u8 x s8 dot products with VNNI's ``vpdpbusd`` (or
AVX-512BW's ``vpmaddubsw`` + ``vpmaddwd`` without it), weights packed once per plan, the
requantize scales, activation and residual applied in its epilogue.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engine.errors import ShapeError


def conv(data: Any, weight: Any, kernel: tuple[int, ...], stride: tuple[int, ...],
         dilate: tuple[int, ...], pad: tuple[int, ...], groups: int) -> np.ndarray:
    """``(N, F, *out)`` exact sums of ``data`` (N, C, *spatial) convolved with ``weight``
    (F, C / groups, *kernel), as float64."""
    spatial = len(kernel)
    values = np.asarray(data, dtype=np.float64)
    values = np.pad(values, [(0, 0), (0, 0), *((p, p) for p in pad)])
    reach = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilate, strict=True))
    windows = sliding_window_view(values, reach, axis=tuple(range(2, 2 + spatial)))
    picks = (slice(None), slice(None),
             *(slice(None, None, s) for s in stride), *(slice(None, None, d) for d in dilate))
    windows = windows[picks]  # (N, C, *out, *kernel)
    batch, channels = windows.shape[:2]
    out = windows.shape[2:2 + spatial]
    filters = weight.shape[0]
    if channels % groups or filters % groups or weight.shape[1] * groups != channels:
        raise ShapeError(f"quantized convolution: weight {weight.shape} does not fit "
                         f"{channels} input channels in {groups} groups")
    per_group = channels // groups
    windows = windows.reshape(batch, groups, per_group, *out, *kernel)
    # (N, G, *out, C/G, *kernel) -> rows of patches per group
    order = (0, 1, *range(3, 3 + spatial), 2, *range(3 + spatial, 3 + 2 * spatial))
    patches = windows.transpose(order).reshape(batch, groups, -1, per_group * int(np.prod(kernel)))
    matrix = np.asarray(weight, dtype=np.float64).reshape(groups, filters // groups, -1)
    sums = np.matmul(patches, matrix.transpose(0, 2, 1))  # (N, G, rows, F/G)
    return sums.transpose(0, 1, 3, 2).reshape(batch, filters, *out)


def matmul(left: Any, right: Any) -> np.ndarray:
    """``left @ right`` of integer arrays, exact, as float64."""
    return np.matmul(np.asarray(left, dtype=np.float64), np.asarray(right, dtype=np.float64))
