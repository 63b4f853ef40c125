"""2-D max pooling of int8/uint8 values as one compiled pass, `spin_pool` jobs over the cores:
an int8 graph's max pooling between two quantized convolutions (ResNet's 3×3 stride 2 after the
stem), which reads and writes either layout of the channels-last hand-off; and a network
head's global average of int8/uint8 values, each channel's exact sum scaled into int8/uint8
(`global_average_job`).

The largest of quantized values is the quantized largest value (quantization is monotone), so
the result is exact and keeps its input's range. Each output pixel takes the channel-wise
maximum of its window's pixels, cells outside the input left out (the type's lowest where none
is inside, as the float op's -inf); with the input channels-last a pixel's channels are one
contiguous run, so the inner loop is a vector maximum of bytes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from engine.cpu import compiled, kernel_jobs, spin_pool

_kernels: dict[str, Any] = {}
# Channels of one image a global average's part sums at a time: a cache line of each position
# laid channels-last. At batch 1 the job's parts are then blocks of channels, not images, so
# the head's average runs on every core, each thread summing (the caller from the front) the
# channels its share of the product before wrote where that product shared out its panels.
CHANNEL_BLOCK = 64


class Window(NamedTuple):
    """A pooling's 2-D kernel, stride and padding, (y, x) each."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    pad: tuple[int, int]


def available() -> bool:
    """Whether the pass compiles here (numba and the spin pool)."""
    return compiled.available() and spin_pool.available()


def _strides(shape: tuple[int, ...], channels_last: bool) -> tuple[int, int, int, int]:
    """Element strides (n, c, y, x) of an (N, C, H, W) array whose buffer holds it NCHW, or
    NHWC where ``channels_last``."""
    _, channels, height, width = shape
    if channels_last:
        return height * width * channels, 1, width * channels, channels
    return channels * height * width, height * width, width, 1


def max_pool_job(values: np.ndarray, window: Window, out: np.ndarray, data_laid: bool,
                 out_laid: bool) -> Any:
    """A job writing ``out`` (N, C, OH, OW) = the max pooling of ``values`` (N, C, H, W), both
    int8 or both uint8, each buffer holding its bytes channels-last (N, H, W, C) where
    ``data_laid`` / ``out_laid`` say so, NCHW otherwise. None where it cannot be bound."""
    if (values.ndim != 4 or out.ndim != 4 or values.dtype not in (np.int8, np.uint8)
            or out.dtype != values.dtype or out.shape[:2] != values.shape[:2]):
        raise ValueError(f"int8 max pooling: {values.dtype} {values.shape} into {out.dtype} "
                         f"{out.shape}")
    (kernel_y, kernel_x), (stride_y, stride_x), (pad_y, pad_x) = window
    batch, channels, height, width = values.shape
    out_height, out_width = out.shape[2:]
    lowest = int(np.iinfo(values.dtype).min)
    rows = batch * out_height
    return kernel_jobs.bind((__name__, "max_pool"), (
        values.reshape(-1), channels, height, width, *_strides(values.shape, data_laid),
        kernel_y, kernel_x, stride_y, stride_x, pad_y, pad_x, lowest,
        out.reshape(-1), out_height, out_width, *_strides(out.shape, out_laid)),
        rows, kernel_jobs.parts_for(rows, values.size + out.size))


