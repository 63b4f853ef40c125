"""A per-channel scale and shift of int8/uint8 values into int8/uint8, rounded half to even
and saturated, as one compiled pass (`spin_pool` jobs over the cores): an int8 graph's
BatchNorm and the relu after it between two quantized layers (ResNet v2's pre-activation),
reading and writing either layout of the channels-last hand-off. Where data and output share a
layout it runs as `int8_affine_ir`'s LLVM IR task (16 values to a vector; AVX-512 BW's
conversions and packs, or generic operations on an AVX2 host); a change of layout runs the numba
pass.

Each value is ``x · scale[c] + shift[c]`` in float32, one product and one sum as NumPy's
form takes them, so the bytes are the same; a uint8 output's saturation at 0 is the relu.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.cpu import compiled, kernel_jobs, llvm_jit, spin_pool

_kernels: dict[str, Any] = {}


def available() -> bool:
    """Whether the pass compiles here (numba and the spin pool)."""
    return compiled.available() and spin_pool.available()


def _strides(shape: tuple[int, ...], channels_last: bool) -> tuple[int, int, int, int]:
    """Element strides (n, c, y, x) of an (N, C, H, W) array held NCHW, or NHWC where
    ``channels_last``."""
    _, channels, height, width = shape
    if channels_last:
        return height * width * channels, 1, width * channels, channels
    return channels * height * width, height * width, width, 1


def affine_job(values: np.ndarray, scale: np.ndarray, shift: np.ndarray, out: np.ndarray,
               data_laid: bool, out_laid: bool) -> Any:
    """A job writing ``out`` = saturate(rint(``values`` · scale[c] + shift[c])) for
    ``values`` and ``out`` (N, C, H, W) int8/uint8, each buffer channels-last where
    ``data_laid`` / ``out_laid`` say so; ``scale`` and ``shift`` (float32, C) are read at
    each run. None where it cannot be bound."""
    if (values.ndim != 4 or out.shape != values.shape
            or values.dtype not in (np.int8, np.uint8) or out.dtype not in (np.int8, np.uint8)
            or scale.dtype != np.float32 or shift.dtype != np.float32
            or scale.shape != (values.shape[1],) or shift.shape != scale.shape):
        raise ValueError(f"int8 affine: {values.dtype} {values.shape} into {out.dtype} "
                         f"{out.shape} with {scale.dtype} {scale.shape} scales")
    batch, channels, height, width = values.shape
    limits = np.iinfo(out.dtype)
    rows = batch * height
    if data_laid == out_laid:
        task = vector_task(values.dtype == np.int8, out.dtype == np.int8, data_laid)
        if task is not None:
            in_n, in_c, in_y, _ = _strides(values.shape, data_laid)
            out_n, out_c, out_y, _ = _strides(out.shape, out_laid)
            bounds = [np.float64(bound).view(np.int64) for bound in (limits.min, limits.max)]
            arrays = (values, out, scale, shift)
            context = np.array([array.ctypes.data for array in arrays] + [
                rows, height, width, channels, in_n, in_c, in_y, out_n, out_c, out_y,
                *bounds], np.int64)
            return spin_pool.job(task, context, kernel_jobs.parts_for(rows, 2 * values.size),
                                 keep=arrays)
    return kernel_jobs.bind((__name__, "affine"), (
        values.reshape(-1), scale, shift, channels, height, width,
        *_strides(values.shape, data_laid), int(limits.min), int(limits.max), out.reshape(-1),
        *_strides(out.shape, out_laid)), rows, kernel_jobs.parts_for(rows, 2 * values.size))


def vector_task(in_signed: bool, out_signed: bool, channels_last: bool) -> int | None:
    """The address of `int8_affine_ir`'s task for these signednesses and the shared layout;
    None where it cannot be compiled here (no AVX2, no llvmlite or no JIT)."""
    from engine.kernels import int8_affine_ir

    return _vector.address(int8_affine_ir.task_name(in_signed, out_signed, channels_last))


def _vector_module() -> Any:
    from engine.kernels import int8_affine_ir

    return int8_affine_ir.module()


# `int8_affine_ir`, compiled once: its AVX-512 variant or its generic one, from AVX2 on
_vector = llvm_jit.HostModule(_vector_module, "avx2")


def vector_available() -> bool:
    """Whether `int8_affine_ir`'s tasks compiled here."""
    return vector_task(True, True, True) is not None


def compiled_kernels() -> dict[str, Any]:
    """The kernels by name (`kernel_jobs` runs them as jobs), compiled on first use."""
    return compiled.compiled_once(_kernels, lambda: {
        "affine": compiled.compile_kernel(_affine),
    })


def _affine(values: Any, scale: Any, shift: Any, channels: int, height: int, width: int,
            in_n: int, in_c: int, in_y: int, in_x: int, low: int, high: int, out: Any,
            out_n: int, out_c: int, out_y: int, out_x: int, first: int,
            last: int) -> None:  # pragma: no cover - runs compiled
    """Image rows [first, last) (every image's rows in turn). Both sides channels-last: a
    row is one run of pixels × channels, its scales repeating each pixel; otherwise each
    channel's positions along the row in turn."""
    lowest, highest = np.float32(low), np.float32(high)
    depth, across = np.uint64(channels), np.uint64(width)
    for row in range(first, last):
        image = row // height
        y = row - image * height
        source = np.uint64(image * in_n + y * in_y)
        target = np.uint64(image * out_n + y * out_y)
        if in_c == 1 and out_c == 1:
            for x in range(across):
                at, to = source + x * depth, target + x * depth
                for c in range(depth):
                    value = np.rint(np.float32(values[at + c]) * scale[c] + shift[c])
                    out[to + c] = np.int32(min(max(value, lowest), highest))
        else:
            step_in, step_out = np.uint64(in_x), np.uint64(out_x)
            for c in range(depth):
                at = source + c * np.uint64(in_c)
                to = target + c * np.uint64(out_c)
                factor, offset = scale[c], shift[c]
                for x in range(across):
                    value = np.rint(np.float32(values[at + x * step_in]) * factor + offset)
                    out[to + x * step_out] = np.int32(min(max(value, lowest), highest))
