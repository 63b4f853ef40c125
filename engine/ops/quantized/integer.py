"""Integer products: convolution and matrix products of int8/uint8 arrays, accumulated exactly.

Where the host has AVX-512 VNNI, int8 weights times uint8 or int8 data run on our int8 GEMM
(`engine.kernels.gemm_int8`: ``vpdpbusd``, int32 sums), the weights packed once while their
array lives (`_packed`, for read-only weights: a plan's parameters and the int8 weights a bound
node keeps). Otherwise, and for float operands, the products run as float64 BLAS calls: every
int8 x int8 sum a layer makes stays far below 2**53, so float64 holds it exactly, as oneDNN's
int32 accumulators do (short of their own overflow, which a calibrated model never reaches).
Either way the caller gets the same float64 sums, bit for bit. ``PATHS`` counts the products
each path ran (tests assert the fast path was taken).

Grouped convolutions with fewer than 16 filters per group (depthwise layers) stay on float64
batched matmul: a 16-column panel per group would be mostly padding.
"""

from __future__ import annotations

import weakref
from collections import Counter
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engine.errors import ShapeError
from engine.kernels import gemm_int8

PATHS: Counter = Counter()
_settings = {"fast": True}
_packed: dict[tuple, tuple[Any, gemm_int8.PackedWeights]] = {}
_MIN_GROUP_FILTERS = 16


def use_fast_path(enabled: bool) -> None:
    """Turn the VNNI path on or off (benchmarks compare the two; on by default)."""
    _settings["fast"] = enabled


def _fast(data: Any, weight: Any) -> bool:
    return (_settings["fast"] and data.dtype in (np.uint8, np.int8) and weight.dtype == np.int8
            and gemm_int8.available())


def conv(data: Any, weight: Any, kernel: tuple[int, ...], stride: tuple[int, ...],
         dilate: tuple[int, ...], pad: tuple[int, ...], groups: int) -> np.ndarray:
    """``(N, F, *out)`` exact sums of ``data`` (N, C, *spatial) convolved with ``weight``
    (F, C / groups, *kernel), as float64."""
    data, weight = np.asarray(data), np.asarray(weight)
    fast = _fast(data, weight) and weight.shape[0] // max(groups, 1) >= _MIN_GROUP_FILTERS
    spatial = len(kernel)
    values = data if fast else np.asarray(data, dtype=np.float64)
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
    if fast:
        return _fast_conv(patches, weight, out)
    PATHS["float64"] += 1
    matrix = np.asarray(weight, dtype=np.float64).reshape(groups, filters // groups, -1)
    sums = np.matmul(patches, matrix.transpose(0, 2, 1))  # (N, G, rows, F/G)
    return sums.transpose(0, 1, 3, 2).reshape(batch, filters, *out)


def _fast_conv(patches: np.ndarray, weight: np.ndarray, out: tuple[int, ...]) -> np.ndarray:
    batch, groups, rows, depth = patches.shape
    filters = weight.shape[0]
    per_group = filters // groups
    matrix = weight.reshape(groups, per_group, depth)
    sums = np.empty((batch, groups, per_group, rows), np.float64)
    for group in range(groups):
        product = gemm_int8.multiply(patches[:, group].reshape(batch * rows, depth),
                                     _packed_weights(matrix[group].T))
        sums[:, group] = product.reshape(batch, rows, per_group).transpose(0, 2, 1)
    PATHS["vnni"] += 1
    return sums.reshape(batch, filters, *out)


def matmul(left: Any, right: Any) -> np.ndarray:
    """``left @ right`` of integer arrays, exact, as float64."""
    left, right = np.asarray(left), np.asarray(right)
    if not (_fast(left, right) and left.ndim >= 2 and right.ndim >= 2
            and left.shape[-1] == right.shape[-2]):
        PATHS["float64"] += 1
        return np.matmul(np.asarray(left, dtype=np.float64), np.asarray(right, dtype=np.float64))
    if right.ndim == 2:  # one right operand: every left row in one product
        product = gemm_int8.multiply(left.reshape(-1, left.shape[-1]), _packed_weights(right))
        PATHS["vnni"] += 1
        return product.astype(np.float64).reshape(*left.shape[:-1], right.shape[-1])
    shape = np.broadcast_shapes(left.shape[:-2], right.shape[:-2])
    lefts = np.broadcast_to(left, (*shape, *left.shape[-2:])).reshape(-1, *left.shape[-2:])
    rights = np.broadcast_to(right, (*shape, *right.shape[-2:])).reshape(-1, *right.shape[-2:])
    sums = np.empty((len(lefts), left.shape[-2], right.shape[-1]), np.float64)
    for index, (one_left, one_right) in enumerate(zip(lefts, rights, strict=True)):
        sums[index] = gemm_int8.multiply(one_left, _packed_weights(one_right))
    PATHS["vnni"] += 1
    return sums.reshape(*shape, left.shape[-2], right.shape[-1])


def _packed_weights(matrix: np.ndarray) -> gemm_int8.PackedWeights:
    """``matrix`` (K, N) packed; kept while the array under it lives where it is read-only
    (the weights of a plan or a bound node), so that each is packed once."""
    root = matrix
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root.flags.writeable:
        return gemm_int8.PackedWeights(matrix)
    key = (id(root), matrix.__array_interface__["data"][0], matrix.shape, matrix.strides)
    kept = _packed.get(key)
    if kept is not None and kept[0]() is root:
        return kept[1]
    packed = gemm_int8.PackedWeights(matrix)
    _packed[key] = (weakref.ref(root, lambda _, key=key: _packed.pop(key, None)), packed)
    return packed
