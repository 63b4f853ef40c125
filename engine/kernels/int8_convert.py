"""float32 to int8/uint8 and back as one compiled pass each, `spin_pool` jobs over the cores:
the quantize and dequantize steps between an int8 graph's float and integer layers.

NumPy's forms (`engine.ops.quantized.convert`) take four passes to quantize (scale, round,
clip, convert) and two to dequantize; these take one, with the same float32 arithmetic (one
float32 product, rounding half to even, saturation), so the bytes are the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.cpu import compiled, kernel_jobs, llvm_jit, spin_pool

_kernels: dict[str, Any] = {}


def available() -> bool:
    """Whether the passes compile here (numba and the spin pool)."""
    return compiled.available() and spin_pool.available()


def quantize_job(values: np.ndarray, scale: np.ndarray, low: int, high: int,
                 out: np.ndarray) -> Any:
    """A job writing ``out`` (int8/uint8) = ``values`` (float32) · ``scale[0]`` rounded half to
    even and saturated to [``low``, ``high``]; ``scale`` (float32, one value) is read at each
    run. None where it cannot be bound."""
    flat, target = values.reshape(-1), out.reshape(-1)
    if flat.dtype != np.float32 or target.size != flat.size or scale.dtype != np.float32:
        raise ValueError(f"int8 quantize: {values.dtype} {values.shape} into {out.dtype} "
                         f"{out.shape} with a {scale.dtype} scale")
    return kernel_jobs.bind((__name__, "quantize"), (flat, scale, low, high, target),
                            flat.size, kernel_jobs.parts_for(flat.size, 2 * flat.size))


def quantize_channels_last_job(values: np.ndarray, scale: np.ndarray, low: int, high: int,
                               out: np.ndarray) -> Any:
    """`quantize_job` writing ``values`` (float32, (N, C, H, W)) into ``out`` (int8/uint8 of
    the same shape) with its bytes channels-last (N, H, W, C): the layout the channels-last
    hand-off gives quantized convolutions."""
    if (values.ndim != 4 or values.dtype != np.float32 or out.shape != values.shape
            or out.dtype not in (np.int8, np.uint8) or scale.dtype != np.float32):
        raise ValueError(f"int8 quantize: {values.dtype} {values.shape} channels-last into "
                         f"{out.dtype} {out.shape} with a {scale.dtype} scale")
    batch, channels, height, width = values.shape
    rows = batch * height
    task = vector_task(channels)
    if task is not None and values.flags.c_contiguous and out.flags.c_contiguous:
        bounds = [np.float64(bound).view(np.int64) for bound in (low, high)]
        context = np.array([values.ctypes.data, out.ctypes.data, scale.ctypes.data, rows,
                            height, width, *bounds], np.int64)
        return spin_pool.job(task, context, kernel_jobs.parts_for(rows, 2 * values.size),
                             keep=(values, scale, out))
    return kernel_jobs.bind((__name__, "quantize_channels_last"), (
        values.reshape(-1), scale, low, high, channels, height, width, out.reshape(-1)),
        rows, kernel_jobs.parts_for(rows, 2 * values.size))


def point_at(job: spin_pool.Job, address: int) -> None:
    """``job`` (`quantize_job`'s or `quantize_channels_last_job`'s) reading its values at
    ``address`` from now on: an array of the values' shape and dtype, C-contiguous (a plan's
    input read where the caller's array lies). The values' address is its context's first
    word in either form."""
    job.keep[0][0] = address


def vector_task(channels: int) -> int | None:
    """The address of `int8_convert_ir`'s channels-last quantize of ``channels`` planes
    (an image's few: 16 pixels a step, the channels' bytes interleaved by one shuffle);
    None for more channels, or where it cannot be compiled here (no AVX2, no
    llvmlite or no JIT): numba's pass, one pixel's bytes at a time, runs instead."""
    from engine.kernels import int8_convert_ir

    if not 0 < channels <= int8_convert_ir.MOST_CHANNELS:
        return None
    return _vector.address(int8_convert_ir.task_name(channels))


def _vector_module() -> Any:
    from engine.kernels import int8_convert_ir

    return int8_convert_ir.module()


# `int8_convert_ir`, compiled once: its AVX-512 variant or its generic one, from AVX2 on
_vector = llvm_jit.HostModule(_vector_module, "avx2")


def vector_available() -> bool:
    """Whether `int8_convert_ir`'s tasks compiled here."""
    return vector_task(1) is not None


def dequantize_job(values: np.ndarray, step: np.ndarray, out: np.ndarray) -> Any:
    """A job writing ``out`` (float32) = ``values`` (int8/uint8/int32) as float32 times
    ``step[0]`` (float32, read at each run). None where it cannot be bound."""
    flat, target = values.reshape(-1), out.reshape(-1)
    if target.dtype != np.float32 or target.size != flat.size or step.dtype != np.float32:
        raise ValueError(f"int8 dequantize: {values.dtype} {values.shape} into {out.dtype} "
                         f"{out.shape} with a {step.dtype} step")
    return kernel_jobs.bind((__name__, "dequantize"), (flat, step, target), flat.size,
                            kernel_jobs.parts_for(flat.size, 2 * flat.size))


