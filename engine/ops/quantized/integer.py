"""Integer products: convolution and matrix products of int8/uint8 arrays, accumulated exactly.

Where the host has AVX-512 VNNI, int8 weights times uint8 or int8 data run on our int8 GEMM
(`engine.kernels.gemm_int8`: ``vpdpbusd``, int32 sums; on AMX's ``tdpbusd`` where the host
has AMX-INT8 and a product is long enough, `_uses_amx`), the weights packed once while their
array lives (`_packed`, for read-only weights: a plan's parameters and the int8 weights a bound
node keeps). Otherwise, and for float operands, the products run as float64 BLAS calls: every
int8 x int8 sum a layer makes stays far below 2**53, so float64 holds it exactly, as oneDNN's
int32 accumulators do (short of their own overflow, which a calibrated model never reaches).
Either way the caller gets the same float64 sums, bit for bit. ``PATHS`` counts the products
each path ran (tests assert the fast path was taken).

Grouped convolutions with fewer than 16 filters per group (depthwise layers) stay on float64
batched matmul: a 16-column panel per group would be mostly padding. So do matrix products
below ``MIN_WORK`` multiply-adds, where the call's fixed cost exceeds BLAS's whole time.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engine.cpu import steady_walk
from engine.errors import ShapeError
from engine.kernels import gemm_int8

PATHS: Counter = Counter()
steady_walk.counters(PATHS)  # a replayed run counts its steps' paths as recorded
# Below this many multiply-adds a product's fixed cost on the VNNI path (about 10 µs: the
# padded copy, the result's allocation, the foreign call) exceeds float64 BLAS's whole time.
MIN_WORK = 2 ** 19
CONVERSION_WORK = 8
_settings = {"fast": True, "min_work": MIN_WORK}
_packed: dict[tuple, tuple[Any, gemm_int8.PackedWeights]] = {}
_MIN_GROUP_FILTERS = 16
AMX_MIN_DEPTH, AMX_MIN_ROWS = 256, 32


def use_fast_path(enabled: bool, min_work: int = MIN_WORK) -> None:
    """Turn the VNNI path on or off (benchmarks compare the two; on by default), and set the
    smallest product it takes (``m·k·n``; tests pass 0 to run every product on it)."""
    _settings["fast"], _settings["min_work"] = enabled, min_work


def fast_path_enabled() -> bool:
    """Whether `use_fast_path` left the compiled int8 paths on."""
    return _settings["fast"]


steady_walk.switch(fast_path_enabled)  # a plan's steady runs differ with it


def _fast(data: Any, weight: Any, work: int, depth: int) -> bool:
    """Whether a product of K = ``depth`` runs on the int8 GEMM: past `gemm_int8.EXACT_DEPTH`
    its int32 sums could leave int32 where float64's do not."""
    return (_settings["fast"] and data.dtype in (np.uint8, np.int8) and weight.dtype == np.int8
            and work >= _settings["min_work"] and depth <= gemm_int8.EXACT_DEPTH
            and gemm_int8.available())


