"""Depthwise convolution bound into a plan: per-channel patches reduced by one stacked matmul.

A depthwise convolution (one group per channel, ``num_filter == channels``) does only 2·K flops
per output for K taps. The reference kernel makes a multiply and an add pass over the whole output
per tap, out of cache (~2 GFLOP/s). Measured on MobileNet v2's layers (one thread), per-tap
multiply/add passes stay slow even on channel blocks that fit in L2 (numpy's short inner loops
over rows dominate), while copying the K taps of a block of channels into a patch array and
reducing it by one stacked matmul ``(n, 1, K) @ (n, K, L)`` runs 1.5–3× faster.

Two layouts keep every copy a long contiguous run:

- Flat rows: the output is computed on the grid of the padded input, so tap ``k`` of a channel
  reads the contiguous run ``flat[offset_k : offset_k + L]``; the few outputs that land in the
  padding columns are computed and dropped when the block is copied out.
- Phases: a strided convolution first splits the padded input into ``prod(stride)`` phases
  (space-to-depth); within a phase every tap is a stride-1 tap, so the flat runs apply there too.

Where numba is installed, `depthwise_kernel`'s compiled kernels replace the patches and the
matmul (2-D, float32/64): over the NumPy-filled phases, or reading the input themselves for
large strided planes (`PLANE_CELLS`) and every 3×3 stride-1 pad-1 one (`SAME_3X3`). Before
them, float32 3×3 pad-1 layers of stride 1 or 2 take `depthwise_vector`'s kernel (LLVM IR,
AVX-512 or AVX2; numba not needed), which also writes the bf16 pairs an AMX product takes in
place of the output (`bf16_handoff`).

The phases live in a zero-bordered `Workspace` buffer (only input cells are written per run), the
patches and matmul results in the plan's shared scratch, and all views are made at bind time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import compiled
from engine.kernels import bf16_handoff, depthwise_kernel, depthwise_vector
from engine.kernels.conv_bind import Geometry
from engine.kernels.depthwise_kernel import DepthwiseCall
from engine.kernels.im2col import Ints
from engine.kernels.workspace import aligned

BLOCK_BYTES = 512 << 10  # patches + results of one channel block: measured best at ~half of L2
# A strided convolution with this many input cells per plane fills each plane's phases in the
# compiled kernel, in cache, instead of NumPy filling the whole layer's first: NumPy's strided
# copies into the phases are the slow part there. Measured on MobileNet v2's layers (one thread,
# best of 40 interleaved): 96 × 112² stride 2 0.43 ms against 0.58, 144 × 56² 0.23 against
# 0.24 (medians 0.24, 0.28); at 28² and below the per-plane loops over short rows lose 30–40%.
PLANE_CELLS = 56 * 56
# Kernel, stride, dilation, padding of the commonest depthwise layer, which the compiled kernel
# runs straight off the input at every size: no phase grid to fill (`depthwise_same_3x3`).
# MobileNet v2's layers, one thread, medians, against NumPy's fill and `depthwise_rows`:
# 32 × 112² 0.143 ms against 0.209, 144 × 56² 0.166 / 0.241, 192 × 28² 0.065 / 0.105,
# 384 × 14² 0.047 / 0.086, 960 × 7² 0.072 / 0.099; the whole network 10.3–10.5 → 9.5–9.9 ms.
SAME_3X3 = ((3, 3), (1, 1), (1, 1), (1, 1))
# `depthwise_vector`'s kernel runs every 3×3 pad-1 float32 layer it can, the stride-1 planes
# of 56² too, whose rows end in a part-filled vector (56 = 3.5 vectors), where numba's
# `depthwise_same_3x3` sums a plane as one long flat run: alone it runs those faster (144 ×
# 56², one thread, best of 60: 153 against 171 µs), but in a run, reading what the expanding
# 1×1 product has just written, slower. MobileNet v2 fp32, one thread, steps in order, medians
# of 30, three runs each in turn with main's: 144 × 56² 185–193 µs against numba's 201–204.
# Elsewhere, numba's against the vector kernel alone: 32 × 112² 128 / 118, 192 × 28² 60 / 34,
# 960 × 7² 68 / 25; stride 2: 96 × 112² 363 / 244, 576 × 14² 94 / 23.


@dataclass(frozen=True)
class _Axis:
    """One spatial axis of the phase layout."""

    size: int  # input length
    out: int  # output length
    phase: int  # cells per phase (Q): holds the padded input and every tap's read
    kernel: int
    stride: int
    dilate: int
    pad: int

    def taps(self, phase: int) -> tuple[int, int, int, int] | None:
        """Taps landing in ``phase``: (first, step, count) as kernel indices, and the first's
        offset within the phase; None when none does. They form an arithmetic progression."""
        first = next((k for k in range(self.kernel)
                      if self.dilate * k % self.stride == phase), None)
        if first is None:
            return None
        step = self.stride // math.gcd(self.dilate, self.stride)
        count = len(range(first, self.kernel, step))
        return first, step, count, self.dilate * first // self.stride

    def offset_step(self) -> int:
        """Offset (in phase cells) between consecutive taps of one phase."""
        return self.dilate // math.gcd(self.dilate, self.stride)

    def inputs(self, phase: int) -> tuple[slice, slice] | None:
        """(input cells, phase cells) of the input that ``phase`` holds; None when empty."""
        first = (phase - self.pad) % self.stride
        count = len(range(first, self.size, self.stride))
        if not count:
            return None
        start = (first + self.pad) // self.stride
        return slice(first, None, self.stride), slice(start, start + count)


def _axes(data_shape: Ints, geometry: Geometry) -> list[_Axis]:
    axes = []
    for size, kernel, stride, dilate, pad in zip(data_shape[2:], *geometry, strict=True):
        out = (size + 2 * pad - dilate * (kernel - 1) - 1) // stride + 1
        phase = max(-(-(size + 2 * pad) // stride), out + dilate * (kernel - 1) // stride)
        axes.append(_Axis(size, out, phase, kernel, stride, dilate, pad))
    return axes


def _flat_strides(axes: list[_Axis]) -> Ints:
    """Element strides of the phase grid, row-major."""
    strides = [1]
    for axis in reversed(axes[1:]):
        strides.insert(0, strides[0] * axis.phase)
    return tuple(strides)


def _run_length(axes: list[_Axis]) -> int:
    """L: flat cells from the first output to the last, padding columns included."""
    return sum((axis.out - 1) * step for axis, step in zip(axes, _flat_strides(axes))) + 1


@dataclass(frozen=True)
class _Layout:
    """Scratch regions for one block of ``block`` channels: patches (N, n, K, L), results."""

    block: int
    patches: Ints
    results: Ints

    def offsets(self, itemsize: int) -> tuple[int, int, int]:
        """Byte offsets of the patch and result regions, and the total bytes."""
        patches = aligned(math.prod(self.patches) * itemsize)
        return 0, patches, patches + math.prod(self.results) * itemsize


def _layout(data_shape: Ints, geometry: Geometry, itemsize: int) -> _Layout:
    batch, channels = data_shape[:2]
    taps, length = math.prod(geometry[0]), _run_length(_axes(data_shape, geometry))
    per_channel = batch * (taps + 1) * length * itemsize
    block = max(1, min(channels, BLOCK_BYTES // per_channel))
    block = -(-channels // -(-channels // block))  # even blocks: no small remainder block
    return _Layout(block, (batch, block, taps, length), (batch, block, 1, length))


def applies(group: int, channels: int, filters: int) -> bool:
    """A depthwise convolution this module binds: one group and one filter per input channel
    (a channel multiplier above 1 is left to the reference kernel)."""
    return 1 < group == channels == filters


def scratch_bytes(data_shape: Ints, geometry: Geometry, itemsize: int) -> int:
    """Bytes of plan scratch the bound depthwise convolution needs."""
    return _layout(data_shape, geometry, itemsize).offsets(itemsize)[2]


def bind(xp: Any, data: Any, weight: Any, bias: Any, out: Any, geometry: Geometry,
         workspace: Any) -> list[Callable[[], Any]]:
    """Calls computing ``out = depthwise_conv(data, weight) + bias`` (channel multiplier 1)."""
    batch, channels = data.shape[:2]
    axes = _axes(data.shape, geometry)
    compiled = _compiled_applies(xp, data, weight, bias, axes)
    direct = compiled and data.flags.c_contiguous  # the kernels reading the input view it flat
    if depthwise_vector.applies(data, weight, bias, out, geometry):
        # Its output may go to 1×1 products (on AMX or the AVX-512 BF16 tile) as the bf16
        # pairs they read (one sample), in place of a pairing pass (144 × 56², one thread,
        # AMX host: pairing 74 µs; the vector kernel 171 µs writing float32, 148 writing the
        # pairs).
        handoff = bf16_handoff.offer(workspace, out, bf16_tile=True)
        # Its input may come as bf16 planes (one sample): a 1×1 product's epilogue lays
        # them (`gemm_amx_handoff`, `gemm_tile_handoff`), half the bytes to read.
        source = bf16_handoff.offered(workspace, data) if batch == 1 else None
        if source is not None and not source.planes:
            source = None
        if source is not None and bf16_handoff.take_planes(source, workspace) is None:
            source = None
        return [depthwise_vector.bind(data, weight, bias, out, geometry[1][0], handoff,
                                      source)]
    if direct and tuple(map(tuple, geometry)) == SAME_3X3:
        return [_same_call(data, weight, bias, out)]
    if direct and max(geometry[1]) > 1 and math.prod(data.shape[2:]) >= PLANE_CELLS:
        return [_planes_call(data, weight, bias, out, axes, workspace)]
    strides = tuple(axis.stride for axis in axes)
    phases = workspace.zeroed((batch, channels, *strides, *(axis.phase for axis in axes)),
                              data.dtype, ("depthwise phases", geometry[3]))
    calls = _fill_phases(xp, data, phases, axes)
    if compiled:
        return calls + [_compiled_call(data, weight, bias, out, phases, axes)]
    layout = _layout(data.shape, geometry, data.itemsize)
    taps = weight.reshape(channels, 1, -1)
    for start in range(0, channels, layout.block):
        block = slice(start, min(start + layout.block, channels))
        calls += _bind_block(xp, phases[:, block], taps[block], out[:, block],
                             None if bias is None else bias[block], axes, layout, workspace)
    return calls


def _compiled_applies(xp: Any, data: Any, weight: Any, bias: Any, axes: list[_Axis]) -> bool:
    """Whether the compiled kernel runs this one: 2-D, float32/64, numba installed, and a
    weight and bias it can read in place (so ones fed as inputs are read afresh every run)."""
    return (xp is np and len(axes) == 2 and data.dtype in compiled.COMPILED_DTYPES
            and weight.dtype == data.dtype and weight.flags.c_contiguous
            and (bias is None or bias.dtype == data.dtype) and compiled.available())


def _tap_offsets(axes: list[_Axis]) -> np.ndarray:
    """Where each tap's run starts in the phase grid, flattened (phase, then cell)."""
    grid = _flat_strides(axes)
    cells = math.prod(axis.phase for axis in axes)
    offsets = []
    for taps in np.ndindex(*(axis.kernel for axis in axes)):
        reach = [axis.dilate * k for axis, k in zip(axes, taps)]
        phase = np.ravel_multi_index([r % axis.stride for r, axis in zip(reach, axes)],
                                     [axis.stride for axis in axes])
        within = sum(r // axis.stride * step for r, axis, step in zip(reach, axes, grid))
        offsets.append(int(phase) * cells + within)
    return np.array(offsets, np.int64)


def _compiled_call(data: Any, weight: Any, bias: Any, out: Any, phases: Any,
                   axes: list[_Axis]) -> Callable[[], Any]:
    """The compiled kernel over the phases, writing ``out`` directly (bias included)."""
    batch, channels = data.shape[:2]
    bias = np.zeros(channels, data.dtype) if bias is None else bias
    return DepthwiseCall(depthwise_kernel.depthwise_rows, phases.reshape(batch * channels, -1),
                         _tap_offsets(axes), weight.reshape(channels, -1), bias,
                         out.reshape(batch * channels, *out.shape[2:]), _flat_strides(axes)[0],
                         data.dtype.type("-inf"), data.dtype.type("inf"))


def _same_call(data: Any, weight: Any, bias: Any, out: Any) -> Callable[[], Any]:
    """The compiled 3×3 stride-1 pad-1 kernel, reading ``data`` itself."""
    batch, channels, height, width = data.shape
    bias = np.zeros(channels, data.dtype) if bias is None else bias
    return DepthwiseCall(depthwise_kernel.depthwise_same_3x3,
                         data.reshape(batch * channels, *data.shape[2:]),
                         depthwise_kernel.inner_columns(height, width),
                         weight.reshape(channels, -1), bias,
                         out.reshape(batch * channels, *out.shape[2:]),
                         data.dtype.type("-inf"), data.dtype.type("inf"))


def _planes_call(data: Any, weight: Any, bias: Any, out: Any, axes: list[_Axis],
                 workspace: Any) -> Callable[[], Any]:
    """The compiled kernel reading ``data`` itself, one plane's phase grid at a time."""
    batch, channels = data.shape[:2]
    grid = workspace.zeroed((*(axis.stride for axis in axes), *(axis.phase for axis in axes)),
                            data.dtype, ("depthwise plane", tuple(axis.pad for axis in axes),
                                         data.shape[2:]))
    bias = np.zeros(channels, data.dtype) if bias is None else bias
    return DepthwiseCall(depthwise_kernel.depthwise_planes,
                         data.reshape(batch * channels, *data.shape[2:]), grid, _tap_offsets(axes),
                         weight.reshape(channels, -1), bias,
                         out.reshape(batch * channels, *out.shape[2:]), axes[0].pad, axes[1].pad,
                         data.dtype.type("-inf"), data.dtype.type("inf"))


def _fill_phases(xp: Any, data: Any, phases: Any, axes: list[_Axis]) -> list[Callable[[], Any]]:
    """Copies of the input into the interior of every phase a tap reads."""
    calls = []
    for phase in np.ndindex(*(axis.stride for axis in axes)):
        cells = [axis.inputs(p) for axis, p in zip(axes, phase)]
        if any(c is None for c in cells) or any(a.taps(p) is None for a, p in zip(axes, phase)):
            continue
        source = data[(slice(None), slice(None), *(c[0] for c in cells))]
        target = phases[(slice(None), slice(None), *phase, *(c[1] for c in cells))]
        calls.append(partial(xp.copyto, target, source))
    return calls


def _bind_block(xp: Any, phases: Any, taps: Any, out: Any, bias: Any, axes: list[_Axis],
                layout: _Layout, workspace: Any) -> list[Callable[[], Any]]:
    """Gather the block's taps into patches, one stacked matmul, add the bias, copy out."""
    batch, channels = phases.shape[:2]
    patches_at, results_at, _ = layout.offsets(phases.itemsize)
    kernel = tuple(axis.kernel for axis in axes)
    length = layout.patches[3]
    patches = workspace.region(patches_at, (batch, channels, *kernel, length), phases.dtype)
    results = workspace.region(results_at, (batch, channels, 1, length), phases.dtype)
    calls = [partial(xp.copyto, target, source)
             for target, source in _phase_taps(xp, phases, patches, axes, length)]
    calls.append(partial(xp.matmul, taps, patches.reshape(batch, channels, -1, length), results))
    if bias is not None:
        # On the contiguous results, in cache: a ufunc with strided operands may buffer the
        # whole block into fresh memory.
        calls.append(partial(xp.add, results, bias.reshape(-1, 1, 1), results))
    item = results.itemsize
    valid = xp.lib.stride_tricks.as_strided(
        results, shape=out.shape,
        strides=(*results.strides[:2], *(step * item for step in _flat_strides(axes))))
    calls.append(partial(xp.copyto, out, valid))
    return calls


def _phase_taps(xp: Any, phases: Any, patches: Any, axes: list[_Axis],
                length: int) -> list[tuple[Any, Any]]:
    """(patch rows, flat runs) per phase: the taps landing in a phase, as one strided view."""
    grid = _flat_strides(axes)
    item = phases.itemsize
    flat = phases.reshape(*phases.shape[:2], -1, math.prod(axis.phase for axis in axes))
    pairs = []
    for index, phase in enumerate(np.ndindex(*(axis.stride for axis in axes))):
        found = [axis.taps(p) for axis, p in zip(axes, phase)]
        if any(f is None for f in found):
            continue
        start = sum(f[3] * step for f, step in zip(found, grid))
        source = xp.lib.stride_tricks.as_strided(
            flat[:, :, index, start:],
            shape=(*phases.shape[:2], *(f[2] for f in found), length),
            strides=(*flat.strides[:2],
                     *(axis.offset_step() * step * item for axis, step in zip(axes, grid)),
                     item))
        rows = tuple(slice(f[0], None, f[1]) for f in found)
        pairs.append((patches[(slice(None), slice(None), *rows)], source))
    return pairs
