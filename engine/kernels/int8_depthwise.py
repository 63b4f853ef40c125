"""A quantized depthwise 2-d convolution (one filter per channel) as `spin_pool` jobs, in the
shape of `int8_conv.FusedConv`: the data laid channels-last once (`int8_conv`'s pass), then
chunk by chunk of output positions the int32 sums of each window, all channels of a position
at once (a vector along the channels), and `int8_conv`'s requantize pass into the int8/uint8
output.

Signed data is shifted onto uint8 by the channels-last pass (as for the GEMM); each channel's
sum gets ``128 · Σ w`` taken back off, so the sums are the exact ones NumPy's int32 path
(`integer._depthwise`) makes, and the outputs its bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.cpu import compiled, kernel_jobs
from engine.kernels import int8_conv
from engine.kernels.int8_conv import ACTIVATIONS, Epilogue, EpilogueLayer, Geometry

_kernels: dict[str, Any] = {}
# Output positions per chunk: their sums (int32, one per channel) stay in L2 for the
# requantize pass.
CHUNK_BYTES = 2 ** 18


def supported(data: np.ndarray, weight: np.ndarray, groups: int) -> bool:
    """Whether this module runs the convolution: int8/uint8 data of 4 axes, one int8 filter
    per channel, and the compiled pieces present."""
    return (data.ndim == 4 and data.dtype in (np.uint8, np.int8) and weight.dtype == np.int8
            and weight.ndim == 4 and groups == data.shape[1] == weight.shape[0]
            and weight.shape[1] == 1 and int8_conv.supported_here())


class FusedDepthwise(EpilogueLayer):
    """``data`` (N, C, H, W) convolved channel by channel with ``weight`` (C, 1, kh, kw),
    requantized into ``out`` (N, C, OH, OW) int8/uint8, ``residual`` added where given; the
    arrays are the plan's buffers, bound into the jobs once per thread."""

    def __init__(self, data: np.ndarray, weight: np.ndarray, geometry: Geometry,
                 out: np.ndarray, residual: np.ndarray | None = None) -> None:
        batch, channels, height, width = data.shape
        out_h, out_w = geometry.out_size(height, width)
        super().__init__("int8 depthwise convolution", out, residual,
                         (batch, channels, out_h, out_w))
        self.data, self.geometry = data, geometry
        self.rows, self.positions = batch * out_h * out_w, out_h * out_w
        # (kh · kw, C): a kernel offset's weights for every channel, in a row
        self.taps = np.ascontiguousarray(weight.reshape(channels, -1).T.astype(np.int32))
        signed = data.dtype == np.int8
        self.shift = (-128 * weight.reshape(channels, -1).sum(axis=1, dtype=np.int64)
                      if signed else np.zeros(channels, np.int64)).astype(np.int32)

    def _bind(self, epilogue: Epilogue) -> tuple[Any, ...]:
        data, geometry = self.data, self.geometry
        batch, channels, height, width = data.shape
        padded_h = height + 2 * geometry.pad[0]
        padded_w = width + 2 * geometry.pad[1]
        out_h, out_w = self.out.shape[2:]
        scratch = int8_conv.arena()
        padded = scratch.take("channels_last", batch * padded_h * padded_w * channels, np.uint8)
        chunk = max(1, min(self.rows, CHUNK_BYTES // (4 * channels)))
        sums = scratch.take("sums", chunk * channels, np.int32).reshape(chunk, channels)
        lay = kernel_jobs.bind((int8_conv.__name__, "channels_last"), (
            data.reshape(-1).view(np.uint8), 128 if data.dtype == np.int8 else 0, channels,
            height, width, geometry.pad[0], geometry.pad[1], padded, padded_h, padded_w),
            batch * padded_h, kernel_jobs.parts_for(batch * padded_h, 2 * padded.size))
        residual = self.residual if self.residual is not None else np.zeros(1, np.int8)
        out = self.out.reshape(-1)
        jobs = [lay]
        for first in range(0, self.rows, chunk):
            count = min(chunk, self.rows - first)
            jobs.append(kernel_jobs.bind((__name__, "window_sums"), (
                padded, channels, padded_h, padded_w, out_h, out_w, *geometry.kernel,
                *geometry.stride, *geometry.dilate, self.taps, self.shift, first, sums),
                count, kernel_jobs.parts_for(count, 2 * count * self.taps.size)))
            jobs.append(kernel_jobs.bind((int8_conv.__name__, "requantize"), (
                sums, self.bias, self.scales, ACTIVATIONS[epilogue.act], np.float32(
                    epilogue.act_high), residual.reshape(-1), int(self.residual is not None),
                np.float32(epilogue.residual_scale), ACTIVATIONS[epilogue.postsum_act],
                np.float32(epilogue.postsum_high), epilogue.low, epilogue.high, out,
                channels, self.positions, first), count,
                kernel_jobs.parts_for(count, 3 * count * channels)))
        if any(job is None for job in jobs):
            raise RuntimeError("int8 depthwise convolution: a job could not be bound")
        return tuple(jobs)


def compiled_kernels() -> dict[str, Any]:
    """The kernel by name (`kernel_jobs` runs it as jobs), compiled on first use."""
    return compiled.compiled_once(_kernels, lambda: {
        "window_sums": compiled.compile_kernel(_window_sums)})


def _window_sums(padded: Any, channels: int, padded_h: int, padded_w: int, out_h: int,
                 out_w: int, kernel_h: int, kernel_w: int, stride_h: int, stride_w: int,
                 dilate_h: int, dilate_w: int, taps: Any, shift: Any, offset: int, sums: Any,
                 first: int, last: int) -> None:  # pragma: no cover - runs compiled
    """Rows [first, last) of ``sums`` (positions ``offset + row``, C sums each): each
    channel's window of ``padded`` (N, padded_h, padded_w, C, uint8) times its taps, plus
    ``shift`` (the signed data's compensation). Unsigned offsets: numba skips its
    negative-index checks and the channel loop vectorises."""
    positions = out_h * out_w
    depth = np.uint64(channels)
    for row in range(first, last):
        at = offset + row
        image = at // positions
        y = (at - image * positions) // out_w
        x = at - image * positions - y * out_w
        line = np.uint64(row)
        for c in range(depth):
            sums[line, c] = shift[c]
        tap = np.uint64(0)
        for ky in range(kernel_h):
            base = (image * padded_h + y * stride_h + ky * dilate_h) * padded_w
            for kx in range(kernel_w):
                source = np.uint64(base + x * stride_w + kx * dilate_w) * depth
                for c in range(depth):
                    sums[line, c] += np.int32(padded[source + c]) * taps[tap, c]
                tap += np.uint64(1)
