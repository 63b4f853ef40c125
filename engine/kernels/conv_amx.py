"""A bf16 convolution on AMX that reads its input once: no im2col matrix.

The im2col form (`gemm_bind.bf16_patch_product`) pairs a K = C·kh·kw row matrix on every
run: for a 3×3 convolution nine copies of the input. Here the input is paired once
(`bf16.patch_pairing`) into a grid of words (channel pairs × images × bordered rows × ``Wp``),
whose borders are zeroed once, when the plan binds: the padding. Tap (kh, kw) of output
column ``y·Wp + x`` reads the grid ``kh·Wp + kw`` words on, so the product (`conv_amx_ir`)
walks the taps over the one grid, the weights packed with K in that order (tap, channel)
once per model. It computes ``Wp`` columns per output row of ``W`` and drops the rest as it
stores.

At stride ``s`` the grid is ``s × s`` phase planes, so that each tap still reads one plane at
stride 1 (`_Grid`); at stride 2 over an even width, one pass pairs both column phases of a
row phase from one read of its rows (`_twinned`). Any padding and dilation, group 1;
`DirectProduct` takes a bias per filter, a residual and a clamp as `gemm_kernel.Product`
does (`gemm_bind.with_bias`, `gemm_bind.with_residual`, `gemm_bind.clamped`). A batch binds
in chunks of images (`bind_chunks`).

Where the input's writer offers it as bf16 pairs (`bf16_handoff`: one image, so one chunk),
the product reads a grid of the hand-off's instead of the shared one, and pairs into it
only on the runs where the writer left the float32 input (not every reader took the grid).
A direct product of one image and an even number of filters is such a writer for readers
of stride 1 whose grid rows are as wide as its own (ResNet's 3×3 after a 3×3 of stride 1):
where every reader took the grid and no residual is added, it writes it (``grid_part``).
It offers its output as the words a 1×1 product on AMX reads too (ResNet v2's bottleneck
3×3, whose one reader is the block's last 1×1 product): then it writes those
(``words_part``), each pixel's pair where the float32 output has the pixel, and that reader
pairs nothing. Either only over a short K (`GRID_MAX_STEPS`).

On AVX-512 BF16 without AMX the same grid and bind run a product of register tiles instead
(`conv_bf16_ir`: ``vdpbf16ps``, the weights packed by `weight_rows`), with the same
hand-offs at batch 1 (`BF16_GRID_MAX_STEPS`) but no channels-last grid and no shortcut
riding, where few grid columns are dropped
(`BF16_MAX_COLUMNS_RATIO`): there the im2col form pairs nine copies of each input word, and
on one Zen 5 core ResNet-18's 64-channel 3×3 layers at 56² take 0.50 ms this way against
0.62–0.69 (OpenVINO bf16: 0.46). Over a deep K with output rows a multiple of 7 pixels
(`by_pixels`: ResNet's layers from 28² on) its tiles hold filters in their lanes and pixels
in their broadcasts (`conv_bf16_pixels_ir`), computing no grid column they drop, whatever
the batch: in bf16 at batch 1 in the plan's walk on one Zen 5 core, ResNet-18 9.85 ms
against 9.04 (its 512-channel layers at 7² 0.71 against 0.53, at 14² 0.56 against 0.50),
ResNet-50 v2 22.2 against 21.2. Nor do they compute a tap of a pixel that reads the padding
(`_Grid.tap_bounds`). A 1×1 convolution of one image whose positions fill the
GEMM's vectors badly (7²: 49 of 64 lanes) runs there too, as a product of one tap over the
input's planes of pairs (`narrow_pointwise`): ResNet-50 v2's deep layers at 7².

At stride 1 over `LINES_MIN_CHANNELS` channels or more (`reads_lines`) the grid is laid
channels-last instead (`conv_amx_lines`): each pixel's channels in bf16 one after another,
read as AMX's A, so that a tile row is one aligned cache line whatever pixel a tap starts at,
where a tile of pairs straddles two lines a row (`conv_amx_lines_ir`). Its pass runs on every
run; a writer's grid of pairs, laid with no pass, stays the better where one is offered.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import compiled, host_features, llvm_jit, spin_pool, steady_walk
from engine.kernels import (
    bf16,
    bf16_handoff,
    border_taps,
    conv_amx_lines,
    gemm_bind,
    gemm_kernel,
    shortcut_ride,
)
from engine.kernels.workspace import empty_aligned

_state: dict[str, Any] = {}
# The context's int64s (addresses in bytes, strides in words or floats): the packed weights,
# the grid and its plane stride, the output and its row stride, the biases, the bounds (two
# float64s), the filters, the grid columns per image, words per tap, the taps and their
# offsets' address, the grid's and the output's widths, the images and the bytes from one
# image's grid and output to the next, and where a residual laid out as the output starts
# (0 for none); for ``grid_part``, the reader's grid, its words a row and the shift (for
# ``words_part`` the reader's words, their row, and 0); for the pixel tiles, where each tap's
# output rows and columns reading inside the input lie (`_Grid.tap_bounds`; 0: everywhere).
_FIELD = {name: index for index, name in enumerate((
    "a", "b", "ldb", "c", "ldc", "rows_bias", "columns_bias", "low", "high", "m", "n",
    "words", "taps", "offsets", "grid_width", "width", "batch", "b_batch", "c_batch",
    "residual", "grid", "grid_ldb", "grid_shift", "tap_bounds"))}
TILE = 32  # filters and grid columns per AMX tile (`gemm_amx_ir`)
WORDS = 16  # channel pairs per step of K
# Work per part at least, in tiles: a tile over a 64-channel 3×3 layer is about 1 µs.
PART_TILES = 8
# The direct form's K over im2col's at most. 3×3 over 56², 64 filters, one thread, direct
# against im2col's time: 8 channels (K 3× im2col's) 0.93, 16 (1.8×) 0.72, 32 (1×) 0.46; 4
# channels (4.5×) 1.15, 3 (9×) 1.51; ResNet's 7×7 stem over 3 channels (9.8×) 7.6.
MAX_DEPTH_RATIO = 3
# A chunk's grid at most. ResNet-18's 3×3 layers at batch 8, one thread, CPU ms, per image
# (10 KB: one image a call) / 512 KB / 1 MB / all at once: 64 at 56² 2.75 / 2.82 / 2.97 / 3.08,
# its stride-2 1.99 / 2.02 / 2.09 / 3.71; 128 at 28² 1.67 / 1.75 / 1.83 / 2.16; 256 at 14²
# 1.53 / 1.53 / 1.58 / 1.86; 512 at 7² 2.72 / 2.53 / 2.40 / 2.37 (im2col: 4.63, 3.07, 2.84,
# 2.62, 4.17).
CHUNK_GRID_BYTES = 512 << 10
# Steps of K (taps × channel pairs / 16) at most of a product writing its reader's grid: one
# whose tiles store between the next tile's steps (`conv_amx_ir.INTERLEAVED_STEPS`). The
# same for a 1×1 reader's words: ResNet-50 v2 at batch 1, one thread, in order, the writer
# and its reader with the words against the float32 output paired, in both binding orders:
# 64 at 56² (18 steps) 0.93–1.03× and 0.64–0.94×, 128 at 28² (36) 1.0–1.08× and 0.84–0.93×;
# 256 at 14² (72) 1.0–1.05× and 0.89–0.97×, 512 at 7² (144) 0.93–1.17× and 0.88–0.97×.
# ResNet-18 at batch 1, one thread, the writer and its reader with the grid handed over
# against the float32 output paired (three interleaved runs): 64 filters at 56² (18 steps)
# 0.91-0.98× and 0.83-0.95×, 128 at 28² (36) 0.94-1.0× and 0.92-0.98×; 256 at 14² (72)
# 1.04-1.11× and 0.99-1.0×, 512 at 7² (144) 1.07-1.11× and 0.91-1.03×.
GRID_MAX_STEPS = 48
# The same on the AVX-512 BF16 tile (`conv_bf16_ir`, `conv_bf16_pixels_ir`), whose tiles
# store after their own steps of K: no limit. Zen 4, one thread, whole runs with every layer
# handing over against none (`bench/steps_in_order.py --bf16-grid-max-steps 0`): ResNet-18
# 18.04 against 18.10 ms, ResNet-50 v2 42.08 against 42.38.
BF16_GRID_MAX_STEPS = 1 << 20
# Input channels at least of a convolution of stride 1 reading a channels-last grid
# (`reads_lines`). ResNet-18's 3×3 layers alone, one thread, thread CPU time, with its pass
# against the grid of pairs with its pairing (warm / with 3 MB written between calls), batch 1:
# 64 at 56² 0.87-0.90 / 1.02-1.07, 128 at 28² 0.83-0.85 / 0.89-0.90, 256 at 14² 0.87-0.88 /
# 0.89-0.90, 512 at 7² 0.79-0.87 / 0.82-0.86; batch 8: 0.89-0.91 / 0.94-0.96, 0.82-0.88 /
# 0.83-0.89, 0.81-0.83 / 0.77-0.82, 0.63-0.66 / 0.61-0.67.
LINES_MIN_CHANNELS = 128


# On AVX-512 BF16, the grid columns a direct product computes at most, against the columns
# the im2col form's product computes (its pixels in whole vectors; `_direct_kernel`).
# ResNet-18's 3×3 layers in bf16 at batch 1 in the plan's walk, one Zen 5 core, ms, direct
# against im2col's patch words (`gemm_bind._bf16_patch_words_product`) and the ratio: 64 at
# 56² 0.50 against 0.62–0.69 (1.04), stride 2 into 28² 0.28 against 0.33 (1.06), 128 at 28²
# 0.51 against 0.57–0.61 (1.10), 256 at 14² 0.53 against 0.54–0.58 (1.08), stride 2 into
# 14² 0.29 against 0.31 (1.08), 512 at 7² 0.66–0.67 against 0.65–0.67 (1.0), stride 2 into
# 7² 0.35 against 0.35 (1.0). At batch 8 the im2col form's columns fill their vectors where
# each image's grid still drops its padding (7²: 1.28), and the whole network took 84.3 ms
# with the direct form down to 7² against 79.8 with it down to 28².
BF16_MAX_COLUMNS_RATIO = 1.12
# On AVX-512 BF16, the K (taps × channels) at least of a direct product run by pixel tiles
# (`by_pixels`). One Zen 5 core, warm, µs, tiles of grid columns against pixel tiles, batch 1
# but where said: ResNet's 3×3 layers, 64 channels at 56² (K 576) 506 against 541, 64 into
# 28² at stride 2 279 against 284; 128 at 28² (1152) 524 against 505, 128 into 14² 280
# against 256; 256 at 14² 531 against 477 (batch 8: 4627 against 4188), 256 into 7² 313
# against 249, 512 at 7² 613 against 479 (batch 8: 5123 against 4115); 960 at 7² 2350
# against 2149. With the pixel tiles storing runs of a filter's plane in place of scattering
# each pixel's filters, from 576 on one Zen 4 core, in the walk, pixel tiles ÷ grid columns
# (`bench/variants.py`): the 56² layers writing their reader's grid 0.96–0.98, those adding
# the residual 1.04–1.05, 64 into 28² at stride 2 0.95; the network 1.001. Hence a second
# threshold, `PIXELS_ALONE_MIN_DEPTH`, for a product of one image adding no residual. Measured
# so against `PIXELS_MIN_DEPTH` for every product (Zen 4, one thread, in the walk, the
# latter's time ÷ the former's): ResNet-18 at batch 1, the blocks' first 3×3 at 56² 1.021 and
# 1.029, 64 into 28² at stride 2 1.049, the layers adding a residual unchanged, the nodes
# summed 1.006; ResNet-50 v2's 3×3 layers at 56² 1.030–1.048. At batch 8, where no product
# hands its readers bf16 and every one stores float32, the 56² layers read 0.968–0.986: the
# second threshold is for one image. A product binds before the plan knows whether a residual
# will be added (`epilogue` fuses it afterwards): one bound on the pixel tiles below
# `PIXELS_MIN_DEPTH` moves to the grid columns' tiles when given a residual
# (`DirectProduct.with_residual`).
PIXELS_MIN_DEPTH = 1152
PIXELS_ALONE_MIN_DEPTH = 576
# On AVX-512 BF16 at batch 1, a 1×1 convolution whose positions would leave the GEMM's
# vectors of 16 positions emptier than `gemm_bind.MIN_LANE_USE` (7²: 49 of 64 lanes) runs as
# a direct product of one tap on the pixel tiles (`narrow_pointwise`), which compute no
# position they drop, from this many input channels. ResNet-50 v2 in bf16 at batch 1, one
# Zen 4 core / both, in the plan's walk, the GEMM against the pixel tiles (two plans bound
# in one process, walked in turn), ms: 2048 → 512 at 7² 0.58 → 0.46 / 0.30 → 0.25,
# 1024 → 2048 at stride 2 into 7² 1.19 → 1.00 / 0.60 → 0.56, the outputs bit for bit the
# same. From 512 channels its 512 → 2048 layers adding the residual took 0.62 → 0.55–0.57 on
# one core but 0.32–0.37 → 0.33–0.48 on both (the last block's the worst), MobileNet v2's
# 960 → 160 and 960 → 320 at 7² 56 → 64–68 and 180 → 155 µs; at 14² (196 of 208 lanes,
# left to the GEMM) 1024 → 256 read 0.48–0.52 either way.
POINTWISE_MIN_DEPTH = 1024


def available() -> bool:
    """Whether the direct kernel compiled for this host (AMX permitted, llvmlite present)."""
    return _compiled() is not None


def bf16_tiles_available() -> bool:
    """Whether the AVX-512 BF16 form's kernel compiled for this host (`conv_bf16_ir`)."""
    return _compiled_bf16() is not None