def conv(data: Any, weight: Any, kernel: tuple[int, ...], stride: tuple[int, ...],
         dilate: tuple[int, ...], pad: tuple[int, ...], groups: int) -> np.ndarray:
    """``(N, F, *out)`` exact sums of ``data`` (N, C, *spatial) convolved with ``weight``
    (F, C / groups, *kernel), as float64."""
    data, weight = np.asarray(data), np.asarray(weight)
    channels, filters = data.shape[1], weight.shape[0]
    if channels % groups or filters % groups or weight.shape[1] * groups != channels:
        raise ShapeError(f"quantized convolution: weight {weight.shape} does not fit "
                         f"{channels} input channels in {groups} groups")
    # No smallest size here: the float64 path's patches cost more than the VNNI path's whole
    # product even at a few thousand multiply-adds.
    if _fast(data, weight, _settings["min_work"], weight[0].size) and (
            groups == 1 or filters // groups >= _MIN_GROUP_FILTERS):
        return _fast_conv(data, weight, kernel, stride, dilate, pad, groups)
    if (data.dtype in (np.uint8, np.int8) and weight.dtype == np.int8 and groups == channels
            and _settings["fast"]):
        return _depthwise(data, weight, kernel, stride, dilate, pad)
    PATHS["float64"] += 1
    values = np.pad(np.asarray(data, dtype=np.float64),
                    [(0, 0), (0, 0), *((p, p) for p in pad)])
    patches, out = _patches(values, kernel, stride, dilate, groups)
    batch = data.shape[0]
    patches = patches.reshape(batch, groups, -1, patches.shape[-1])
    matrix = np.asarray(weight, dtype=np.float64).reshape(groups, filters // groups, -1)
    sums = np.matmul(patches, matrix.transpose(0, 2, 1))  # (N, G, rows, F/G)
    return sums.transpose(0, 1, 3, 2).reshape(batch, filters, *out)


def _depthwise(data: np.ndarray, weight: np.ndarray, kernel: tuple[int, ...],
               stride: tuple[int, ...], dilate: tuple[int, ...], pad: tuple[int, ...]
               ) -> np.ndarray:
    """A depthwise convolution of int8/uint8 data as int32 multiply-adds, one per kernel
    offset over the whole batch: exact (a window's sum of 255 · 128 products stays far inside
    int32), where a batched matmul of one-column products spends its time on calls."""
    channels, filters = data.shape[1], weight.shape[0]
    values = np.zeros((*data.shape[:2], *(s + 2 * p for s, p in zip(
        data.shape[2:], pad, strict=True))), np.int32)
    values[(slice(None), slice(None), *(slice(p, p + s) for s, p in zip(
        data.shape[2:], pad, strict=True)))] = data
    if filters != channels:  # a channel multiplier: each channel read by filters / C filters
        values = np.repeat(values, filters // channels, axis=1)
    out = tuple((size - (k - 1) * d - 1) // s + 1 for size, k, s, d in zip(
        values.shape[2:], kernel, stride, dilate, strict=True))
    taps = weight.reshape(filters, -1).astype(np.int32)
    sums = np.zeros((data.shape[0], filters, *out), np.int32)
    spread = (1, filters) + (1,) * len(kernel)
    for index, offset in enumerate(itertools.product(*(range(k) for k in kernel))):
        window = values[(slice(None), slice(None), *(slice(o * d, o * d + (n - 1) * s + 1, s)
                                                     for o, d, n, s in zip(
                                                         offset, dilate, out, stride,
                                                         strict=True)))]
        sums += window * taps[:, index].reshape(spread)
    PATHS["int32_depthwise"] += 1
    return sums.astype(np.float64)


def _windows(values: np.ndarray, kernel: tuple[int, ...], stride: tuple[int, ...],
             dilate: tuple[int, ...], groups: int) -> np.ndarray:
    """The convolution's windows of padded ``values`` as a view (N, G, *out, C/G, *kernel):
    one row of patches per output position and group."""
    spatial = len(kernel)
    reach = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilate, strict=True))
    windows = sliding_window_view(values, reach, axis=tuple(range(2, 2 + spatial)))
    picks = (slice(None), slice(None),
             *(slice(None, None, s) for s in stride), *(slice(None, None, d) for d in dilate))
    windows = windows[picks]  # (N, C, *out, *kernel)
    batch, channels = windows.shape[:2]
    out = windows.shape[2:2 + spatial]
    windows = windows.reshape(batch, groups, channels // groups, *out, *kernel)
    order = (0, 1, *range(3, 3 + spatial), 2, *range(3 + spatial, 3 + 2 * spatial))
    return windows.transpose(order)


def _patches(values: np.ndarray, kernel: tuple[int, ...], stride: tuple[int, ...],
             dilate: tuple[int, ...], groups: int) -> tuple[np.ndarray, tuple[int, ...]]:
    windows = _windows(values, kernel, stride, dilate, groups)
    out = windows.shape[2:2 + len(kernel)]
    return windows.reshape(*windows.shape[:2], -1, int(np.prod(windows.shape[2 + len(kernel):]))
                           ), out


def _fast_conv(data: np.ndarray, weight: np.ndarray, kernel: tuple[int, ...],
               stride: tuple[int, ...], dilate: tuple[int, ...], pad: tuple[int, ...],
               groups: int) -> np.ndarray:
    """The VNNI path. The data is laid channels-last once (padded, and shifted onto uint8
    where signed), and each row of patches is ordered (*kernel, C): one copy per kernel
    offset, of runs of C contiguous bytes, into the kernel's padded rows. The weights are
    packed in the same K order (integer sums do not depend on it)."""
    signed = data.dtype == np.int8
    batch, channels, spatial = data.shape[0], data.shape[1], len(kernel)
    sizes = tuple(s + 2 * p for s, p in zip(data.shape[2:], pad, strict=True))
    last = np.full((batch, *sizes, channels), 128 if signed else 0, np.uint8)
    inner = last[(slice(None), *(slice(p, p + s) for s, p in zip(
        data.shape[2:], pad, strict=True)), slice(None))]
    moved = np.moveaxis(data.view(np.uint8), 1, -1)
    if signed:  # + 128: the top bit flipped
        np.bitwise_xor(moved, np.uint8(0x80), out=inner)
    else:
        inner[...] = moved
    out = tuple((size - (k - 1) * d - 1) // s + 1 for size, k, s, d in zip(
        sizes, kernel, stride, dilate, strict=True))
    positions = math.prod(out)
    filters = weight.shape[0]
    per_group, per_channels = filters // groups, channels // groups
    sums = np.empty((batch, groups, per_group, positions), np.float64)
    for group in range(groups):
        filters_of_group = weight[group * per_group:(group + 1) * per_group]
        packed = packed_weights(weight, batch * positions, ("channels_last", group),
                                 lambda part=filters_of_group: np.moveaxis(part, 1, -1)
                                 .reshape(len(part), -1).T)
        rows = gemm_int8.padded_rows(batch * positions, packed)
        target = rows[:batch * positions, :packed.k].reshape(batch, *out, *kernel,
                                                             per_channels)
        if not np.shares_memory(target, rows):  # a reshape that copied would lose the writes
            raise RuntimeError("quantized convolution: patch rows are not a view")
        for offset in itertools.product(*(range(k) for k in kernel)):
            source = last[(slice(None), *(slice(o * d, o * d + (n - 1) * s + 1, s) for o, d, n, s
                                          in zip(offset, dilate, out, stride, strict=True)),
                           slice(group * per_channels, (group + 1) * per_channels))]
            target[(slice(None), *(slice(None),) * spatial, *offset)] = source
        product = gemm_int8.multiply_rows(rows, batch * positions, packed, signed)
        np.copyto(sums[:, group], product.reshape(batch, positions, per_group).transpose(0, 2, 1))
    PATHS["int8_gemm"] += 1
    return sums.reshape(batch, filters, *out)