def global_average_job(values: np.ndarray, factor: np.ndarray, out: np.ndarray,
                       data_laid: bool) -> Any:
    """A job writing ``out`` (N, C, 1, 1) int8/uint8 = saturate(rint(float32(sum) ·
    ``factor[0]``)) of each image's channel sums of ``values`` (N, C, H, W) int8/uint8, its
    buffer channels-last where ``data_laid``; ``factor`` (float32, one value) is read at each
    run. The sums are exact in int32 and in float32 (H · W · 255 under 2²⁴)."""
    batch, channels, height, width = values.shape
    if (values.dtype not in (np.int8, np.uint8) or out.dtype not in (np.int8, np.uint8)
            or out.shape != (batch, channels, 1, 1) or factor.dtype != np.float32
            or factor.shape != (1,) or height * width * 255 >= 2 ** 24):
        raise ValueError(f"int8 global average: {values.dtype} {values.shape} into "
                         f"{out.dtype} {out.shape} with a {factor.dtype} {factor.shape} factor")
    limits = np.iinfo(out.dtype)
    units = batch * -(-channels // CHANNEL_BLOCK)  # (image, block of channels)
    return kernel_jobs.bind((__name__, "global_average"), (
        values.reshape(-1), channels, height * width, int(data_laid), factor,
        int(limits.min), int(limits.max), out.reshape(-1)), units,
        kernel_jobs.parts_for(units, values.size))


def compiled_kernels() -> dict[str, Any]:
    """The kernels by name (`kernel_jobs` runs them as jobs), compiled on first use."""
    return compiled.compiled_once(_kernels, lambda: {
        "max_pool": compiled.compile_kernel(_max_pool),
        "global_average": compiled.compile_kernel(_global_average),
    })


def _global_average(values: Any, channels: int, positions: int, laid: int, factor: Any,
                    low: int, high: int, out: Any, first: int,
                    last: int) -> None:  # pragma: no cover - runs compiled
    """Units [first, last), image by image, each image's channels in blocks of
    `CHANNEL_BLOCK`: channels-last, each position's run of the block's channels added into
    the sums in one vector pass; NCHW, each channel's positions in turn."""
    sums = np.zeros(CHANNEL_BLOCK, np.int32)
    lowest, highest = np.float32(low), np.float32(high)
    depth, count = np.uint64(channels), np.uint64(positions)
    blocks = (channels + CHANNEL_BLOCK - 1) // CHANNEL_BLOCK
    for unit in range(first, last):
        image = unit // blocks
        start = np.uint64((unit - image * blocks) * CHANNEL_BLOCK)
        width = min(np.uint64(CHANNEL_BLOCK), depth - start)
        base = np.uint64(image) * depth * count
        for c in range(width):
            sums[c] = 0
        if laid:
            for p in range(count):
                at = base + p * depth + start
                for c in range(width):
                    sums[c] += np.int32(values[at + c])
        else:
            for c in range(width):
                at = base + (start + c) * count
                total = np.int32(0)
                for p in range(count):
                    total += np.int32(values[at + p])
                sums[c] = total
        scale = factor[0]
        target = np.uint64(image) * depth + start
        for c in range(width):
            value = np.rint(np.float32(sums[c]) * scale)
            out[target + c] = np.int32(min(max(value, lowest), highest))


def _max_pool(values: Any, channels: int, height: int, width: int, in_n: int, in_c: int,
              in_y: int, in_x: int, kernel_y: int, kernel_x: int, stride_y: int,
              stride_x: int, pad_y: int, pad_x: int, lowest: int, out: Any, out_height: int,
              out_width: int, out_n: int, out_c: int, out_y: int, out_x: int, first: int,
              last: int) -> None:  # pragma: no cover - runs compiled
    """Output rows [first, last) (every image's rows in turn). Channels-last data is first
    reduced over the window's rows, one long vector pass along the row, then over the
    window's columns a pixel's channels at a time: three short loops a pixel, not nine.
    Each reduction starts from its first row or column's values, not from ``lowest``, and
    a channels-last output pixel is reduced where it lies: no pass to fill, none to copy."""
    best = np.empty(channels, values.dtype)
    depth = np.uint64(channels)
    span = np.uint64(width * channels)
    column = np.empty(width * channels, values.dtype)  # the window rows' maximum, laid out
    for row in range(first, last):
        image = row // out_height
        oy = row - image * out_height
        top = oy * stride_y - pad_y
        y_first, y_last = max(top, 0), min(top + kernel_y, height)
        if in_c == 1:
            if y_first < y_last:
                at = np.uint64(image * in_n + y_first * in_y)
                for j in range(span):
                    column[j] = values[at + j]
            else:
                for j in range(span):
                    column[j] = lowest
            for y in range(y_first + 1, y_last):
                at = np.uint64(image * in_n + y * in_y)
                for j in range(span):
                    column[j] = max(column[j], values[at + j])
        for ox in range(out_width):
            left = ox * stride_x - pad_x
            x_first, x_last = max(left, 0), min(left + kernel_x, width)
            target = np.uint64(image * out_n + oy * out_y + ox * out_x)
            if in_c == 1 and out_c == 1:
                if x_first < x_last:
                    at = np.uint64(x_first) * depth
                    for c in range(depth):
                        out[target + c] = column[at + c]
                else:
                    for c in range(depth):
                        out[target + c] = lowest
                for x in range(x_first + 1, x_last):
                    at = np.uint64(x) * depth
                    for c in range(depth):
                        out[target + c] = max(out[target + c], column[at + c])
                continue
            for c in range(depth):
                best[c] = lowest
            if in_c == 1:
                for x in range(x_first, x_last):
                    at = np.uint64(x) * depth
                    for c in range(depth):
                        best[c] = max(best[c], column[at + c])
            else:
                step = np.uint64(in_c)
                for y in range(y_first, y_last):
                    for x in range(x_first, x_last):
                        at = np.uint64(image * in_n + y * in_y + x * in_x)
                        for c in range(depth):
                            best[c] = max(best[c], values[at + c * step])
            if out_c == 1:
                for c in range(depth):
                    out[target + c] = best[c]
            else:
                step = np.uint64(out_c)
                for c in range(depth):
                    out[target + c * step] = best[c]
