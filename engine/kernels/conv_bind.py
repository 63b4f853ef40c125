"""Convolution bound into a plan: im2col and GEMM over memory fixed at compile time.

The interpreter's kernel pads the input and builds the patch array afresh on every call, and
fresh multi-megabyte arrays cost page faults on every run. A plan knows every shape in advance:
here the patch array lives in the plan's shared scratch buffer and the padded input in a
zero-bordered buffer of the plan's `Workspace`, the strided views over them are made once, and
a run is a few copies and one BLAS call per chunk of samples.

Samples are taken together only while one sample's GEMM is narrow: a chunk of several is one
wide GEMM ``(F, CK) @ (CK, chunk * P)``, whose result is then copied out per sample, since the
output layout is (N, F, P). With a few positions per sample (a 64×64 image's late layers have
4–16) one GEMM per sample is a matrix-vector product, and the wide one is much faster; with
hundreds, the copy-out costs more than the width gains (ResNet-18's stem and stride-2 layers at
batch 8: 15–20% slower wide). Hence ``WIDE_POSITIONS``.

In a bf16 plan on AMX, a convolution of several taps over enough channels runs direct instead
(`conv_amx`): its input paired once into a bordered grid, no patch array and no padded copy.
One that stays im2col there with stride 2 across and padding (ResNet's 7×7 stem) copies each
image into a padded buffer split by column parity, so that it is paired from runs of adjacent
floats: with stride 2 down as well, each input row once, an output row's K being the rows of
its window end to end and every output row one product of a batch (`_bind_split_rows`); else
in bands of output rows (`_bind_split_bands`). In float32 such a layer with windows 5 or more
columns wide, or over an image (MobileNet v2's 3×3 stem), copies its patches from the same
split buffer, two runs-of-floats copies per band in place of one that reads every other float
(`_bind_split_patches`), and its copies and products run as one job whose parts each copy the
patches of their own output rows and multiply them, no wait between (`_chained_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import spin_pool
from engine.kernels import (
    banded_pool,
    bf16,
    bf16_handoff,
    conv_amx,
    gemm_amx_handoff,
    gemm_amx_shortcut,
    gemm_bind,
    gemm_kernel,
    gemm_tile_handoff,
    parity_split,
    part_chain,
    strided_kernel,
)
from engine.kernels.gemm_bind import matmul_into
from engine.kernels.im2col import Ints
from engine.kernels.workspace import aligned

PATCH_BYTES = 16 << 20  # target size of one chunk's patch array
WIDE_POSITIONS = 256  # samples are taken together until a chunk's GEMM has this many columns
BAND_BYTES = 1 << 20  # one sample's patches past twice this go in bands of output rows
# Float32 stride-2 layers with windows at least this wide read their patches from the input
# split by column parity (`_bind_split_patches`). The split copy costs about what the padded
# copy it replaces does on long rows (the stem's 224: 107 against 112 µs in a ResNet-18 run,
# one thread) but more on short ones (56 columns: 200 against 149 µs), so it pays where each
# input float lands in many patches: the stem's 7 taps across, not a 3×3 layer's 3 (ResNet-18,
# its 64-channel stride-2 layer 347 → 384 µs of copies, its 128-channel one 191 → 263).
SPLIT_MIN_KERNEL_WIDTH = 5
# A chained convolution's job (`_chained_rows`) runs in this many parts a core: one region of
# patches each, reused by its shares. ResNet-18's stem on two threads, armed: 4 a core took
# 1.37× as long as 1 (eight regions of 0.9 MB against two).
CHAIN_PARTS_PER_CORE = 1
# Patches of a chained convolution's share at most: ResNet-18's stem in shares of 0.5 MB took
# 0.90× the time of shares of 1 MB, on one thread and on two; shares of 0.25 MB 0.95-0.99×
# that of 0.5 MB.
CHAIN_SHARE_BYTES = 1 << 19
# ... and positions (output columns) at most about this many: the patches of a short K (the
# 3×3 stem over an image's 3 channels, K 27: 12 KB an output row of 112) then come in shares
# that stay in L2 with their outputs. MobileNet v2's stem on one thread, shares of 0.5 MB (4
# shares, 28 rows) against 0.125 MB (12): 412–525 against 376–483 µs best.
CHAIN_SHARE_POSITIONS = 1024
# An input of this many channels or fewer (an image: MobileNet v2's 3×3 stem) is split by
# column parity whatever its windows' width: its split copy is small beside its patches (one
# thread, the stem alone: 18 µs padded copy + 455 chained → 47 µs split copy + 316).
IMAGE_CHANNELS = 4

Geometry = tuple[Ints, Ints, Ints, Ints]  # kernel, stride, dilate, pad


@dataclass(frozen=True)
class _Layout:
    """How one convolution uses the scratch buffer: regions for a chunk of ``chunk`` samples."""

    chunk: int
    patches: Ints  # (C, *kernel, chunk, *output spatial)
    wide: Ints | None  # (F, chunk * P), the GEMM result of a multi-sample chunk

    def offsets(self, itemsize: int) -> tuple[int, int, int]:
        """Byte offsets of the patch and wide regions, and the total bytes."""
        patches = aligned(_nbytes(self.patches, itemsize))
        return 0, patches, patches + _nbytes(self.wide, itemsize)


def is_direct(data_shape: Ints, geometry: Geometry) -> bool:
    """A 1×1, stride-1, unpadded convolution: a plain GEMM on the input, no patch array."""
    kernel, stride, _, pad = geometry
    return max(kernel) == 1 and max(stride) == 1 and not any(pad)


def scratch_bytes(data_shape: Ints, filters: int, size: Ints, geometry: Geometry,
                  itemsize: int) -> int:
    """Bytes of plan scratch the bound convolution needs (0 for a direct one)."""
    if is_direct(data_shape, geometry):
        return 0
    return _layout(data_shape, filters, size, geometry, itemsize).offsets(itemsize)[2]


def bind(xp: Any, data: Any, weight: Any, bias: Any, out: Any, geometry: Geometry,
         workspace: Any) -> list[Callable[[], Any]]:
    """Calls computing ``out = conv(data, weight) + bias`` (group 1, channels-first)."""
    batch, filters, size = out.shape[0], out.shape[1], out.shape[2:]
    matrix = weight.reshape(filters, -1)
    positions = math.prod(size)
    # a downsampling shortcut may run inside the stride-2 3×3's step over its grid
    riding = conv_amx.shortcut_riders(data, weight, bias, out, geometry, workspace)
    if riding is not None:
        return riding
    if conv_amx.applies(data, weight, out, geometry, workspace):
        calls = conv_amx.bind_chunks(data, weight, out, geometry, workspace)
    elif is_direct(data.shape, geometry) and data.flags.c_contiguous:
        # one sample: its product may read the bf16 pairs a depthwise layer wrote
        handoff = bf16_handoff.offered(workspace, data) if batch == 1 else None
        calls = _bind_direct(xp, matrix, data.reshape(batch, -1, positions),
                             out.reshape(batch, filters, positions), workspace, handoff)
    else:
        layout = _layout(data.shape, filters, size, geometry, data.itemsize)
        # one sample of a strided 1×1 convolution: it may copy its part of the bf16 pairs
        # a BatchNorm pass wrote (ResNet v2's downsampling shortcut)
        handoff = bf16_handoff.offered(workspace, data) \
            if batch == 1 and max(geometry[0]) == 1 and not any(geometry[3]) else None
        calls = []
        for start in range(0, batch, layout.chunk):
            samples = slice(start, min(start + layout.chunk, batch))
            calls += _bind_chunk(xp, data[samples], matrix, out[samples], geometry, layout,
                                 workspace, handoff)
    if bias is not None and gemm_bind.takes_bias(calls, bias):
        calls = gemm_bind.with_bias(calls, bias_rows=bias)
    elif bias is not None:
        # The bias is added to the float32 output after the products: none may write its
        # readers' grid instead, or they would read the sums without it.
        conv_amx.withdraw_grid_offers(calls)
        calls.append(partial(xp.add, out, bias.reshape(1, filters, *(1,) * len(size)), out))
        return calls
    if bias is None and batch == 1 and max(geometry[0]) == 1 and not any(geometry[3]):
        # a downsampling block's shortcut, which the product adding it may take in
        offered = gemm_amx_shortcut.offer(calls, data, matrix, out, geometry[1], workspace)
        if offered is not calls:
            return offered
    # one sample's AMX product may write its output in the bf16 layout its readers take,
    # or, without AMX, a register tile's its bf16 planes for a depthwise reader
    calls = gemm_amx_handoff.lay_bf16(calls, out, workspace)
    calls = gemm_tile_handoff.lay_bf16(calls, out, workspace)
    # a stem's products in bands may pool their rows for the max pooling after them
    banded_pool.offer(workspace, out, calls, data)
    return calls


def _bind_direct(xp: Any, matrix: Any, data: Any, out: Any, workspace: Any,
                 handoff: Any = None) -> list[Callable[[], Any]]:
    """A 1×1 convolution's GEMMs, (F, C) @ (C, P) per sample: our kernel one sample at a
    time where it applies, else one stacked matmul. ``handoff``: the bf16 hand-off the
    data's writer offered (one sample)."""
    calls = [gemm_bind.weight_product(xp, matrix, data[sample], out[sample], workspace,
                                      handoff)
             for sample in range(data.shape[0])]
    if calls and all(call is not None for call in calls):
        return calls
    return [matmul_into(xp, matrix, data, out)]