def matmul(left: Any, right: Any) -> np.ndarray:
    """``left @ right`` of integer arrays, exact, as float64."""
    left, right = np.asarray(left), np.asarray(right)
    work = math.prod(left.shape) * right.shape[-1] if left.ndim and right.ndim > 1 else 0
    if right.ndim > 2:  # the right operands are packed per call: a product must pay for it
        work //= 4 * math.prod(right.shape[:-2])
    elif right.ndim == 2:  # packed once, where float64 converts it on every call (each
        # value costing about 8 multiply-adds of BLAS: ResNet-18's classifier at batch 1,
        # 1 × 512 × 1000, took 3 ms as float64 and 0.05 on VNNI)
        work += CONVERSION_WORK * right.size
    depth = left.shape[-1] if left.ndim else 0
    if not (_fast(left, right, work, depth) and left.ndim >= 2 and right.ndim >= 2
            and left.shape[-1] == right.shape[-2]):
        PATHS["float64"] += 1
        return np.matmul(np.asarray(left, dtype=np.float64), np.asarray(right, dtype=np.float64))
    if right.ndim == 2:  # one right operand: every left row in one product
        rows = left.reshape(-1, left.shape[-1])
        product = gemm_int8.multiply(rows, packed_weights(right, len(rows)))
        PATHS["int8_gemm"] += 1
        return product.astype(np.float64).reshape(*left.shape[:-1], right.shape[-1])
    shape = np.broadcast_shapes(left.shape[:-2], right.shape[:-2])
    lefts = np.broadcast_to(left, (*shape, *left.shape[-2:])).reshape(-1, *left.shape[-2:])
    rights = np.broadcast_to(right, (*shape, *right.shape[-2:])).reshape(-1, *right.shape[-2:])
    sums = np.empty((len(lefts), left.shape[-2], right.shape[-1]), np.float64)
    for index, (one_left, one_right) in enumerate(zip(lefts, rights, strict=True)):
        sums[index] = gemm_int8.multiply(one_left, packed_weights(one_right, len(one_left)))
    PATHS["int8_gemm"] += 1
    return sums.reshape(*shape, left.shape[-2], right.shape[-1])


def _uses_amx(rows: int, depth: int, min_depth: int | None = None) -> bool:
    """Whether a product of ``rows`` rows and K = ``depth`` runs on AMX rather than VNNI: AMX
    computes 32 rows and 64 K values at a time, which pays from K 256 and 32 rows
    (`bench/int8.py`: 1.2-2.6x VNNI's throughput there, 0.8x at K 64 or 2 rows); from K
    ``min_depth`` where the caller knows better."""
    least = AMX_MIN_DEPTH if min_depth is None else min_depth
    return depth >= least and rows >= AMX_MIN_ROWS and gemm_int8.amx_available()


def packed_weights(source: np.ndarray, rows: int, layout: Any = None,
                   matrix: Callable[[], np.ndarray] | None = None,
                   min_depth: int | None = None,
                   empty: Callable[[tuple[int, ...], Any], np.ndarray] | None = None
                   ) -> gemm_int8.PackedWeights:
    """The (K, N) int8 matrix ``matrix()`` (``source`` itself without it) packed for a product
    of ``rows`` rows (for AMX or VNNI, `_uses_amx` with ``min_depth``); kept, under
    ``layout``, while the array under ``source`` lives where that array is read-only (the
    weights of a plan or a bound node), so that each is packed once. ``empty``: where the
    packing's arrays are made (`gemm_int8.PackedWeights`; a plan's `int8_memory`)."""
    depth = source.shape[0] if matrix is None else source[0].size
    amx = _uses_amx(rows, depth, min_depth)
    layout = (layout, amx)
    root = source
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root.flags.writeable:
        return gemm_int8.PackedWeights(source if matrix is None else matrix(), amx, empty)
    key = (id(root), source.__array_interface__["data"][0], source.shape, source.strides,
           layout)
    kept = _packed.get(key)
    if kept is not None and kept[0]() is root:
        return kept[1]
    packed = gemm_int8.PackedWeights(source if matrix is None else matrix(), amx, empty)
    _packed[key] = (weakref.ref(root, lambda _, key=key: _packed.pop(key, None)), packed)
    return packed
