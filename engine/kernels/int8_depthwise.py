"""A quantized depthwise 2-d convolution (one filter per channel) as `spin_pool` jobs, in the
shape of `int8_conv.FusedConv`: the data laid channels-last once (`int8_conv`'s pass), then
chunk by chunk of output positions the int32 sums of each window, all channels of a position
at once (a vector along the channels), and `int8_conv`'s requantize pass into the int8/uint8
output.

A 3×3 window of stride 1 or 2 writing channels-last without a residual is one pass: the
vector task of `depthwise_int8_ir` where the host has AVX2 (its AVX-512 variant with AVX-512
BW; uint8 data handed over channels-last with a pad of 1 read where it lies, anything else
from the padded copy), else numba's `_window_3x3` (MobileNet v2's 17 depthwise
layers, one thread, alone, with AVX-512: 0.11–0.13 ms at 112² and 56² against numba's
0.36–0.43 with the padded copy, 0.02–0.04 against 0.04–0.14 from 28² down).

No pass here uses the int8 GEMM: the layer runs wherever numba and the spin pool do
(`available`), whether or not `int8_conv`'s convolutions can.

Signed data is shifted onto uint8 by the channels-last pass (as for the GEMM); each channel's
sum gets ``128 · Σ w`` taken back off, so the sums are the exact ones NumPy's int32 path
(`integer._depthwise`) makes, and the outputs its bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.cpu import compiled, kernel_jobs, llvm_jit, spin_pool
from engine.kernels import int8_conv, int8_memory
from engine.kernels.int8_conv import (
    ACTIVATIONS,
    OUT_CHANNELS_LAST,
    RESIDUAL,
    RESIDUAL_CHANNELS_LAST,
    Epilogue,
    EpilogueLayer,
    Geometry,
    Layouts,
)

_kernels: dict[str, Any] = {}
# Output positions per chunk: their sums (int32, one per channel) stay in L2 for the
# requantize pass.
CHUNK_BYTES = 2 ** 18
# The vector window (`depthwise_int8_ir`) adds the bias to the int32 sum (below 2²⁴ in
# magnitude): a bias within this reach cannot overflow it.
BIAS_REACH = 2 ** 31 - 2 ** 24
FLOAT_EXACT = 2 ** 24  # float32 holds every integer below this in magnitude exactly


def available() -> bool:
    """Whether the layer's passes compile here (numba and the spin pool; no GEMM)."""
    return compiled.available() and spin_pool.available()


def vector_available() -> bool:
    """Whether `depthwise_int8_ir`'s one-pass 3×3 window compiled here."""
    return _vector_task(1) is not None


def supported(data: np.ndarray, weight: np.ndarray, groups: int) -> bool:
    """Whether this module runs the convolution: int8/uint8 data of 4 axes, one int8 filter
    per channel, and the compiled pieces present."""
    return (data.ndim == 4 and data.dtype in (np.uint8, np.int8) and weight.dtype == np.int8
            and weight.ndim == 4 and groups == data.shape[1] == weight.shape[0]
            and weight.shape[1] == 1 and available())