def dequantize_channels_last_job(values: np.ndarray, step: np.ndarray,
                                 out: np.ndarray) -> Any:
    """`dequantize_job` for ``values`` (int8/uint8, shaped (N, C, H, W)) holding its bytes
    channels-last (N, H, W, C): ``out`` (float32, (N, C, H, W)) gets them in NCHW order."""
    if (values.ndim != 4 or values.dtype not in (np.int8, np.uint8) or out.shape != values.shape
            or out.dtype != np.float32 or step.dtype != np.float32):
        raise ValueError(f"int8 dequantize: channels-last {values.dtype} {values.shape} into "
                         f"{out.dtype} {out.shape} with a {step.dtype} step")
    batch, channels, height, width = values.shape
    return kernel_jobs.bind((__name__, "dequantize_channels_last"), (
        values.reshape(-1), step, channels, height, width, out.reshape(-1)), batch * height,
        kernel_jobs.parts_for(batch * height, 2 * values.size))


def compiled_kernels() -> dict[str, Any]:
    """The kernels by name (`kernel_jobs` runs them as jobs), compiled on first use."""
    return compiled.compiled_once(_kernels, lambda: {
        "quantize": compiled.compile_kernel(_quantize),
        "quantize_channels_last": compiled.compile_kernel(_quantize_channels_last),
        "dequantize": compiled.compile_kernel(_dequantize),
        "dequantize_channels_last": compiled.compile_kernel(_dequantize_channels_last),
    })


def _quantize(values: Any, scale: Any, low: int, high: int, out: Any, first: int,
              last: int) -> None:  # pragma: no cover - runs compiled
    factor = scale[0]
    lowest, highest = np.float32(low), np.float32(high)
    zero = np.float32(0.0)
    # unsigned indices (no negative-index checks) and selects, not branches: the loop
    # vectorises (0.13 ms against 0.71 for 800 000 values)
    for index in range(np.uint64(first), np.uint64(last)):
        value = np.rint(values[index] * factor)
        value = value if value == value else zero  # NaN: stored as NumPy stores it, zero
        value = min(max(value, lowest), highest)
        out[index] = np.int32(value)


def _quantize_channels_last(values: Any, scale: Any, low: int, high: int, channels: int,
                            height: int, width: int, out: Any, first: int,
                            last: int) -> None:  # pragma: no cover - runs compiled
    """Image rows [first, last) (every image's rows in turn): each channel's run of the
    row's positions quantized in order into a row of scratch (the loop vectorises as
    `_quantize`'s), then the row's bytes interleaved pixel by pixel into ``out``."""
    factor = scale[0]
    lowest, highest = np.float32(low), np.float32(high)
    zero = np.float32(0.0)
    depth, across = np.uint64(channels), np.uint64(width)
    plane = np.uint64(height * width)
    row_bytes = np.empty(channels * width, out.dtype)
    for row in range(first, last):
        image = row // height
        target = np.uint64(row) * across * depth  # (image, y, 0, 0) channels-last
        source = np.uint64(image) * depth * plane + np.uint64(row - image * height) * across
        for c in range(depth):
            at, into = source + c * plane, c * across
            for x in range(across):
                value = np.rint(values[at + x] * factor)
                value = value if value == value else zero  # NaN: zero, as `_quantize`
                value = min(max(value, lowest), highest)
                row_bytes[into + x] = np.int32(value)
        if channels == 3:  # an image's: the three stores a pixel unrolled
            for x in range(across):
                at = target + x * np.uint64(3)
                out[at] = row_bytes[x]
                out[at + np.uint64(1)] = row_bytes[across + x]
                out[at + np.uint64(2)] = row_bytes[across + across + x]
        else:
            for x in range(across):
                for c in range(depth):
                    out[target + x * depth + c] = row_bytes[c * across + x]


def _dequantize(values: Any, step: Any, out: Any, first: int,
                last: int) -> None:  # pragma: no cover - runs compiled
    factor = step[0]
    for index in range(np.uint64(first), np.uint64(last)):  # unsigned: it vectorises
        out[index] = np.float32(values[index]) * factor



def _dequantize_channels_last(values: Any, step: Any, channels: int, height: int, width: int,
                              out: Any, first: int, last: int
                              ) -> None:  # pragma: no cover - runs compiled
    """Image rows [first, last) (every image's rows in turn): each channel's run of the
    row's positions written in order, read ``channels`` bytes apart."""
    factor = step[0]
    depth, across = np.uint64(channels), np.uint64(width)
    plane = np.uint64(height * width)
    for row in range(first, last):
        image = row // height
        source = np.uint64(row) * across * depth  # (image, y, 0, 0) channels-last
        target = np.uint64(image) * depth * plane + np.uint64(row - image * height) * across
        for c in range(depth):
            at = target + c * plane
            for x in range(across):
                out[at + x] = np.float32(values[source + x * depth + c]) * factor