def _functions(kernel: int) -> dict[str, Any] | None:
    """The compiled direct kernel for ``kernel`` (`gemm_kernel.AMX` or ``BF16``), or None
    (for any other: an fp32 plan's None among them)."""
    if kernel == gemm_kernel.AMX:
        return _compiled()
    return _compiled_bf16() if kernel == gemm_kernel.BF16 else None


def applies(data: Any, weight: Any, out: Any, geometry: Any, workspace: Any) -> bool:
    """Whether `bind` takes this convolution: a bf16 plan on AMX or AVX-512 BF16, float32
    NumPy arrays, the input C-contiguous, the weight a read-only constant, a 2-D kernel of
    several taps over enough channels (`pays`), or a 1×1 kernel the GEMM's lanes would fit
    badly (`narrow_pointwise`)."""
    kernel, stride, dilate, pad = geometry
    return (all(type(x) is np.ndarray and x.dtype == np.float32 for x in (data, weight, out))
            and data.ndim == 4 and out.ndim == 4 and data.flags.c_contiguous
            and out.flags.c_contiguous and not weight.flags.writeable
            and weight.nbytes <= gemm_bind.PACK_LIMIT_BYTES and len(kernel) == 2
            and weight.shape[1] == data.shape[1]
            and ((math.prod(kernel) > 1 and pays(data.shape[1], math.prod(kernel)))
                 or narrow_pointwise(data, out, geometry, workspace))
            and not np.may_share_memory(out, data)
            and _direct_kernel(data, out, geometry, workspace) is not None)