class FusedDepthwise(EpilogueLayer):
    """``data`` (N, C, H, W) convolved channel by channel with ``weight`` (C, 1, kh, kw),
    requantized into ``out`` (N, C, OH, OW) int8/uint8, ``residual`` added where given; the
    arrays are the plan's buffers, bound into the jobs once per thread. ``laid``: which of
    them hold their values channels-last (`int8_conv.Layouts`, a hand-off's). A 3×3 window
    writing channels-last without a residual runs as one pass (`_window_3x3`)."""

    def __init__(self, data: np.ndarray, weight: np.ndarray, geometry: Geometry,
                 out: np.ndarray, residual: np.ndarray | None = None,
                 laid: Layouts | None = None, huge_pages: bool = False) -> None:
        self.laid = Layouts() if laid is None else laid
        batch, channels, height, width = data.shape
        out_h, out_w = geometry.out_size(height, width)
        super().__init__("int8 depthwise convolution", out, residual,
                         (batch, channels, out_h, out_w), huge_pages)
        self.data, self.geometry = data, geometry
        self.rows, self.positions = batch * out_h * out_w, out_h * out_w
        self.out_shape_hw = (out_h, out_w)
        # (kh · kw, C): a kernel offset's weights for every channel, in a row
        self.taps = np.ascontiguousarray(weight.reshape(channels, -1).T.astype(np.int32))
        signed = data.dtype == np.int8
        self.shift = (-128 * weight.reshape(channels, -1).sum(axis=1, dtype=np.int64)
                      if signed else np.zeros(channels, np.int64)).astype(np.int32)
        # the vector window's operands: float32, exact (|taps| ≤ 128, |shift| < 2²⁴)
        self.vector_taps = self.taps.astype(np.float32)
        self.vector_shift = self.shift.astype(np.float32)
        # the most a window's products add to or take from its start: uint8 data (the
        # vector window reads no other) times each tap's magnitude
        self.reach = 255 * np.abs(self.taps.astype(np.int64)).sum(axis=0)

    def _bind(self, epilogue: Epilogue) -> tuple[Any, ...]:
        data, geometry = self.data, self.geometry
        batch, channels, height, width = data.shape
        padded_h = height + 2 * geometry.pad[0]
        padded_w = width + 2 * geometry.pad[1]
        out_h, out_w = geometry.out_size(height, width)
        one_pass = geometry.kernel == (3, 3) and self.laid.out and self.residual is None
        if (one_pass and self.laid.data and data.dtype == np.uint8
                and geometry.pad == (1, 1)):
            # the vector window reads the channels-last data where it lies: no padded copy
            job = self._vector_job(epilogue, data, height, width, 1)
            if job is not None:
                return (job,)
        scratch = int8_memory.scratch()
        padded = scratch.take("channels_last", batch * padded_h * padded_w * channels, np.uint8,
                              self.huge_pages)
        chunk = max(1, min(self.rows, CHUNK_BYTES // (4 * channels)))
        sums = scratch.take("sums", chunk * channels, np.int32, self.huge_pages).reshape(
            chunk, channels)
        lay = kernel_jobs.bind((int8_conv.__name__, "padded_copy" if self.laid.data
                                else "channels_last"), (
            data.reshape(-1).view(np.uint8), 128 if data.dtype == np.int8 else 0, channels,
            height, width, geometry.pad[0], geometry.pad[1], padded, padded_h, padded_w),
            batch * padded_h, kernel_jobs.parts_for(batch * padded_h, 2 * padded.size))
        residual = self.residual if self.residual is not None else np.zeros(1, np.int8)
        out = self.out.reshape(-1)
        jobs = [lay]
        if one_pass:
            # one pass: each position's nine taps summed in registers, requantized and
            # written in order (MobileNet's depthwise layers; no sums go through memory)
            job = self._vector_job(epilogue, padded, padded_h, padded_w, 0)
            if job is None:
                job = kernel_jobs.bind((__name__, "window_3x3"), (
                    padded, channels, padded_h, padded_w, out_h, out_w, *geometry.stride,
                    *geometry.dilate, self.vector_taps, self.vector_shift, self.bias,
                    self.scales, ACTIVATIONS[epilogue.act], np.float32(epilogue.act_high),
                    epilogue.low, epilogue.high, out),
                    batch * out_h, kernel_jobs.parts_for(batch * out_h, 10 * self.rows * channels))
            if lay is None or job is None:
                raise RuntimeError("int8 depthwise convolution: a job could not be bound")
            return lay, job
        flags = OUT_CHANNELS_LAST if self.laid.out else 0
        if self.residual is not None:
            flags |= RESIDUAL | (RESIDUAL_CHANNELS_LAST if self.laid.residual else 0)
        for first in range(0, self.rows, chunk):
            count = min(chunk, self.rows - first)
            jobs.append(kernel_jobs.bind((__name__, "window_sums"), (
                padded, channels, padded_h, padded_w, out_h, out_w, *geometry.kernel,
                *geometry.stride, *geometry.dilate, self.taps, self.shift, first, sums),
                count, kernel_jobs.parts_for(count, 2 * count * self.taps.size)))
            jobs.append(kernel_jobs.bind((int8_conv.__name__, "requantize"), (
                sums, self.bias, self.scales, ACTIVATIONS[epilogue.act], np.float32(
                    epilogue.act_high), residual.reshape(-1), flags,
                np.float32(epilogue.residual_scale), ACTIVATIONS[epilogue.postsum_act],
                np.float32(epilogue.postsum_high), epilogue.low, epilogue.high, out,
                channels, self.positions, first), count,
                kernel_jobs.parts_for(count, 3 * count * channels)))
        if any(job is None for job in jobs):
            raise RuntimeError("int8 depthwise convolution: a job could not be bound")
        return tuple(jobs)

    def _vector_job(self, epilogue: Epilogue, source: np.ndarray, height: int, width: int,
                    pad: int) -> spin_pool.Job | None:
        """The one-pass window as `depthwise_int8_ir`'s task over the output rows, reading
        ``source`` (N, height, width, C uint8: the padded copy with ``pad`` 0, or the data
        itself with ``pad`` 1), or None where it does not apply: a stride other than 1 or 2
        on both axes, a dilation, a bias out of `BIAS_REACH`, or the task not compiled
        here."""
        geometry = self.geometry
        stride = geometry.stride[0]
        if (geometry.stride not in ((1, 1), (2, 2)) or geometry.dilate != (1, 1)
                or np.abs(self.bias.astype(np.int64)).max(initial=0) >= BIAS_REACH):
            return None
        # Where every partial sum of a window, from the shift and bias on, stays below 2²⁴ in
        # magnitude, float32 holds each exactly: the bias joins the shift and the task
        # skips the int32 round trip (three instructions an output vector, of some twenty
        # on the ports its multiply-adds use).
        start = self.shift.astype(np.int64) + self.bias.astype(np.int64)
        folded = bool((np.abs(start) + self.reach).max(initial=0) < FLOAT_EXACT)
        task = _vector_task(stride, folded)
        if task is None:
            return None
        batch, channels = self.data.shape[:2]
        out_h, out_w = self.out_shape_hw
        # the positions whose window lies inside the row; past them, one at most reaches
        # into the right padding (`depthwise_int8_ir` makes its column zeros)
        inside = out_w if pad == 0 else max(0, min(out_w, (width - 2) // stride + 1))
        zeros = np.zeros(width * channels if pad else 1, np.uint8)  # the rows above/below
        act_low = 0.0 if epilogue.act else -np.inf
        act_top = float(epilogue.act_high) if epilogue.act == "bounded_relu" else np.inf
        bounds = [np.float64(np.float32(bound)).view(np.int64) for bound in (
            max(act_low, epilogue.low), min(act_top, epilogue.high))]
        shift = start.astype(np.float32) if folded else self.vector_shift
        arrays = (source, self.out, self.vector_taps, shift, self.bias, self.scales, zeros)
        context = np.array([array.ctypes.data for array in arrays] + [
            batch, channels, height, width, pad, out_h, out_w, inside, *bounds], np.int64)
        parts = kernel_jobs.parts_for(batch * out_h, 10 * self.rows * channels)
        return spin_pool.job(task, context, parts, keep=arrays)


def _vector_task(stride: int, folded: bool = False) -> int | None:
    """The address of `depthwise_int8_ir`'s task for ``stride`` (``folded``: the bias in the
    shift); None where it cannot be compiled here (no AVX2, no llvmlite or no JIT)."""
    from engine.kernels import depthwise_int8_ir

    return _vector.address(depthwise_int8_ir.task_name(stride, folded))


def _vector_module() -> Any:
    from engine.kernels import depthwise_int8_ir

    return depthwise_int8_ir.module()


# `depthwise_int8_ir`, compiled once: its AVX-512 variant or its generic one, from AVX2 on
_vector = llvm_jit.HostModule(_vector_module, "avx2")


def compiled_kernels() -> dict[str, Any]:
    """The kernels by name (`kernel_jobs` runs them as jobs), compiled on first use."""
    return compiled.compiled_once(_kernels, _compile)


def _compile() -> dict[str, Any]:
    for helper in (_clamp, _round):  # compiled first: `_window_3x3` calls them, inlined
        globals()[helper.__name__] = compiled.compile_kernel(helper, inline="always")
    return {"window_sums": compiled.compile_kernel(_window_sums),
            "window_3x3": compiled.compile_kernel(_window_3x3, error_model="numpy",
                                                  fastmath={"contract"})}


def _window_3x3(padded: Any, channels: int, padded_h: int, padded_w: int, out_h: int,
                out_w: int, stride_h: int, stride_w: int, dilate_h: int, dilate_w: int,
                taps: Any, shift: Any, bias: Any, scales: Any, act: int, act_high: Any,
                low: int, high: int, out: Any, first: int,
                last: int) -> None:  # pragma: no cover - runs compiled
    """Output rows [first, last) (image by image) of a 3×3 window into ``out``
    (N · OH · OW, C): each channel's nine products of ``padded`` (N, padded_h, padded_w, C,
    uint8) and its taps, plus ``shift``, in one sum (the one `_window_sums` makes), then
    `int8_conv`'s requantize arithmetic on it. The nine taps written out, the loop over the
    channels holds no inner loop and vectorises with the sums in registers; the positions
    go along a row, with no division each.

    The sums run in float32, exact: every product and partial sum is an integer below
    9 · 255 · 128 + |shift| < 2²⁴. (numba widens int32 products to int64, which halved the
    vectors' lanes.) ``taps`` and ``shift`` come as float32. Exact sums let the products fuse
    into the additions (compiled with ``contract``: a quarter faster); no residual comes here,
    whose scaled addition would then round differently."""
    zero, inf = np.float32(0.0), np.float32(np.inf)
    act_low = zero if act else -inf
    act_top = np.float32(act_high) if act == 2 else inf
    least = max(act_low, np.float32(low))
    most = min(act_top, np.float32(high))
    depth = np.uint64(channels)
    across = np.uint64(dilate_w) * depth  # from one tap to the next along a row
    down = np.uint64(dilate_h * padded_w) * depth  # and down a column
    step = np.uint64(stride_w) * depth  # from one output position to the next
    for line in range(first, last):
        image = line // out_h
        y = line - image * out_h
        start = np.uint64((image * padded_h + y * stride_h) * padded_w) * depth
        for x in range(np.uint64(out_w)):
            top = start + x * step
            middle, bottom = top + down, top + down + down
            into = (np.uint64(line * out_w) + x) * depth
            for c in range(depth):
                total = (shift[c]
                         + np.float32(padded[top + c]) * taps[0, c]
                         + np.float32(padded[top + across + c]) * taps[1, c]
                         + np.float32(padded[top + across + across + c]) * taps[2, c]
                         + np.float32(padded[middle + c]) * taps[3, c]
                         + np.float32(padded[middle + across + c]) * taps[4, c]
                         + np.float32(padded[middle + across + across + c]) * taps[5, c]
                         + np.float32(padded[bottom + c]) * taps[6, c]
                         + np.float32(padded[bottom + across + c]) * taps[7, c]
                         + np.float32(padded[bottom + across + across + c]) * taps[8, c])
                # the exact sum plus the bias in float64 (exact too), rounded once to
                # float32: what int8_conv's float32(int64 sum + bias) gives
                value = np.float32(np.float64(total) + np.float64(bias[c])) * scales[c]
                # the activation and the saturation in one clamp: the activation's [0 or
                # -inf, its top or inf] and the saturation's [low, high] overlap, and both
                # come before the rounding
                out[into + c] = _round(_clamp(value, least, most))


def _clamp(value: Any, bottom: Any, top: Any) -> Any:  # pragma: no cover - runs compiled
    return bottom if value < bottom else (top if value > top else value)


def _round(value: Any) -> Any:  # pragma: no cover - runs compiled
    """``value`` (float32, within ±2²²) rounded half to even by adding and taking off
    1.5 · 2²³ (the float32 sum keeps no fraction), as an int32: np.rint's call would keep
    the loop scalar."""
    rounder = np.float32(12582912.0)
    return np.int32((value + rounder) - rounder)




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