def _product(xp: Any, matrix: Any, columns: Any, out: Any,
             workspace: Any) -> Callable[[], Any]:
    """``out = matrix @ columns``: our kernel with the weights packed, else BLAS."""
    return (gemm_bind.weight_product(xp, matrix, columns, out, workspace)
            or matmul_into(xp, matrix, columns, out))


def _bind_chunk(xp: Any, data: Any, matrix: Any, out: Any, geometry: Geometry,
                layout: _Layout, workspace: Any,
                handoff: Any = None) -> list[Callable[[], Any]]:
    """Pad, im2col and GEMM for the samples of one chunk. ``handoff``: the bf16 hand-off the
    data's writer offered (one sample, a 1×1 kernel, no padding)."""
    kernel, stride, dilate, pad = geometry
    samples, channels = data.shape[:2]
    size = out.shape[2:]
    patches_at, wide_at, _ = layout.offsets(data.itemsize)
    if samples == 1:
        split = (_bind_split_rows(xp, data, matrix, out, geometry, workspace)
                 or _bind_split_bands(xp, data, matrix, out, geometry, workspace)
                 or _bind_split_patches(xp, data, matrix, out, geometry, workspace, patches_at))
        if split is not None:
            return split
    calls: list[Callable[[], Any]] = []
    source = data
    if any(pad):
        padded_shape = (samples, channels, *(n + 2 * p for n, p in zip(data.shape[2:], pad)))
        source = workspace.zeroed(padded_shape, data.dtype, ("padding", pad))
        interior = (slice(None), slice(None), *(slice(p, p + n) for p, n in
                                                 zip(pad, data.shape[2:])))
        calls.append(partial(xp.copyto, source[interior], data))
    view = _patch_view(xp, source, kernel, stride, dilate, size)
    if samples == 1:
        return calls + _bind_bands(xp, view, matrix, out, workspace, patches_at,
                                   None if handoff is None else (handoff, data))
    positions = math.prod(size)
    wide = workspace.region(wide_at, (matrix.shape[0], samples * positions), data.dtype)
    per_sample = wide.reshape(matrix.shape[0], samples, positions).transpose(1, 0, 2)
    copy_out = partial(xp.copyto, out.reshape(samples, matrix.shape[0], positions), per_sample)
    fused = gemm_bind.bf16_patch_product(matrix, view, 1 + len(kernel), wide, workspace)
    if fused is not None:  # bf16 on AMX: the patches paired straight from the input
        return [*calls, fused, copy_out]
    patches = workspace.region(patches_at, view.shape, data.dtype)
    calls.append(partial(xp.copyto, patches, view))
    columns = patches.reshape(matrix.shape[1], -1)
    calls.append(_product(xp, matrix, columns, wide, workspace))
    calls.append(copy_out)
    return calls