def narrow_pointwise(data: Any, out: Any, geometry: Any, workspace: Any) -> bool:
    """Whether a 1×1 convolution (no padding) runs as a direct product on AVX-512 BF16's
    pixel tiles (`POINTWISE_MIN_DEPTH`): one image whose output positions fill the GEMM's
    vectors of 16 lanes below `gemm_bind.MIN_LANE_USE`, rows a whole number of the tiles'
    runs of pixels, and that many input channels."""
    from engine.kernels.conv_bf16_pixels_ir import LANES, SEGMENT

    kernel, stride, dilate, pad = geometry
    positions = math.prod(out.shape[2:])
    return (math.prod(kernel) == 1 and not any(pad) and out.shape[0] == 1
            and out.shape[3] % SEGMENT == 0 and data.shape[1] >= POINTWISE_MIN_DEPTH
            and positions < gemm_bind.MIN_LANE_USE * -(-positions // LANES) * LANES
            and gemm_bind.bf16_kernel(workspace, out.shape[1]) == gemm_kernel.BF16)


def _direct_kernel(data: Any, out: Any, geometry: Any, workspace: Any) -> dict[str, Any] | None:
    """The compiled direct kernel a bf16 plan binds this convolution to: AMX's, or on
    AVX-512 BF16 the register tiles': by pixels (`by_pixels`), or of grid columns where the
    columns they compute (the padding's past each output row's end, each image's last
    tile's past it) are at most `BF16_MAX_COLUMNS_RATIO` times those the im2col form
    computes; else None."""
    kernel = gemm_bind.bf16_kernel(workspace, out.shape[1])
    if kernel == gemm_kernel.BF16 and gemm_kernel.available(gemm_kernel.AMX):
        # a layer of few filters on an AMX host: the tiles are measured only on hosts
        # without AMX, whose AVX-512 BF16 tile runs at twice float32's
        return None
    if kernel == gemm_kernel.BF16 and not by_pixels(data, out, geometry):
        kernel_shape, stride, dilate, pad = geometry
        grid = _Grid((1, *data.shape[1:]), kernel_shape, stride, dilate, pad)
        direct = out.shape[0] * -(-_grid_columns(grid, out[:1]) // TILE) * TILE
        lanes = gemm_kernel.tile().width
        patches = -(-out.shape[0] * math.prod(out.shape[2:]) // lanes) * lanes
        if direct > BF16_MAX_COLUMNS_RATIO * patches:
            return None
    return _functions(kernel)


def by_pixels(data: Any, out: Any, geometry: Any, residual: bool = True) -> bool:
    """Whether AVX-512 BF16's direct product of ``out`` runs its pixel tiles
    (`conv_bf16_pixels_ir`: filters in the lanes, no grid column computed and dropped) rather
    than tiles of grid columns: output rows a whole number of the tiles' runs of pixels, and
    a K (taps × channels) of `PIXELS_MIN_DEPTH` or more (`PIXELS_ALONE_MIN_DEPTH` for a
    product of one image adding no ``residual``), over which a tile's stores of 7-pixel runs
    cost little; a 1×1 kernel from `POINTWISE_MIN_DEPTH` channels (`applies` takes only
    those `narrow_pointwise` names)."""
    from engine.kernels.conv_bf16_pixels_ir import SEGMENT

    taps = math.prod(geometry[0])
    if taps == 1:
        least = POINTWISE_MIN_DEPTH
    elif residual or out.shape[0] > 1:
        least = PIXELS_MIN_DEPTH
    else:
        least = min(PIXELS_MIN_DEPTH, PIXELS_ALONE_MIN_DEPTH)
    return out.shape[3] % SEGMENT == 0 and taps * data.shape[1] >= least


def pays(channels: int, taps: int) -> bool:
    """Whether the direct form's K (each tap's channels padded to a step of 32) stays within
    `MAX_DEPTH_RATIO` of im2col's (all of K padded once), where skipping im2col's pairing
    outweighs multiplying the padding."""
    return taps * _words(channels) <= MAX_DEPTH_RATIO * bf16.amx_depth(channels * taps)


def reads_lines(shape: Any, geometry: Any,
                handoff: bf16_handoff.PairedHandoff | None = None) -> bool:
    """Whether a direct convolution of input ``shape`` reads a channels-last grid
    (`conv_amx_lines`, where its kernel compiled): stride 1 over `LINES_MIN_CHANNELS`
    channels or more, unless its input's writer offers ``handoff``, whose grid of pairs it
    would take as the writer's only reader (the writer then lays it, and no pass runs)."""
    kernel, stride, dilate, pad = geometry
    if (tuple(stride) != (1, 1) or shape[1] < LINES_MIN_CHANNELS
            or _compiled_lines() is None):
        return False
    if handoff is None or handoff.readers != 1:
        return True
    return not bf16_handoff.offers_grid(handoff, _grid_tag(shape, geometry),
                                        _Grid(shape, kernel, stride, dilate, pad))


def _grid_tag(shape: Any, geometry: Any) -> tuple[Any, ...]:
    """The tag of the grid of pairs a direct convolution of input ``shape`` reads."""
    kernel, stride, dilate, pad = geometry
    return ("bf16 grid", tuple(shape), tuple(kernel), tuple(stride), tuple(dilate), tuple(pad))


def bind_chunks(data: Any, weight: Any, out: Any, geometry: Any,
                workspace: Any) -> list[bf16.PairedProduct]:
    """`bind` over chunks of images whose grid stays within `CHUNK_GRID_BYTES` (one image at
    least), one call each: a chunk's grid is written and then read back from L2, and its
    images share each block of weights while it is there."""
    kernel, stride, dilate, pad = geometry
    grid = _Grid((1, *data.shape[1:]), kernel, stride, dilate, pad)
    per_image = _words(data.shape[1]) * grid.image * 4
    chunk = max(1, CHUNK_GRID_BYTES // per_image)
    if gemm_bind.bf16_kernel(workspace, out.shape[1]) == gemm_kernel.BF16:
        # AVX-512 BF16's tiles: the grid of pairs (at batch 1 its writer's, where it hands
        # it over), and the output offered to its readers in bf16 likewise; no lines, no
        # shortcut riding
        if data.shape[0] == 1:
            product = bind(data, weight, out, geometry, workspace,
                           bf16_handoff.offered(workspace, data), isa=gemm_kernel.BF16)
            if (out.shape[1] % 2 == 0
                    and _k_steps(grid, data.shape[1]) <= BF16_GRID_MAX_STEPS):
                product = _offer_pairs(product, grid.width, workspace, out, bf16_tile=True)
            return [product]
        return [bind(data[start:start + chunk], weight, out[start:start + chunk], geometry,
                     workspace, isa=gemm_kernel.BF16)
                for start in range(0, data.shape[0], chunk)]
    handoff = bf16_handoff.offered(workspace, data) if data.shape[0] == 1 else None
    lines = reads_lines(data.shape, geometry, handoff)
    chunks: list[shortcut_ride.ChunkGrid] | None = \
        [] if shortcut_ride.may_offer(data, geometry, lines) else None
    if data.shape[0] == 1:  # one chunk: the input as its writer may offer it
        product = bind(data, weight, out, geometry, workspace, None if lines else handoff,
                       lines, chunks)
        if out.shape[1] % 2 == 0 and _k_steps(grid, data.shape[1]) <= GRID_MAX_STEPS:
            product = _offer_pairs(product, grid.width, workspace, out)
        products = [product]
    else:
        products = [bind(data[start:start + chunk], weight, out[start:start + chunk], geometry,
                         workspace, lines=lines, chunks=chunks)
                    for start in range(0, data.shape[0], chunk)]
    if chunks:
        shortcut_ride.offer(workspace, data, chunks)
    return products


def bind(data: Any, weight: Any, out: Any, geometry: Any, workspace: Any,
         handoff: bf16_handoff.PairedHandoff | None = None,
         lines: bool = False,
         chunks: list[shortcut_ride.ChunkGrid] | None = None,
         isa: int = gemm_kernel.AMX) -> bf16.PairedProduct:
    """``out = conv(data, weight)`` (N, C, H, W) → (N, F, Ho, Wo): the input paired into
    its grid, then the direct product, as one call (see `applies`). ``handoff``: the bf16
    hand-off the input's writer offered, whose grid the product reads where it may.
    ``lines``: the grid channels-last, read as A (`conv_amx_lines`; stride 1 only).
    ``chunks``: where given (a stride-2 layer's, `shortcut_ride`), the grid this call pairs
    is noted in it, and products a 1×1 shortcut adds to its ``riders`` run right after the
    pairing, before this product. ``isa``: the product's kernel, `gemm_kernel.AMX`, or
    ``BF16`` for AVX-512 BF16's register tiles (`conv_bf16_ir`; no hand-off, lines or
    chunks)."""
    if lines:
        return _bind_lines(data, weight, out, geometry, workspace)
    kernel, stride, dilate, pad = geometry
    grid = _output_grid(data, out, geometry)
    words = _words(data.shape[1])
    plane = _plane_stride(_grid_extent(grid, out))
    tag = _grid_tag(data.shape, geometry)
    handed = None if handoff is None else bf16_handoff.grid_for(
        handoff, (words, plane), tag, grid, workspace)
    words_grid = handed if handed is not None else workspace.zeroed(
        (words, plane), np.float32, ("bf16 grid", data.shape, tuple(stride), tuple(pad)))
    pairings = [bf16.patch_pairing(view, 1, words_grid, into, twin=twin)
                for view, into, twin in _twinned(grid.phase_runs(data))]
    if any(pair is None for pair in pairings):
        raise ValueError("the bf16 pairing pass did not compile")
    functions = _functions(isa)
    if functions is None:
        raise ValueError("the direct bf16 convolution did not compile for this host")
    bounds = None  # every tap computed, but on the pixel tiles
    columns_form = None  # where the pixel tiles hold only while no residual is added
    if isa == gemm_kernel.AMX:
        tiles = workspace.derived(weight, ("amx direct", words),
                                  partial(_weight_tiles, words=words))
    elif by_pixels(data, out, geometry, residual=False):
        from engine.kernels.conv_bf16_pixels_ir import FILTERS

        tiles = workspace.derived(weight, ("bf16 direct pixels", words),
                                  partial(weight_rows, words=words, block=FILTERS))
        if not by_pixels(data, out, geometry):
            columns_form = partial(_columns_form, weight, words, workspace, functions)
        functions = {**functions, **{name: functions[f"pixels_{name}"]
                                     for name in ("part", "grid_part", "words_part")}}
        bounds = grid.tap_bounds()
    else:
        tiles = _columns_form(weight, words, workspace, functions)[0]
    product = _bound_product(grid, tiles, words_grid, out, functions, plane, grid.image * 4,
                             bounds=bounds)
    product.columns_form = columns_form
    pair = pairings[0] if len(pairings) == 1 else partial(_each, tuple(pairings))
    if handed is not None:
        pair = bf16_handoff.take(handoff, pair)
    elif chunks is not None:
        riding = shortcut_ride.ChunkGrid(data, grid, words_grid, plane, product.operands)
        chunks.append(riding)
        pair = partial(_pair_then_riders, pair, riding.riders)
    return bf16.paired_product(pair, product)


def _pair_then_riders(pair: Any, riders: list[Any]) -> None:
    """The pairing, then the products that read its grid too (`shortcut_ride`)."""
    pair()
    for rider in riders:
        rider()


def shortcut_riders(data: Any, weight: Any, bias: Any, out: Any, geometry: Any,
                    workspace: Any) -> list[Any] | None:
    """A 1×1 stride-2 convolution ``out = conv(data, weight) + bias`` run inside the step of
    the stride-2 direct convolution bound just before it over the same ``data``
    (`shortcut_ride`): per chunk of that one, a direct product of one tap over its grid,
    the tap reading input pixel (2y, 2x), added to the chunk's ``riders``; the shortcut's
    own step (returned) then does nothing. None where it does not apply: the shortcut
    binds as it would alone."""
    kernel, stride, dilate, pad = geometry
    if (tuple(kernel) != (1, 1) or tuple(stride) != (2, 2) or any(pad)
            or type(weight) is not np.ndarray or weight.flags.writeable
            or weight.dtype != np.float32 or weight.shape[1:] != (data.shape[1], 1, 1)
            or type(out) is not np.ndarray or out.dtype != np.float32
            or not out.flags.c_contiguous or out.shape[:2] != (data.shape[0], weight.shape[0])
            or (bias is not None and (not gemm_kernel.takes_bias(bias.reshape(-1))
                                      or bias.size != weight.shape[0]))
            or gemm_bind.bf16_kernel(workspace, out.shape[1]) != gemm_kernel.AMX
            or _compiled() is None):
        return None
    made = shortcut_ride.offered(workspace, data, out)
    if made is None:
        return None
    grid = made.chunks[0].grid
    (top, left), (rows, columns) = grid.pad, grid.kernel
    # the 3×3's tap (top, left) reads padded pixel (2y + top, 2x + left): input (2y, 2x)
    if top >= rows or left >= columns or tuple(out.shape[2:]) != grid.output:
        return None
    offsets = grid.tap_offsets()[top * columns + left:][:1].copy()
    words = _words(data.shape[1])
    tiles = workspace.derived(weight, ("amx direct", words),
                              partial(_weight_tiles, words=words))
    riders, start = [], 0
    for chunk in made.chunks:
        count = chunk.data.shape[0]
        product = _bound_product(chunk.grid, tiles, chunk.words, out[start:start + count],
                                 _compiled(), chunk.plane, chunk.grid.image * 4, offsets)
        if bias is not None:
            product = product.with_epilogue(bias.reshape(-1))
        riders.append(product)
        start += count
    if start != data.shape[0]:
        return None
    made.taken = True
    for chunk, product in zip(made.chunks, riders, strict=True):
        chunk.riders.append(product)
    return [shortcut_ride.ridden_by_writer]


def _twinned(runs: list[tuple[Any, np.ndarray]]) -> list[tuple[Any, np.ndarray, int | None]]:
    """The phase runs (`_Grid.phase_runs`), each of stride 2 along its rows paired with the
    next column phase's where that is the same pixels one float on, as long, a constant
    number of words after it in the grid: one pass then reads the input's rows once for both
    (`bf16.patch_pairing`'s ``twin``). Others as they are (no twin)."""
    paired: list[tuple[Any, np.ndarray, int | None]] = []
    index = 0
    while index < len(runs):
        view, into = runs[index]
        if index + 1 < len(runs):
            other, other_into = runs[index + 1]
            twin = other_into - into if other_into.shape == into.shape else np.zeros(0)
            if (view.strides[-1] == 2 * view.itemsize and other.shape == view.shape
                    and other.strides == view.strides
                    and other.ctypes.data == view.ctypes.data + view.itemsize
                    and twin.size and (twin == twin[0]).all()):
                paired.append((view, into, int(twin[0])))
                index += 2
                continue
        paired.append((view, into, None))
        index += 1
    return paired


def _bind_lines(data: Any, weight: Any, out: Any, geometry: Any,
               workspace: Any) -> bf16.PairedProduct:
    """`bind` over a channels-last grid (`conv_amx_lines`): the input rounded and laid into
    it, then the product reading 16 pixels' channels a tile row as A."""
    kernel, stride, dilate, pad = geometry
    if tuple(stride) != (1, 1):
        raise ValueError(f"a convolution over a channels-last grid has stride 1; got {stride}")
    grid = _output_grid(data, out, geometry)
    functions = _compiled_lines()
    if functions is None:
        raise ValueError("the channels-last direct convolution did not compile")
    words = _words(data.shape[1])
    cells = workspace.zeroed((_grid_extent(grid, out), words), np.float32,
                             ("bf16 lines grid", data.shape, tuple(pad), tuple(dilate)))
    table = conv_amx_lines.pixel_table(data.shape, grid.width, pad)
    pair = conv_amx_lines.grid_pass(functions["lines_grid"], data, cells, table, grid.image)
    tiles = workspace.derived(weight, ("amx direct lines", words),
                              partial(conv_amx_lines.weight_tiles, words=words))
    product = _bound_product(grid, tiles, cells, out, functions, words,
                             grid.image * words * 4)
    return bf16.paired_product(pair, product)


def _output_grid(data: Any, out: Any, geometry: Any) -> _Grid:
    """The input's grid, checked against the output's shape."""
    kernel, stride, dilate, pad = geometry
    grid = _Grid(data.shape, kernel, stride, dilate, pad)
    if tuple(out.shape[2:]) != grid.output:
        raise ValueError(f"convolution output {out.shape} does not match input {data.shape} "
                         f"with kernel {kernel}, stride {stride}, dilation {dilate} and "
                         f"padding {pad}")
    return grid


def _grid_columns(grid: _Grid, out: Any) -> int:
    """The grid columns an image's product computes: the last pixel's + 1."""
    return (out.shape[2] - 1) * grid.width + out.shape[3]


def _grid_extent(grid: _Grid, out: Any) -> int:
    """The grid's columns (words of a plane, or pixels) for every image, and those its last
    tile reads past the last column, the largest tap on."""
    batch = out.shape[0]
    return max(batch * grid.image, (batch - 1) * grid.image
               + -(-_grid_columns(grid, out) // TILE) * TILE + int(grid.tap_offsets().max()))


def _bound_product(grid: _Grid, tiles: np.ndarray, cells: np.ndarray, out: Any,
                   functions: dict[str, Any], ldb: int, b_batch: int,
                   offsets: np.ndarray | None = None,
                   bounds: np.ndarray | None = None) -> DirectProduct:
    """The product of ``functions`` over the packed weights ``tiles`` and the grid
    ``cells`` (``ldb``: words a plane or a pixel; ``b_batch``: bytes an image) into ``out``;
    ``offsets``: its taps' (the grid's own by default); ``bounds``: where each tap reads
    inside the input (`_Grid.tap_bounds`), for the pixel tiles to skip the rest."""
    filters, out_height, out_width = out.shape[1:]
    columns = _grid_columns(grid, out)
    offsets = grid.tap_offsets() if offsets is None else offsets
    zeros = np.zeros(-(-max(filters, columns) // TILE) * TILE + TILE, np.float32)
    context = np.zeros(len(_FIELD), np.int64)
    values = {"a": tiles.ctypes.data, "b": cells.ctypes.data, "ldb": ldb,
              "c": out.ctypes.data, "ldc": out_height * out_width,
              "rows_bias": zeros.ctypes.data, "columns_bias": zeros.ctypes.data,
              "m": filters, "n": columns, "words": _words(grid.shape[1]),
              "taps": offsets.size, "offsets": offsets.ctypes.data,
              "grid_width": grid.width, "width": out_width, "batch": out.shape[0],
              "b_batch": b_batch, "c_batch": out.strides[0],
              "tap_bounds": 0 if bounds is None else bounds.ctypes.data}
    for name, value in values.items():
        context[_FIELD[name]] = value
    context[_FIELD["low"]:_FIELD["high"] + 1].view(np.float64)[:] = -np.inf, np.inf
    return _as_product(context, (tiles, cells, out, zeros, offsets, bounds), functions)


def _k_steps(grid: _Grid, channels: int) -> int:
    """The product's steps of K: each tap's channel pairs, 16 a step."""
    return grid.tap_offsets().size * _words(channels) // WORDS


def _offer_pairs(paired: bf16.PairedProduct, width: int, workspace: Any,
                 out: Any, bf16_tile: bool = False) -> bf16.PairedProduct:
    """The product offering ``out`` to its readers (`bf16_handoff.offer`) as the words a 1×1
    product on AMX (or, ``bf16_tile``, on the AVX-512 BF16 tile) reads, or as their grid
    where each is a direct convolution of stride 1 over grid rows ``width`` words wide."""
    handoff = bf16_handoff.offer(
        workspace, out,
        grids=lambda reader: reader.stride == (1, 1) and reader.width == width,
        bf16_tile=bf16_tile)
    if handoff is None:
        return paired
    return bf16.PairedProduct(paired.func, paired.args[0], paired.product.handing(handoff))


def withdraw_grid_offers(calls: list[Any]) -> None:
    """The direct products among ``calls`` made to write their float32 output whatever their
    readers took: a pass of the same layer runs on that output after them."""
    for index, call in enumerate(calls):
        product = getattr(call, "product", None)
        if isinstance(product, HandingDirectProduct):
            calls[index] = bf16.PairedProduct(call.func, call.args[0], product.plain())


def _words(channels: int) -> int:
    """Words per tap: the channel pairs, padded to a step of K."""
    return -(-channels // (2 * WORDS)) * WORDS


def _each(calls: tuple[Any, ...]) -> None:
    for call in calls:
        call()


class _Grid:
    """Where the padded input lies in the grid of words. At stride 1 it is the padded input
    itself, ``Wp`` words a row; at stride ``s`` it is split into ``s × s`` phase planes (the
    padded pixels at rows ≡ a and columns ≡ b mod s, each ``ceil(Wp / s)`` words a row), so
    that every tap of an output row reads one plane at stride 1: tap (kh, kw) reads plane
    (kh mod s, kw mod s) shifted by (kh div s) rows and (kw div s) columns."""

    def __init__(self, shape: Any, kernel: Any, stride: Any, dilate: Any, pad: Any) -> None:
        self.shape, self.kernel, self.stride, self.dilate, self.pad = (
            tuple(shape), tuple(kernel), tuple(stride), tuple(dilate), tuple(pad))
        padded = [size + 2 * p for size, p in zip(shape[2:], pad, strict=True)]
        self.output = tuple((size - d * (k - 1) - 1) // s + 1 for size, k, s, d in zip(
            padded, kernel, stride, dilate, strict=True))
        self.height, self.width = (-(-size // s) for size, s in zip(padded, stride,
                                                                     strict=True))
        self.plane = self.height * self.width
        self.image = stride[0] * stride[1] * self.plane

    def tap_offsets(self) -> np.ndarray:
        """Each tap's words from an output pixel's grid column to the pixel it reads."""
        rows, columns = self.stride
        offsets = []
        for row in range(self.kernel[0]):
            for column in range(self.kernel[1]):
                down, across = row * self.dilate[0], column * self.dilate[1]
                phase = (down % rows) * self.stride[1] + across % columns
                offsets.append(phase * self.plane + down // rows * self.width
                               + across // columns)
        return np.array(offsets, np.int64)

    def tap_bounds(self) -> np.ndarray:
        """Per tap (in `tap_offsets`' order), the first and last output row, then column,
        whose pixel it reads inside the input (`border_taps.tap_bounds`): past them it reads
        the grid's zeros, which a product may skip."""
        return border_taps.tap_bounds(self.shape[2:], self.output, self.kernel, self.stride,
                                      self.dilate, self.pad)

    def phase_runs(self, data: Any) -> list[tuple[Any, np.ndarray]]:
        """Per phase of the input's rows and columns (one at stride 1): the view (C, N, rows,
        columns) of its pixels and the grid word where each of its rows starts."""
        (row_stride, column_stride), (top, left) = self.stride, self.pad
        batch, _, height, width = self.shape
        runs = []
        for first_row in range(min(row_stride, height)):
            for first_column in range(min(column_stride, width)):
                view = data[:, :, first_row::row_stride, first_column::column_stride]
                padded_rows = first_row + top + row_stride * np.arange(view.shape[2])
                column = first_column + left
                phase = (padded_rows % row_stride) * column_stride + column % column_stride
                starts = phase * self.plane + padded_rows // row_stride * self.width \
                    + column // column_stride
                into = (np.arange(batch)[:, None] * self.image + starts[None, :]).reshape(-1)
                runs.append((view.transpose(1, 0, 2, 3), into))
        return runs


def _columns_form(weight: Any, words: int, workspace: Any,
                  functions: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
    """The weights packed for AVX-512 BF16's tiles of grid columns, and their functions."""
    return workspace.derived(weight, ("bf16 direct", words),
                             partial(weight_rows, words=words)), functions


def _plane_stride(words: int) -> int:
    """A plane's words: ``words`` rounded up to a cache line, and an odd number of lines,
    so that a tile's 16 rows of B do not all fall in one cache set."""
    lines = -(-words // WORDS)
    return (lines + 1 - lines % 2) * WORDS


def _weight_tiles(weight: Any, words: int) -> np.ndarray:
    """The weight (F, C, kh, kw) as AMX's packed A with K ordered (tap, channel), each tap's
    channels padded to ``words`` pairs with zeros."""
    filters, channels = weight.shape[:2]
    taps = math.prod(weight.shape[2:])
    ordered = np.zeros((filters, taps, 2 * words), np.float32)
    ordered[:, :, :channels] = weight.reshape(filters, channels, taps).transpose(0, 2, 1)
    return bf16.amx_pack_rows(bf16.amx_weight_rows(ordered.reshape(filters, -1)))


def weight_rows(weight: Any, words: int, block: int | None = None) -> np.ndarray:
    """The weight (F, C, kh, kw) as `conv_bf16_ir`'s tiles read it (``block`` filters a
    block: its `ROWS` by default; `conv_bf16_pixels_ir.FILTERS` for the pixel tiles): bf16
    pairs of channels (each tap's padded to ``words`` pairs with zeros), laid [filter
    block][tap][pair][filter] with the filters padded to a whole block with zero rows."""
    from engine.kernels.conv_bf16_ir import ROWS

    block = ROWS if block is None else block
    filters, channels = weight.shape[:2]
    taps = math.prod(weight.shape[2:])
    ordered = np.zeros((-(-filters // block) * block, taps, 2 * words), np.float32)
    ordered[:filters, :, :channels] = weight.reshape(filters, channels, taps).transpose(0, 2, 1)
    pairs = bf16.pair_rows(ordered.reshape(-1, 2 * words)).reshape(-1, block, taps, words)
    laid = empty_aligned(np, (pairs.shape[0], taps, words, block), np.float32)
    laid[...] = pairs.transpose(0, 2, 3, 1)
    return laid


class DirectProduct(partial):
    """The direct product bound once: a `spin_pool.Job` over its tiles. Like a
    `gemm_kernel.Product` it takes a bias per filter and a clamp (`with_epilogue`). Called,
    it is the job itself: no Python frame of its own (`HandingDirectProduct` has one)."""

    context: np.ndarray
    operands: tuple[Any, ...]
    functions: dict[str, Any]  # the compiled kernel's addresses (`_compiled`, `_compiled_lines`)
    handoff: Any = None  # the `bf16_handoff` its output's readers may take as their grid
    lays_ever: bool  # whether it adds no residual: only then may a run lay its readers' grid
    leaves_blas_alone = True  # its tiles run on the spin pool, never in BLAS
    # on the pixel tiles below `PIXELS_MIN_DEPTH`: the grid columns' packed weights and
    # functions, which it takes when given a residual (`with_residual`); else None
    columns_form: Any = None

    def handing(self, handoff: Any) -> HandingDirectProduct:
        """This product offering its output to its readers through ``handoff``."""
        product = self._as(HandingDirectProduct)
        product.handoff = handoff
        return product

    def plain(self) -> DirectProduct:
        """This product writing its float32 output on every run."""
        return self._as(DirectProduct)

    def _as(self, kind: type[DirectProduct]) -> Any:
        """This product's job and operands as a ``kind``."""
        product = kind(self.func, *self.args)
        product.context, product.operands = self.context, self.operands
        product.functions, product.lays_ever = self.functions, self.lays_ever
        product.columns_form = self.columns_form
        return product

    def with_epilogue(self, bias_rows: Any = None, bias_columns: Any = None,
                      low: float = -np.inf, high: float = np.inf) -> DirectProduct:
        """This product adding ``bias_rows`` (one per filter: float32, contiguous) and
        clamped to [low, high] (narrowing the bounds it has). A bias per column has no
        place in a convolution."""
        if bias_columns is not None:
            raise ValueError("a direct convolution takes a bias per filter, not per column")
        context = self.context.copy()
        kept = list(self.operands)
        if bias_rows is not None:
            if not gemm_kernel.takes_bias(bias_rows) or bias_rows.size < context[_FIELD["m"]]:
                raise ValueError(f"a fused bias must be float32, contiguous and hold "
                                 f"{context[_FIELD['m']]} values")
            context[_FIELD["rows_bias"]] = bias_rows.ctypes.data
            kept.append(bias_rows)
        bounds = context[_FIELD["low"]:_FIELD["high"] + 1].view(np.float64)
        bounds[:] = max(bounds[0], float(low)), min(bounds[1], float(high))
        return self._carried(_as_product(context, tuple(kept), self.functions))

    def _carried(self, product: DirectProduct) -> DirectProduct:
        """``product`` (made from this one's context changed) offering what this one does,
        and taking the grid columns' tiles with a residual where this one would."""
        product.columns_form = self.columns_form
        return product if self.handoff is None else product.handing(self.handoff)

    def writes_within(self, out: Any) -> bool:
        """Whether the output this product writes lies inside ``out`` (C-contiguous)."""
        c = self.context
        extent = int(c[_FIELD["batch"]]) * int(c[_FIELD["c_batch"]])
        return gemm_kernel.residual_fits(int(c[_FIELD["c"]]), extent, out)

    def with_residual(self, out: Any, other: Any) -> DirectProduct:
        """This product adding ``other`` (laid out as ``out``, which its output lies in)
        before its clamp, after its bias (`gemm_kernel.Product.with_residual`); on the tiles
        of grid columns where its pixel tiles pay only without one (`columns_form`)."""
        context, operands, functions = self.context, self.operands, self.functions
        if self.columns_form is not None:
            tiles, functions = self.columns_form()
            context = context.copy()
            context[_FIELD["a"]], context[_FIELD["tap_bounds"]] = tiles.ctypes.data, 0
            operands = (*operands, tiles)
        added = _as_product(*gemm_kernel.residual_context(
            context, _FIELD["c"], _FIELD["residual"], out, other, operands), functions)
        return added if self.handoff is None else added.handing(self.handoff)


class HandingDirectProduct(DirectProduct):
    """A `DirectProduct` whose ``handoff`` its readers may take: each run writes the output,
    or their grid or words where every one took them and no residual is added, saying which
    (``laid``). A plan's walk calls it with its objects out of cache, so a run reads two
    attributes and the hand-off's ``taken`` (whether a residual is added is fixed as it is
    made: ``lays_ever``), and calls its job through no `super()`."""

    gridded: Any = None  # the job writing the grid, made on the first run that does

    def __call__(self) -> None:
        handoff = self.handoff
        paired = self.lays_ever and handoff.taken
        if not paired:
            partial.__call__(self)
        else:
            if self.gridded is None:
                self.gridded = self._grid_job(handoff)
            self.gridded()
        handoff.laid = paired

    def replayable(self) -> bool:
        """Itself a job, and its grid's job (`steady_walk`)."""
        return spin_pool.runs_jobs(self.func) and steady_walk.all_replayable(self.gridded)

    def _grid_job(self, handoff: Any) -> Any:
        """``grid_part`` over this product's context, its output the hand-off's grid; or
        ``words_part``, its output the words a 1×1 product reads (the pixels where the
        float32 output has them: no shift), where the takers read those."""
        reader = handoff.grid
        context = self.context.copy()
        context[_FIELD["grid"]] = handoff.words.ctypes.data
        context[_FIELD["grid_ldb"]] = handoff.words.shape[1]
        function = "words_part" if handoff.layout == "words" else "grid_part"
        context[_FIELD["grid_shift"]] = 0 if reader is None else (
            reader.pad[0] * reader.width + reader.pad[1])
        # the job keeps the context it reads by address alive
        return spin_pool.job(self.functions[function], context, _parts(context),
                             keep=(handoff.words,))


def _as_product(context: np.ndarray, operands: tuple[Any, ...],
                functions: dict[str, Any]) -> DirectProduct:
    """The product of ``functions`` (`_compiled` or `_compiled_lines`) over ``context``."""
    job = spin_pool.job(functions["part"], context, _parts(context))
    product = DirectProduct(job.func, *job.args)
    product.context, product.operands = context, (*operands, *job.keep)
    product.functions = functions
    product.lays_ever = int(context[_FIELD["residual"]]) == 0
    return product


def _parts(context: np.ndarray) -> int:
    """The product's parts: `PART_TILES` of work each, at most `spin_pool.PARTS_PER_CORE` a
    core, in a number the cores divide (`spin_pool.balanced`)."""
    batch, filters, columns = (int(context[_FIELD[name]]) for name in ("batch", "m", "n"))
    tiles = batch * -(-filters // TILE) * -(-columns // TILE)
    return spin_pool.balanced(min(max(1, tiles // PART_TILES),
                                  spin_pool.PARTS_PER_CORE * spin_pool.cores()))


def _compiled() -> dict[str, Any] | None:
    return compiled.made_once(_state, "kernel", _compile)


def _compile() -> dict[str, Any] | None:
    """The direct kernel for the host (`conv_amx_ir`)."""
    return _compile_for_host(_module, ("part", "grid_part", "words_part"))


def _compile_for_host(make_module: Any, names: tuple[str, ...]) -> dict[str, Any] | None:
    """The functions ``names`` of ``make_module()``'s module compiled for the host, by name
    (with the engine that holds them), or None without AMX (or Linux's grant) or llvmlite."""
    if not host_features.amx_permitted():
        return None
    engine = llvm_jit.compile_for_host(make_module)
    if engine is None:
        return None
    return {"engine": engine, **{name: engine.get_function_address(name) for name in names}}


def _module() -> Any:
    from engine.kernels.conv_amx_ir import module

    return module(_FIELD)


def _compiled_bf16() -> dict[str, Any] | None:
    return compiled.made_once(_state, "bf16", _compile_bf16)


def _compile_bf16() -> dict[str, Any] | None:
    """AVX-512 BF16's direct kernel for the host (`conv_bf16_ir`), or None without it (or
    llvmlite)."""
    if not (host_features.has("avx512f") and host_features.has("avx512_bf16")):
        return None
    from engine.kernels import conv_bf16_ir, conv_bf16_pixels_ir

    engine = llvm_jit.compile_for_host(_bf16_module)
    names = (*conv_bf16_ir.PARTS.values(), *conv_bf16_pixels_ir.PARTS.values())
    return None if engine is None else {
        "engine": engine, **{name: engine.get_function_address(name) for name in names}}


def _bf16_module() -> Any:
    """`conv_bf16_ir`'s tasks and `conv_bf16_pixels_ir`'s in one module."""
    from engine.kernels import conv_bf16_pixels_ir
    from engine.kernels.conv_bf16_ir import TILE_COLUMNS, module

    # its tiles' columns are AMX's, whose grid extent (`_grid_extent`) they read within
    assert TILE_COLUMNS == TILE
    built = module(_FIELD)
    conv_bf16_pixels_ir.add_to(built, _FIELD)
    return built


def _compiled_lines() -> dict[str, Any] | None:
    return compiled.made_once(_state, "lines", _compile_lines)


def _compile_lines() -> dict[str, Any] | None:
    """The channels-last kernel and its grid pass for the host (`conv_amx_lines_ir`)."""
    return _compile_for_host(_lines_module, ("part", "grid_part", "words_part", "lines_grid"))


def _lines_module() -> Any:
    from engine.kernels.conv_amx_lines_ir import module

    return module(_FIELD)