def _band_rows(view: Any) -> int:
    """Output rows per band of a one-sample patch array (C, *kernel, 1, *size): all of them
    up to twice `BAND_BYTES`, else bands of about `BAND_BYTES`."""
    return _rows_per_band(view.shape[_rows_axis(view)], view.size * view.itemsize)


def _rows_per_band(total: int, nbytes: int) -> int:
    """Output rows per band of ``total`` rows whose patches take ``nbytes`` (`_band_rows`)."""
    return total if nbytes <= 2 * BAND_BYTES else max(1, BAND_BYTES * total // nbytes)


def _rows_axis(view: Any) -> int:
    """The axis of a patch array (C, *kernel, N, *size) holding the first output dimension."""
    return view.ndim // 2 + 1


def _bind_bands(xp: Any, view: Any, matrix: Any, out: Any, workspace: Any,
                patches_at: int, handed: Any = None) -> list[Callable[[], Any]]:
    """im2col and GEMM of one sample, a band of output rows at a time (one band where its
    patches are small): each band's patches are read back while they are in L2. ResNet-18's
    stem, 7.4 MB of patches whole, in bands of 16 rows (1 MB): 3.85 → 3.48 ms best, 4.23 →
    3.56 ms median (one thread, input and weights evicted between calls). ``handed``: the
    bf16 hand-off of the data and the data, which one band whole may read (`gemm_bind`)."""
    axis = _rows_axis(view)
    total, rows = view.shape[axis], _band_rows(view)
    handoff, source = handed if handed is not None and rows >= total else (None, None)
    targets = out.reshape(matrix.shape[0], total, -1)
    calls: list[Callable[[], Any]] = []
    tops = list(range(0, total, rows))
    for first in tops:
        last = min(first + rows, total)
        band = view[(slice(None),) * axis + (slice(first, last),)]
        target = targets[:, first:last].reshape(matrix.shape[0], -1)
        fused = gemm_bind.bf16_patch_product(matrix, band, axis - 1, target, workspace,
                                             handoff=handoff, source=source)
        if fused is not None:  # bf16: the patches paired straight from the input
            calls.append(fused)
            continue
        patches = workspace.region(patches_at, band.shape, view.dtype)
        calls.append(partial(xp.copyto, patches, band))
        calls.append(_product(xp, matrix, patches.reshape(matrix.shape[1], -1), target,
                              workspace))
    if len(calls) == len(tops) > 1 and all(type(call) is bf16.PairedProduct for call in calls):
        # bf16 products a band each: a max pooling after them may run band by band
        # (`banded_pool`), each band's rows pooled while they are in L2
        calls = banded_pool.pooling_after_bands(calls, tops, (view, *(
            operand for call in calls for operand in getattr(call.product, "operands", ()))))
    return calls


def _bind_split_bands(xp: Any, data: Any, matrix: Any, out: Any, geometry: Geometry,
                      workspace: Any) -> list[Callable[[], Any]] | None:
    """One sample of a 2-D convolution of stride 2 across on AMX in bf16 (ResNet's 7×7 stem),
    its input first copied into a zero-bordered buffer whose rows are split by column parity
    (even padded columns, then odd): tap ``kx`` of output ``ox`` reads padded column
    ``2·ox + kx``, cell ``ox + kx // 2`` of half ``kx % 2``, so each band's pairing reads
    runs of adjacent floats instead of every other one of twice as many (ResNet-18's stem,
    one thread: 0.28 → 0.17 ms of pairing). K keeps its order (channel, ky, kx): the
    weights are the same. Only where the input is padded anyway (its copy becomes the split
    one) and windows are wider than one column. None where it does not apply (the caller
    pads and reads strided)."""
    kernel, stride, dilate, pad = geometry
    if (not _splits(xp, data, geometry)
            or gemm_bind.bf16_kernel(workspace, matrix.shape[0]) != gemm_kernel.AMX):
        return None
    channels = data.shape[1]
    out_height, out_width = out.shape[2:]
    kernel_y, kernel_x = kernel
    split, calls = _split_input(data, out.shape[2:], geometry, workspace)
    step_c, step_y, step_half = (stride // split.itemsize for stride in split.strides[:3])
    k_offsets = (np.arange(channels)[:, None, None] * step_c
                 + np.arange(kernel_y)[None, :, None] * (dilate[0] * step_y)
                 + (np.arange(kernel_x) % 2 * step_half + np.arange(kernel_x) // 2)[None, None])
    depth = channels * kernel_y * kernel_x
    targets = out.reshape(matrix.shape[0], out_height, out_width)
    band_rows = _rows_per_band(out_height, depth * out_height * out_width * data.itemsize)
    for top in range(0, out_height, band_rows):
        last = min(top + band_rows, out_height)
        # From the band's first cell: K (its offsets given apart), output rows, columns.
        band = np.lib.stride_tricks.as_strided(
            split[:, top * stride[0]:], shape=(depth, last - top, out_width),
            strides=(0, stride[0] * split.strides[1], split.itemsize))
        target = targets[:, top:last].reshape(matrix.shape[0], -1)
        fused = gemm_bind.bf16_patch_product(matrix, band, 1, target, workspace,
                                             k_offsets=k_offsets.reshape(-1))
        if fused is None:
            return None
        calls.append(fused)
    return calls


def _bind_split_rows(xp: Any, data: Any, matrix: Any, out: Any, geometry: Geometry,
                     workspace: Any) -> list[Callable[[], Any]] | None:
    """One sample of a 2-D convolution of stride 2 both ways on AMX in bf16 (ResNet's 7×7
    stem), its split input's rows paired once and shared by every output row reading them.

    Word row block ``y`` of the pairs holds padded input row ``y``: its values in (channel,
    tap across) order, two to a word (tap ``kx`` of output ``ox``: cell ``ox + kx // 2`` of
    half ``kx % 2``), an odd count's last word ending in a zero. An output row reads the
    blocks of its window's rows, which lie end to end, so its product's K is one run of word
    rows, starting a fixed number of rows on from the previous output row's; one batched
    product (`gemm_kernel.bind_tiles_batch`) does every
    output row. K must come in whole tiles (16 words): blocks of even and odd rows differ in
    size where that needs it, their extra words zero (`_row_words`), so no window reads a
    row it does not cover. Each input row is paired once, not once per output row reading
    it (the bands pair about ``kernel_y / 2`` times as many words). ResNet-18's stem, one
    image alone, warm, one thread: 0.70-0.84 ms in bands, 0.51-0.62 shared; in a run its
    pairing 0.31-0.38 → 0.14-0.21 ms per image, its product (K 80 words, as in bands) about
    as before. None where it does not apply."""
    kernel, stride, dilate, pad = geometry
    if (not _splits(xp, data, geometry) or tuple(stride) != (2, 2)
            or tuple(dilate) != (1, 1) or pad[0] < 1 or matrix.flags.writeable
            or gemm_bind.bf16_kernel(workspace, matrix.shape[0]) != gemm_kernel.AMX):
        return None
    channels = data.shape[1]
    (kernel_y, kernel_x), (out_height, out_width) = kernel, out.shape[2:]
    words = _row_words(-(-channels * kernel_x // 2), kernel_y)
    if words is None:
        return None
    split, calls = _split_input(data, out.shape[2:], geometry, workspace)
    even, odd = words
    period = even + odd  # word rows from one output row's K to the next's
    last_row = 2 * (out_height - 1) + kernel_y - 1
    offsets = _row_pair_offsets(split, channels, kernel_x, last_row + 1, words)
    pairs = workspace.zeroed((offsets.size // 2, bf16.amx_rows(out_width)), np.float32,
                             ("bf16 row pairs", kernel, words, split.shape))
    source = np.lib.stride_tricks.as_strided(split, shape=(offsets.size, out_width),
                                             strides=(0, split.itemsize))
    pair = bf16.patch_pairing(source, 1, pairs, k_offsets=offsets)
    if pair is None:
        return None
    tiles = workspace.derived(matrix, ("bf16 row tiles", kernel, channels, words), partial(
        _row_tiles, kernel, channels, words))
    targets = out.reshape(matrix.shape[0], out_height, out_width)
    # whole, or in bands each pooled after it where a max pooling takes the output
    product = banded_pool.banded(tiles, pairs, targets, period, (data, split, pairs))
    return [*calls, bf16.paired_product(pair, product)]


def _row_words(real: int, kernel_y: int) -> tuple[int, int] | None:
    """Word rows of an even and of an odd input row's block (`_bind_split_rows`): each at
    least ``real`` (the row's channels times its tap pairs), as few as make a window's
    ``kernel_y`` rows (even, odd, even, …) whole tiles of 16 words; None where none do."""
    evens, odds = -(-kernel_y // 2), kernel_y // 2
    fits = [(evens * even + odds * odd, even, odd) for even in range(real, real + 16)
            for odd in range(real, real + 16) if (evens * even + odds * odd) % 16 == 0]
    return min(fits)[1:] if fits else None


def _row_pair_offsets(split: Any, channels: int, kernel_x: int, rows: int,
                      words: tuple[int, int]) -> np.ndarray:
    """Per K index of `_bind_split_rows`'s pairs (two per word), the offset in floats of its
    run in ``split`` (channels, rows, 2, half): tap ``kx`` of channel ``c`` in padded row
    ``y`` at cell ``kx // 2`` of half ``kx % 2``; taps past the window and a block's extra
    words read the top padding row, zeros."""
    step_c, step_y, step_half = (stride // split.itemsize for stride in split.strides[:3])
    blocks = []
    for row in range(rows):
        block = np.zeros((words[row % 2], 2), np.int64)  # zeros: split[0, 0, 0], padding
        for channel in range(channels):
            for tap in range(kernel_x):
                value = channel * kernel_x + tap
                block[value // 2, value % 2] = (channel * step_c + row * step_y
                                                + tap % 2 * step_half + tap // 2)
        blocks.append(block.reshape(-1))
    return np.concatenate(blocks)


def _row_tiles(kernel: Ints, channels: int, words: tuple[int, int],
               matrix: np.ndarray) -> np.ndarray:
    """``matrix`` (F, C·ky·kx) with K in `_bind_split_rows`'s order, rounded, paired and
    packed as AMX's A (`bf16.amx_pack_rows`): per window row, its block's words (channel,
    tap pair), zeros where the block's words hold zeros."""
    kernel_y, kernel_x = kernel
    taps = matrix.reshape(matrix.shape[0], channels, kernel_y, kernel_x)
    blocks = []
    for row in range(kernel_y):
        block = np.zeros((matrix.shape[0], words[row % 2], 2), np.float32)
        for channel in range(channels):
            for tap in range(kernel_x):
                value = channel * kernel_x + tap
                block[:, value // 2, value % 2] = taps[:, channel, row, tap]
        blocks.append(block.reshape(matrix.shape[0], -1))
    packed = bf16.amx_pack_rows(bf16.amx_weight_rows(np.concatenate(blocks, axis=1)))
    packed.flags.writeable = False
    return packed


def _splits(xp: Any, data: Any, geometry: Geometry) -> bool:
    """Whether one sample's convolution may read its input split by column parity: 2-D,
    float32, stride 2 across, undilated across, windows wider than one column, and padded
    (its padded copy becomes the split one)."""
    kernel, stride, dilate, pad = geometry
    return (xp is np and data.ndim == 4 and data.dtype == np.float32 and stride[1] == 2
            and dilate[1] == 1 and kernel[1] > 1 and any(pad) and data.size > 0)


def _split_input(data: Any, size: Ints, geometry: Geometry,
                 workspace: Any) -> tuple[Any, list[Callable[[], Any]]]:
    """The zero-bordered buffer (C, rows, 2, half) one sample is split into by padded column
    parity (`parity_split`), sized for every window's reach, and the calls filling it."""
    kernel, stride, dilate, pad = geometry
    channels, height, width = data.shape[1:]
    (out_height, out_width), (kernel_y, kernel_x), (pad_y, pad_x) = size, kernel, pad
    rows = max(height + 2 * pad_y, (out_height - 1) * stride[0] + (kernel_y - 1) * dilate[0] + 1)
    half = max((width - 1 + pad_x) // 2 + 1, out_width + (kernel_x - 1) // 2)
    split = workspace.zeroed((channels, rows, 2, half), np.float32,
                             ("parity split", pad, data.shape[1:]))
    return split, parity_split.copy(data[0], split, pad_y, pad_x)


def _bind_split_patches(xp: Any, data: Any, matrix: Any, out: Any, geometry: Geometry,
                        workspace: Any, patches_at: int) -> list[Callable[[], Any]] | None:
    """One sample of a float32 2-D convolution of stride 2 across with wide windows (ResNet's
    7×7 stem) or over an image (MobileNet v2's 3×3 stem), its patches copied from the input
    split by column parity: tap ``kx`` of output ``ox`` is cell ``ox + kx // 2`` of half
    ``kx % 2``, so a band's patches are two copies (the even taps, then the odd) of runs of
    adjacent floats, where the strided view reads every other float (ResNet-18's stem, a
    band of 15 rows: 80 → 54 µs in a run, one thread), and the split copy replaces the
    padded one. K then runs (tap parity, channel, ky, kx // 2): the weight's columns are put
    in that order once (`Workspace.derived`).
    The copies and products are one chained job where they can be (`_chained_rows`). None
    where it does not apply: windows narrower than `SPLIT_MIN_KERNEL_WIDTH` over more than
    `IMAGE_CHANNELS` channels, a weight that may change, or a plan whose products run in
    bf16."""
    kernel, stride, dilate, _ = geometry
    if (not _splits(xp, data, geometry)
            or (kernel[1] < SPLIT_MIN_KERNEL_WIDTH and data.shape[1] > IMAGE_CHANNELS)
            or matrix.flags.writeable or gemm_bind.bf16_kernel(workspace, matrix.shape[0])
            is not None):
        return None
    split, calls = _split_input(data, out.shape[2:], geometry, workspace)
    weight = workspace.derived(matrix, ("parity order", kernel), partial(_parity_order, kernel))
    depth, (out_height, out_width) = matrix.shape[1], out.shape[2:]
    chained = _chained_split_patches(split, weight, out, geometry, workspace, patches_at)
    if chained is not None:
        return [*calls, chained]
    band_rows = _rows_per_band(out_height, depth * out_height * out_width * data.itemsize)
    targets = out.reshape(matrix.shape[0], out_height, out_width)
    for top in range(0, out_height, band_rows):
        rows = min(band_rows, out_height - top)
        patches = workspace.region(patches_at, (depth, rows, out_width), np.float32)
        calls += [partial(np.copyto, target, source) for target, source in
                  _split_patch_copies(split, patches, top, geometry)]
        target = targets[:, top:top + rows].reshape(matrix.shape[0], -1)
        calls.append(_product(xp, weight, patches.reshape(depth, -1), target, workspace))
    return calls


def _split_patch_copies(split: Any, patches: Any, top: int,
                        geometry: Geometry) -> list[tuple[Any, Any]]:
    """(target, source) of the two copies filling ``patches`` (K, rows, out_width), K in
    `_parity_order`'s order, with the patches of the output rows from ``top`` read from
    ``split`` (`_bind_split_patches`): the even taps across, then the odd."""
    kernel, stride, dilate, _ = geometry
    (kernel_y, kernel_x), channels = kernel, split.shape[0]
    _, rows, out_width = patches.shape
    step_c, step_y, _, step_x = split.strides
    copies, start = [], 0
    for parity in range(2):
        taps = len(range(parity, kernel_x, 2))
        taken = channels * kernel_y * taps
        # Output rows outermost, so that a copy job's parts share out the band by rows:
        # where its product runs B's column panels outside (`gemm_bind.shares_right`),
        # each thread's part of the product then reads mostly the patches it copied.
        shape = (rows, channels, kernel_y, taps, out_width)
        source = np.lib.stride_tricks.as_strided(
            split[:, top * stride[0]:, parity], shape=shape,
            strides=(stride[0] * step_y, step_c, dilate[0] * step_y, step_x, step_x))
        target = patches[start:start + taken].reshape(
            channels, kernel_y, taps, rows, out_width).transpose(3, 0, 1, 2, 4)
        copies.append((target, source))
        start += taken
    return copies


def _chained_split_patches(split: Any, weight: Any, out: Any, geometry: Geometry,
                           workspace: Any, patches_at: int) -> Any:
    """`_bind_split_patches`' copies and products as one chained job (`_chained_rows`)."""
    out_width = out.shape[3]

    def share(top: int, bottom: int, at: int) -> tuple[Any, list[tuple[Any, Any]]]:
        patches = workspace.region(patches_at + at, (weight.shape[1], bottom - top, out_width),
                                   np.float32)
        return patches.reshape(weight.shape[1], -1), _split_patch_copies(split, patches, top,
                                                                         geometry)

    return _chained_rows(weight, out, workspace, share)


def _chained_rows(weight: Any, out: Any, workspace: Any, share: Any) -> Any:
    """A one-sample 2-D convolution's patch copies and products as one job (`part_chain`):
    the output rows cut into shares of at most about `CHAIN_SHARE_BYTES` of patches (fewer
    where a share's columns would leave the GEMM's lanes empty), each share's patches copied
    and then multiplied on one thread with no wait between, where the bands' copies and
    products are a job each and the cores meet at the end of every one. Armed, the job runs
    in `CHAIN_PARTS_PER_CORE` parts a core, each claiming shares as it comes to them and
    reusing a region of scratch of its own; on one thread every share reuses the first.
    ``share(top, bottom, at)`` gives the patches (K, columns) of output rows [top, bottom)
    placed ``at`` bytes into the patch array's scratch, and the (target, source) copies
    filling them. None where a share's copy
    or product cannot be a job of its own, the regions would not fit in the patch array's
    scratch, or the weight may change."""
    filters, depth = weight.shape
    out_height, out_width = out.shape[2:]
    if weight.flags.writeable or not gemm_kernel.available():
        return None
    row_bytes = depth * out_width * 4
    parts = max(1, min(out_height, CHAIN_PARTS_PER_CORE * spin_pool.cores()))
    # whole shares for every part (a part of one share fewer would idle a while), and as
    # many more as make each share's patches at most `CHAIN_SHARE_BYTES` and its positions
    # at most about `CHAIN_SHARE_POSITIONS`
    wanted = max(-(-out_height * row_bytes // CHAIN_SHARE_BYTES),
                 out_height * out_width // CHAIN_SHARE_POSITIONS)
    most = min(out_height, spin_pool.MAX_PARTS, max(1, -(-wanted // parts)) * parts)
    for shares in range(most, parts - 1, -1):
        # every share's columns fill the GEMM's lanes (the shortest share's: fewest rows)
        if gemm_bind.worthwhile(filters, out_height // shares * out_width):
            break
    else:
        return None
    share_bytes = -(-out_height // shares) * row_bytes  # the tallest share's patches
    if parts * share_bytes > out_height * row_bytes:
        return None
    packed = workspace.derived(weight, "gemm packed", gemm_kernel.pack)
    targets = out.reshape(filters, out_height, out_width)
    # each share bound over each part's region (any part may claim it) and over the first
    tables: list[list[list[Any]]] = [[] for _ in range(parts + 1)]
    for index in range(shares):
        top, bottom = index * out_height // shares, (index + 1) * out_height // shares
        target = targets[:, top:bottom].reshape(filters, -1)
        for table, region in zip(tables, (0, *range(parts)), strict=True):
            columns, copies = share(top, bottom, region * share_bytes)
            if not gemm_kernel.applies(weight, columns, target):
                return None
            # a copy of any size: it is a step of a share, not a job of its own
            table.append([*(strided_kernel.job(0, copy_to, source, source, min_elements=1)
                            for copy_to, source in copies),
                          gemm_kernel.bind_packed(packed, columns, target)])
    if any(step is None for table in tables for steps in table for step in steps):
        return None
    return part_chain.chain(tables[1:], tables[0], parts)


def _parity_order(kernel: Ints, matrix: Any) -> np.ndarray:
    """``matrix`` (F, C·ky·kx) with its columns in `_bind_split_patches`'s order: the even
    taps across (channel, ky, kx // 2), then the odd ones; read-only, as a plan's constant."""
    taps = matrix.reshape(matrix.shape[0], -1, *kernel)
    ordered = np.concatenate([taps[..., parity::2].reshape(matrix.shape[0], -1)
                              for parity in range(2)], axis=1)
    ordered.flags.writeable = False
    return ordered


def _layout(data_shape: Ints, filters: int, size: Ints, geometry: Geometry,
            itemsize: int) -> _Layout:
    kernel, _, _, pad = geometry
    batch, channels = data_shape[:2]
    per_sample = channels * math.prod(kernel) * math.prod(size) * itemsize
    positions = math.prod(size)
    chunk = max(1, min(batch, -(-WIDE_POSITIONS // positions), PATCH_BYTES // max(per_sample, 1)))
    wide = (filters, chunk * positions) if chunk > 1 else None
    return _Layout(chunk, (channels, *kernel, chunk, *size), wide)


def _patch_view(xp: Any, padded: Any, kernel: Ints, stride: Ints, dilate: Ints,
                size: Ints) -> Any:
    """The strided view ``(C, *kernel, N, *size)`` over ``padded`` (N, C, *spatial)."""
    sample, channel, *spatial = padded.strides
    strides = (channel, *(s * d for s, d in zip(spatial, dilate)), sample,
               *(s * t for s, t in zip(spatial, stride)))
    shape = (padded.shape[1], *kernel, padded.shape[0], *size)
    return xp.lib.stride_tricks.as_strided(padded, shape=shape, strides=strides)


def _nbytes(shape: Ints | None, itemsize: int) -> int:
    return 0 if shape is None else math.prod(shape) * itemsize
