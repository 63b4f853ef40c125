"""Bound matrix products: `gemm_kernel` where it measured faster than BLAS, else NumPy.

Where ours wins (one thread, Zen 4 with AVX-512, best of 200, against numpy's OpenBLAS):
many rows and whole vectors of columns, e.g. 64×512×256 152 against 174 µs, 128×576×784
1.01 against 1.11 ms, 512×512×16 81 against 103 µs, 24×144×3136 204 against 251 µs. With
weights packed into column panels, fewer rows than a tile run about as fast as BLAS (1×512×256
5.9 against 6.1 µs, 4×512×256 11.0 against 9.7, 8×512×256 19.8 against 25.3, 1×1280×1000 57
against 54), and on two cores, armed, in half the time (3.0–3.8 µs, 6.0, 10.8, 31): a batch-1
FullyConnected layer is ours too. Where it loses: columns that leave most of a vector
empty (49 columns are computed as 64: 960×160×49 181 against 164 µs, where 48 columns take
136). `worthwhile` encodes that; such a product runs transposed where its rows fill the lanes
instead (`_transposed`).

A product of ours is a `spin_pool` job: inside a plan run armed over several threads (a
library caller's, docs/threads.md "One infer on every core"), its tiles run on every core, and
BLAS is held to one thread. Outside one, where BLAS may use several (`blas_threads`, asked at
every call: a caller running a plan's steps itself, or after `threadpoolctl` changes it), BLAS
runs the products it spreads well (`Threaded`): `THREADED_MACS` multiply-adds or more, rows and
depth both `THREADED_SIDE` or more. Two BLAS threads against ours on one (Zen 4, 2 cores):
128×576×784 0.70× ours' time, 960×160×64 0.59×, 64×512×256 0.88×; but 16×512×512 1.15×,
144×24×3136 1.10×, 64×256×128 1.10×. A dense weight a model holds only as our panels
(`packed_weight`) leaves BLAS nothing to multiply: such a product arms the pool around itself
instead, so its tiles take those threads (`Spread`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import host_features, spin_pool, steady_walk
from engine.cpu.blas_threads import threads as blas_threads_now
from engine.kernels import (
    bf16,
    bf16_handoff,
    depth_split,
    gemm_amx_handoff,
    gemm_kernel,
    gemm_transposed,
    parity_split,
    part_chain,
)

# Below this share of computed lanes doing useful work, BLAS runs the product (49 of 64: no).
MIN_LANE_USE = 0.9
# The most columns (positions) of a bf16 product on the AVX-512 BF16 tile run transposed
# (`_bf16_transposed`). One Zen 5 core, warm, medians, µs, as it is against transposed:
# 1000 × 1280 × N (MobileNet v2's classifier, a 1×1 convolution, at batch N): N 1 104 / 39,
# 4 101 / 43, 8 101 / 73, 12 104 / 77, 16 105 / 115; 512 × 4608 × 16 190 / 222; at 49
# columns the plain form stays ahead (1280 × 320 × 49 110 / 120, 512 × 4608 × 49 616 / 654).
BF16_TRANSPOSED_COLUMNS = 12
# A packed copy of a weight is memory beside the weight itself where the plain weight stays
# (`Workspace.derived`, counted in a model's memory; a dense weight a model holds packed alone,
# `packed_weight`): past this size, where a product streams its weight from memory anyway,
# BLAS runs it on the plain weight (VGG-16's 400 MB of dense weights are not doubled).
PACK_LIMIT_BYTES = 64 << 20
# Past this size, and this deep, the activation a weight multiplies is read once, a panel of
# columns at a time, each meeting every block of the packed weight (`gemm_kernel.bind_packed`'s
# ``columns_outside``), rather than walked whole by each block, which finds it out of L2.
# One thread, Intel Xeon with AMX, warm, row blocks → column panels outside: 128×576×784
# 1.23 → 0.73 ms, 64×256×3136 1.47 → 0.65, 64×128×3136 0.55 → 0.45, 24×144×3136 0.30 → 0.26,
# 512×2304×294 11.6 → 5.2, 256×1152×392 2.66 → 1.67. Under either bound rows outside win or
# tie: smaller (ResNet's stem band, 64×147×1792, 1.0 MB: 235 → 262 µs; 256×64×3136, 0.8 MB:
# 0.65 → 0.76 ms), or shallower than the panel's prefetch reaches ahead, twice
# `gemm_ir.AHEAD_STEPS` (MobileNet v2's 16×32×12544: 184 → 270 µs, 24×96×3136 103 → 172).
STREAMED_RIGHT_BYTES = 3 << 19
STREAMED_RIGHT_MIN_DEPTH = 128
# From this size (and as deep), a product whose row blocks are outside on one thread runs its
# column panels outside where its job is cut in parts for several threads: each thread then
# reads its own columns of B, where with row blocks each read all of B, half of it written by
# the other core a step before. Armed over two threads, in the plan: ResNet-18's fp32 stem
# (64×147×1568 a band, 0.9 MB) 2.35 → 1.87 ms, MobileNet v2's 32×192×784 projections 0.11 →
# 0.06 ms, 96×576×196 0.16 → 0.13 (on one thread column panels would take the stem 1.14×).
# Only where B is this many times the weight's size or more: each thread then reads all of the
# weight instead (ResNet-18's 256×1152×196, weight 1.2 MB, took 1.08× so).
SHARED_RIGHT_BYTES = 1 << 17
SHARED_RIGHT_RATIO = 2
# The copy out of a transposed product's scratch reads a column of it at a time (`_transposed`):
# rows a multiple of 512 bytes long put its 49 lines in 8 or fewer of the L1's 64 sets, whose
# 8 ways cannot hold them. Such rows are made a line longer. One thread, Zen 3, 49 rows, warm:
# the copy of 2048 filters 318 → 40 µs (the residual's add 334 → 72), 1024 159 → 25, 512 49 →
# 10, 1280 52 → 33; 960 filters (3840 bytes) 19 either way.
SCRATCH_ROW_SHIFT_EVERY = 512
SCRATCH_ROW_SHIFT = 64
THREADED_MACS = 4 << 20
THREADED_SIDE = 64
# Below this many output rows a bf16 product runs on AVX-512 BF16 rather than AMX, whose tiles
# are 32 rows: 1×512×1000 took 20 µs there against 56 on AMX (one thread).
AMX_MIN_ROWS = 16
BF16_MIN_DEPTH = 32  # shallower products stay float32 (`amx_pays`)
# From this K, a product of a whole tile of rows or more runs on AMX with K padded to 32
# (`amx_pays`): MobileNet v2's expand layers over 16 and 24 channels.
AMX_SHORT_DEPTH = 16
BF16_MIN_WEIGHTS = 1 << 18  # smaller weights stay float32 on AVX-512 BF16 (`bf16_kernel`)
# Shallower products stay float32 on AVX-512 BF16 (`bf16_kernel`). MobileNet v2 in bf16 at
# batch 1, one Zen 5 core, in the plan's walk, its expands over 24 channels at 56² (144
# filters) float32 against bf16 with their input paired: 0.111 against 0.078–0.087 ms; the
# whole run 2.91 against 2.83.
BF16_TILE_MIN_DEPTH = 16
# A bf16 product's output past this is written row block by row block (`rows_outside`): half
# a core's L2 on the Xeons measured (2 MiB), all of it on Zen 5: it streams to memory.
STREAMED_OUTPUT_BYTES = 1 << 20


def blas_threads() -> int:
    """The threads numpy's OpenBLAS uses now (asked at every call: 0.2 µs)."""
    return blas_threads_now()


def worthwhile(rows: int, columns: int) -> bool:
    """Whether our kernel runs a product of this many output rows and columns at least about
    as fast as BLAS: columns that fill its vector lanes (any rows: fewer than a tile's have
    loops of their own, and with weights packed one row matches BLAS's matrix-vector product,
    see the module docstring)."""
    if not gemm_kernel.available():
        return False
    shape = gemm_kernel.tile()
    past = columns % shape.width
    # An edge tile of whole rows sums its few columns past whole vectors a column to a vector
    # (`gemm_kernel.side_columns`): they fill its lanes.
    sides = rows >= shape.rows and columns > shape.width and past <= gemm_kernel.side_columns()
    lanes = columns if sides else -(-columns // shape.width) * shape.width
    return rows >= 1 and columns / lanes >= MIN_LANE_USE


def weight_product(xp: Any, weight: Any, right: Any, out: Any, workspace: Any,
                   handoff: bf16_handoff.PairedHandoff | None = None) -> Callable[[], Any] | None:
    """``out = weight @ right`` by our kernel as one call, where ``weight`` is a read-only
    plan constant (packed once and shared by the model's plans, `Workspace.derived`); None
    where BLAS should run it. ``handoff``: the one ``right``'s writer offered, taken where
    the product pairs ``right`` for AMX (`bf16_handoff`)."""
    if (xp is not np or weight.flags.writeable or weight.nbytes > PACK_LIMIT_BYTES
            or not gemm_kernel.applies(weight, right, out)):
        return None
    if bf16_kernel(workspace, out.shape[0], weight.shape[1], paired=handoff is not None):
        return _bf16_weight_product(weight, right, out, workspace, handoff)
    if worthwhile(*out.shape):
        packed = workspace.derived(weight, "gemm packed", gemm_kernel.pack)
        product = gemm_kernel.bind_packed(packed, right, out,
                                          columns_outside=streams_right(*right.shape),
                                          columns_when_split=shares_right(out.shape[0],
                                                                          *right.shape))
        return _threaded(weight, right, out, product)
    if worthwhile(*out.shape[::-1]):
        return _transposed(weight, right, out, workspace)
    return None


def product_with_weight(xp: Any, left: Any, weight: Any, out: Any,
                        workspace: Any) -> Callable[[], Any] | None:
    """``out = left @ weight`` by our kernel as one call, where ``weight`` never changes (a
    read-only plan constant, or a value derived from one): packed into column panels once and
    shared by the model's plans; None where BLAS should run it."""
    if (xp is np and weight.nbytes <= PACK_LIMIT_BYTES and gemm_kernel.applies(left, weight, out)
            and bf16_kernel(workspace, out.shape[0], left.shape[1], weight.size) is not None):
        return _bf16_product_with_weight(left, weight, out, workspace)
    if (xp is np and weight.nbytes <= PACK_LIMIT_BYTES and gemm_kernel.applies(left, weight, out)
            and worthwhile(*out.shape)):
        panels = workspace.derived(weight, "gemm panels", gemm_kernel.pack_columns)
        return _by_panels(left, weight, panels, out)
    return None


def streams_right(depth: int, columns: int) -> bool:
    """Whether a packed weight's product over a float32 activation (``depth`` × ``columns``)
    runs the activation's column panels outside (see `STREAMED_RIGHT_BYTES`)."""
    return depth * columns * 4 > STREAMED_RIGHT_BYTES and depth >= STREAMED_RIGHT_MIN_DEPTH


def shares_right(rows: int, depth: int, columns: int) -> bool:
    """Whether a packed weight's product (``rows`` × ``depth``) over a float32 activation
    (``depth`` × ``columns``) that runs its row blocks outside (not `streams_right`) runs B's
    column panels outside where its job is cut in several parts (`gemm_kernel.bind_packed`'s
    ``columns_when_split``), see `SHARED_RIGHT_BYTES`."""
    return (depth * columns * 4 >= SHARED_RIGHT_BYTES and depth >= STREAMED_RIGHT_MIN_DEPTH
            and columns >= SHARED_RIGHT_RATIO * rows and not streams_right(depth, columns))


def bf16_kernel(workspace: Any, rows: int, depth: int | None = None,
                weights: int | None = None, paired: bool = False) -> int | None:
    """The bf16 kernel a product of ``rows`` output rows over ``depth`` (K; None: a
    convolution's patches, paired in place of im2col's copy, any K) runs on in a plan whose
    precision is bf16 (`Workspace.precision`), or None where our float32 kernels run it.

    AMX where the process may use it, the rows fill half a tile or more and K is deep enough
    for the tiles to pay for pairing the activation (`amx_pays`); AVX-512 BF16 for deep
    products of fewer rows whose weight (``weights`` values) streams from memory, where half
    its bytes pay (a dense layer at batch 1: 1×512×1000 20 µs against 47 in float32 and 56 on
    AMX; the seed MLP's 512×256 took longer paired, its weight in cache); None for an fp32
    plan, a host with neither, or a thin or small product; without AMX, AVX-512 BF16 from
    `BF16_TILE_MIN_DEPTH` whatever the rows. ``paired``: the activation may
    come paired by the step before (`bf16_handoff`), so AMX pays from `BF16_MIN_DEPTH`
    whatever the rows (MobileNet v2's K 32, 16-row layer at 112²: 55 µs on AMX with the pairs
    handed over, against 160 in float32)."""
    if getattr(workspace, "precision", "fp32") != "bf16":
        return None
    amx = gemm_kernel.available(gemm_kernel.AMX)
    if rows >= AMX_MIN_ROWS and amx:
        pays = depth is None or amx_pays(rows, depth) or (paired and depth >= BF16_MIN_DEPTH)
        return gemm_kernel.AMX if pays else None
    # the tile's own floor where it runs at twice float32's rate (no AMX: AMD's Zen 5)
    shallowest = BF16_MIN_DEPTH if amx else BF16_TILE_MIN_DEPTH
    if ((depth is None or depth >= shallowest)
            and (weights is None or weights >= BF16_MIN_WEIGHTS)
            and gemm_kernel.available(gemm_kernel.BF16)):
        return gemm_kernel.BF16
    return None


def amx_pays(rows: int, depth: int) -> bool:
    """Whether an AMX product beats our float32 kernel once its activation is paired: K of 64
    or more, or from `AMX_SHORT_DEPTH` (padded to 32 with zero pairs) with a whole tile of
    rows. MobileNet v2's 1×1 convolutions (one thread, µs, in the plan's order, float32
    against AMX with pairing): K 16, 96 rows, 12544 columns 399 against 401 (both stream the
    4.8 MB output); K 24, 144 rows, 3136 columns 186 against 143 and 198 against 145; K 32,
    16 rows 152 against 249; K 32, 32 rows 275 against 286; K 96, 24 rows 183 against 96;
    K 144, 24 rows 393 against 234. Fewer than a tile of rows over K below 64 stay float32,
    unless their activation comes paired (`bf16_kernel`)."""
    return depth >= 2 * BF16_MIN_DEPTH or (depth >= AMX_SHORT_DEPTH and rows >= 32)


def _bf16_weight_product(weight: Any, right: Any, out: Any, workspace: Any,
                         handoff: bf16_handoff.PairedHandoff | None = None) -> Any:
    """``out = weight @ right`` in bf16: the constant weight rounded and paired once, the
    activation ``right`` paired down its columns on each run (`bf16.pairing`), into the
    words of ``handoff`` where there is one (its writer may have written them), on AMX or
    on AVX-512 BF16; there, the larger operand read once (word rows or column panels)."""
    kernel = bf16_kernel(workspace, out.shape[0], weight.shape[1], paired=handoff is not None)
    if kernel == gemm_kernel.AMX:
        shape = (bf16.amx_depth(weight.shape[1]), bf16.amx_rows(out.shape[1]))
        handed = None if handoff is None else bf16_handoff.words_for(handoff, shape, workspace)
        words = _amx_words(weight, out, workspace) if handed is None else handed
        pair = bf16.patch_pairing(right, 1, words)  # a matrix: a view with one K axis
        if pair is not None:
            if handed is not None:
                pair = bf16_handoff.take(handoff, pair)
            return bf16.paired_product(pair, _amx_weight_tiles(weight, words, out, workspace))
    if out.shape[1] <= BF16_TRANSPOSED_COLUMNS and worthwhile(*out.shape[::-1]):
        return _bf16_transposed(weight, right, out, workspace)
    packed = _bf16_packed(weight, workspace)
    handed = None if handoff is None else bf16_handoff.words_for(handoff, (
        bf16.amx_depth(weight.shape[1]), bf16.amx_rows(out.shape[1])), workspace)
    # Word rows the tile reads where they lie, row blocks outside (each block of the weight
    # read once, the words re-read from cache): the words a depthwise layer or a BatchNorm
    # may have written, as AMX reads them, an activation whose pairs are smaller than the
    # weight's, which column panels outside would read once per panel, or an output that
    # streams to memory (`rows_outside`). In a plan's walk,
    # ResNet-50 v2 at batch 1 in bf16, one Zen 5 core: 22.8 → 21.9 ms, its 2048 × 512 × 49
    # residual products 0.47 → 0.29 ms; MobileNet v2 2.91 → 2.76. Warm, the word rows run
    # as fast as the panels (µs, panels / words: MobileNet v2's 24 × 144 × 3136 46.0 / 47.4,
    # 32 × 192 × 784 21.0 / 20.9, 96 × 576 × 196 47.8 / 47.9, 320 × 960 × 49 79.8 / 79.4).
    if (handed is not None or packed.nbytes > right.nbytes // 2
            or rows_outside(right.nbytes // 2, out)):
        words = handed if handed is not None else workspace.zeroed(
            bf16.paired_shape(right.shape, False), np.float32, ("bf16 words", right.shape))
        pair = bf16.patch_pairing(right, 1, words)  # a matrix: a view with one K axis
        if pair is not None:
            product = gemm_kernel.bind_packed(packed, words[:packed.shape[1]], out,
                                              kernel=gemm_kernel.BF16)
            if handed is not None:
                pair = bf16_handoff.take(handoff, pair)
            return bf16.paired_product(pair, product)
    words = workspace.zeroed(bf16.paired_shape(right.shape, False, gemm_kernel.tile().columns),
                             np.float32, ("bf16 panels", right.shape))
    product = gemm_kernel.bind_both_packed(packed, words, out, kernel=gemm_kernel.BF16)
    return bf16.paired_product(bf16.pairing(right, words, False), product)


def _bf16_transposed(weight: Any, right: Any, out: Any, workspace: Any) -> Transposed:
    """``out = weight @ right`` on the AVX-512 BF16 tile as ``outᵀ = rightᵀ @ weightᵀ`` into
    scratch, then copied out transposed (`Transposed`, as `_transposed` in float32), where
    its few columns (positions; `BF16_TRANSPOSED_COLUMNS`) would leave the tile's vector
    lanes empty the other way."""
    panels = workspace.derived(weight, "bf16 panels of the transpose", lambda constant:
                               gemm_kernel.pack_columns(bf16.pair_columns(constant.T)))
    left = right.T
    words = workspace.zeroed(bf16.paired_shape(left.shape, True), np.float32,
                             ("bf16 rows", left.shape))
    rows, columns = out.shape[::-1]
    scratch = workspace.zeroed((rows, scratch_row(columns)), out.dtype,
                               ("gemm transposed",))[:, :columns]
    product = gemm_kernel.bind_packed_columns(words, panels, scratch, kernel=gemm_kernel.BF16)
    return Transposed(bf16.paired_product(bf16.pairing(left, words, True), product), out,
                      scratch.T)


def _bf16_packed(weight: Any, workspace: Any) -> Any:
    """The constant ``weight`` rounded, paired along its rows and packed as the AVX-512 BF16
    tile's A, once for the model's plans."""
    return workspace.derived(weight, "bf16 packed",
                             lambda constant: gemm_kernel.pack(bf16.pair_rows(constant)))


def _amx_words(weight: Any, out: Any, workspace: Any) -> Any:
    """The buffer an activation is paired into for ``out = weight @ activation`` on AMX.
    Tagged with K: the pad rows past K must stay zero, so a buffer is shared only by products
    of one K (another K's pairing would write them)."""
    shape = (bf16.amx_depth(weight.shape[1]), bf16.amx_rows(out.shape[1]))
    return workspace.zeroed(shape, np.float32, ("bf16 words", weight.shape[1]))


def _amx_weight_tiles(weight: Any, words: Any, out: Any, workspace: Any) -> Any:
    """``out = weight @ words`` on AMX, the weight's tiles packed once (`bf16.amx_pack_rows`).
    The outer loop re-reads the smaller operand: column blocks outside where the weight is
    the smaller (each block of paired activations stays in cache while every row block meets
    it), row blocks where the activations are (ResNet-18's 512-filter layers), or where the
    output is past `STREAMED_OUTPUT_BYTES` and the activations a quarter of it or less
    (`rows_outside`)."""
    tiles = workspace.derived(weight, "amx tiles", lambda constant: bf16.amx_pack_rows(
        bf16.amx_weight_rows(constant)))
    columns_outside = tiles.nbytes <= words.nbytes and not rows_outside(words.nbytes, out)
    return gemm_kernel.bind_tiles(tiles, words, out, columns_outside=columns_outside,
                                  packed=True)


def rows_outside(words_bytes: int, out: Any) -> bool:
    """Whether a bf16 product writing ``out`` from ``words_bytes`` of paired activations
    walks it row block by row block whatever its weight's size: an output too large for the
    core's cache, from activations that stay in it while each row block re-reads them.
    Column blocks outside, a tile's rows lie a whole output row apart, every row of the
    output a stream of its own, and each line is read from memory before it is written; row
    blocks outside, a tile's rows are written end to end. AMX, one thread, µs, column blocks
    then row blocks outside: 256 × 64 × 3136 (ResNet-50's 56² shortcut) 336 → 220, with a
    residual added 572 → 408; 512 × 128 × 784 with a residual 243 → 200; but 128 × 256 ×
    3136 (activations as large as the output) 299 → 411, and 1024 × 256 × 196 (output in
    cache) 92 → 100. The AVX-512 BF16 tile's 12 rows likewise, ResNet-50 v2 in bf16 at batch
    1 in the plan's walk, one Zen 5 core: its 56² residual products 0.32 → 0.25-0.27 ms, the
    28² ones 0.22-0.23 → 0.21; whole runs 19.5 → 18.8 ms (every core 11.2 → 10.9)."""
    return out.nbytes > STREAMED_OUTPUT_BYTES and 4 * words_bytes <= out.nbytes


def _bf16_product_with_weight(left: Any, weight: Any, out: Any, workspace: Any) -> Any:
    """``out = left @ weight`` in bf16: the constant weight rounded and paired once, the
    activation ``left`` paired along its rows on each run."""
    if bf16_kernel(workspace, out.shape[0], left.shape[1]) == gemm_kernel.AMX:
        columns = workspace.derived(weight, "amx columns", bf16.amx_weight_columns)
        words = workspace.zeroed((bf16.amx_rows(out.shape[0]), columns.shape[0]), np.float32,
                                 ("bf16 words", left.shape[1]))
        product = gemm_kernel.bind_tiles(words, columns, out)
    else:
        panels = workspace.derived(weight, "bf16 panels", lambda constant:
                                   gemm_kernel.pack_columns(bf16.pair_columns(constant)))
        words = workspace.zeroed(bf16.paired_shape(left.shape, True), np.float32,
                                 ("bf16 rows", left.shape))
        product = gemm_kernel.bind_packed_columns(words, panels, out, kernel=gemm_kernel.BF16)
    return bf16.paired_product(bf16.pairing(left, words, True), product)


def bf16_patch_product(weight: Any, view: Any, k_axes: int, out: Any, workspace: Any,
                       k_offsets: Any = None, handoff: Any = None,
                       source: Any = None) -> Callable[[], Any] | None:
    """``out = weight @ patches`` in bf16, the patches paired into bf16 words straight from
    ``view`` (an im2col view whose first ``k_axes`` axes run along K, or K's offsets given as
    ``k_offsets``: `bf16.patch_pairing`) with no patch array copied: on AMX, or on AVX-512
    BF16 (`_bf16_patch_words_product`); None outside a bf16 plan or where it cannot apply.
    ``handoff``: the one offered for ``source``, the array ``view`` reads
    (`copying_handed_words`)."""
    if (type(view) is not np.ndarray or type(weight) is not np.ndarray
            or weight.flags.writeable or weight.nbytes > PACK_LIMIT_BYTES
            or {weight.dtype, view.dtype, out.dtype} != {np.dtype(np.float32)}
            or out.ndim != 2 or (out.strides[1] != 4 and out.shape[1] > 1)
            or np.may_share_memory(out, view)):
        return None
    kernel = bf16_kernel(workspace, out.shape[0])
    if kernel == gemm_kernel.BF16:
        return _bf16_patch_words_product(weight, view, k_axes, out, workspace, k_offsets,
                                         handoff, source)
    if kernel != gemm_kernel.AMX:
        return None
    words = _amx_words(weight, out, workspace)
    pair = bf16.patch_pairing(view, k_axes, words, k_offsets=k_offsets)
    if pair is None:
        return None
    if handoff is not None and k_offsets is None:
        pair = copying_handed_words(handoff, source, view, k_axes, words, workspace, pair)
    return bf16.paired_product(pair, _amx_weight_tiles(weight, words, out, workspace))


def _bf16_patch_words_product(weight: Any, view: Any, k_axes: int, out: Any, workspace: Any,
                              k_offsets: Any = None, handoff: Any = None,
                              source: Any = None) -> Callable[[], Any] | None:
    """``out = weight @ patches`` on AVX-512 BF16, the patches paired straight from ``view``
    into word rows end to end (`bf16.patch_pairing`), which the tile reads where they lie
    (ResNet-18 in bf16 at batch 1 on one Zen 5 core: 12.2 ms, against 14.7 with im2col's
    copy then a pass pairing it). The smaller operand is the one re-read from cache: the
    words' column panels outside where the weight's pairs are smaller (64 filters at 56²),
    its row blocks where the words are (512 × 4608 × 49: 0.66 ms against 1.07).
    ``handoff``: the one offered for ``source``, which a strided 1×1 convolution (ResNet's
    downsampling shortcut) takes by copying its pixels' words out of the writer's
    (`copying_handed_words`), so that the writer lays words for both its readers."""
    depth = int(np.prod(view.shape[:k_axes]))
    columns = out.shape[1]
    words = workspace.zeroed((-(-depth // 2), columns), np.float32,
                             ("bf16 patch words", depth, columns))
    pair = bf16.patch_pairing(view, k_axes, words, k_offsets=k_offsets)
    if pair is None:
        return None
    if handoff is not None and k_offsets is None:
        pair = copying_handed_words(handoff, source, view, k_axes, words, workspace, pair)
    packed = _bf16_packed(weight, workspace)
    product = gemm_kernel.bind_packed(packed, words, out, kernel=gemm_kernel.BF16,
                                      columns_outside=packed.nbytes <= words.nbytes)
    return bf16.paired_product(pair, product)


def copying_handed_words(handoff: bf16_handoff.PairedHandoff, source: Any, view: Any,
                         k_axes: int, words: Any, workspace: Any,
                         pair: Callable[[], Any]) -> Callable[[], Any]:
    """``pair``, or where the view's words can be copied out of the hand-off's
    (`handed_copy`), the hand-off taken: where its writer laid the words, that copy runs in
    place of pairing the float32 array again."""
    copy = handed_copy(handoff, source, view, k_axes, words, workspace)
    return pair if copy is None else bf16_handoff.take(handoff, pair, copy)


def handed_copy(handoff: bf16_handoff.PairedHandoff, source: Any, view: Any, k_axes: int,
                words: Any, workspace: Any) -> Callable[[], Any] | None:
    """Where ``view`` reads every channel of ``source`` (the hand-off's array, one sample)
    in order and its pixels by any strides (a strided 1×1 convolution), a job copying the
    view's words out of the hand-off's into ``words`` (`bf16.word_copying`), taking
    nothing; else None."""
    channels, pixels = (source.shape[1], int(np.prod(source.shape[2:]))) \
        if source is not None and source.ndim >= 3 else (0, 0)
    if (source is None or tuple(source.shape) != tuple(handoff.source)
            or not source.flags.c_contiguous or source.dtype != np.float32
            or int(np.prod(view.shape[:k_axes])) != channels):
        return None
    steps = np.array(view.strides, np.int64) // view.itemsize
    k_steps = bf16.element_offsets(view.shape[:k_axes], steps[:k_axes])
    base = (view.ctypes.data - source.ctypes.data) // view.itemsize
    last = base + sum((size - 1) * step for size, step in
                      zip(view.shape[k_axes:], steps[k_axes:], strict=True))
    if (not np.array_equal(k_steps, np.arange(channels) * pixels) or min(steps[k_axes:]) < 0
            or not 0 <= base <= last < pixels):
        return None
    handed = bf16_handoff.words_for(handoff, handoff.shape, workspace)
    if handed is None:
        return None
    rows = -(-channels // 2)
    columns = np.lib.stride_tricks.as_strided(
        handed.reshape(-1)[base:], shape=(rows, *view.shape[k_axes:]),
        strides=(handed.strides[0], *view.strides[k_axes:]))
    return bf16.word_copying(columns, words)


def takes_bias(calls: list[Callable[[], Any]], bias: Any) -> bool:
    """Whether a layer's calls can take its bias into our products: each is a product of
    ours (each writing its own part of the output) or a copy, and the bias is read where it
    lies."""
    return (gemm_kernel.takes_bias(bias.reshape(-1)) and _ours_and_copies(calls))


def with_bias(calls: list[Callable[[], Any]], bias_rows: Any = None,
              bias_columns: Any = None) -> list[Callable[[], Any]]:
    """``calls`` with the bias added by each product of ours as it stores its results (where
    `takes_bias`): per row of the product (a convolution's filters) or per column (a dense
    layer's units). The seed MLP at 64 rows: two passes fewer per layer, 1-2 µs each."""
    rows = None if bias_rows is None else bias_rows.reshape(-1)
    columns = None if bias_columns is None else bias_columns.reshape(-1)
    return [call.with_epilogue(rows, columns) if _is_ours(call) else call for call in calls]


def clamped(calls: list[Callable[[], Any]], low: Any,
            high: Any) -> list[Callable[[], Any]] | None:
    """``calls`` with each product of ours clamping its results to [low, high], where the
    calls are such products and copies only (a copy moves clamped values); else None."""
    if not _ours_and_copies(calls):
        return None
    return [call.with_epilogue(low=low, high=high) if _is_ours(call) else call
            for call in calls]


def with_residual(calls: list[Callable[[], Any]], out: Any,
                  other: Any) -> list[Callable[[], Any]] | None:
    """``calls`` with each product adding ``other`` (laid out as ``out``) to its results
    after its bias, before its clamp, where every call is a product of ours writing inside
    ``out`` (a convolution's per-image or per-chunk products: each reads the residual's
    elements at its own part of ``out``); else None. A residual block's add: one pass over
    the output fewer."""
    if not calls or not all(getattr(call, "writes_within", None) is not None
                            and call.writes_within(out) for call in calls):
        return None
    return [call.with_residual(out, other) for call in calls]


def _transposed(weight: Any, right: Any, out: Any, workspace: Any) -> Callable[[], Any]:
    """``out = weight @ right`` computed as ``outᵀ = rightᵀ @ weightᵀ`` into scratch, then
    copied out transposed: for few columns (positions) and many rows (filters), where the
    columns would leave vector lanes empty (49 columns are computed as 64 the other way).
    One thread, Zen 4, weights evicted between calls (medians of 30): ResNet-18's 512×2304×49
    1.30 ms against BLAS's 1.52, MobileNet v2's 160×960×49 216 against 230 µs and 1280×320×49
    541 against 597 µs; warm, 512×4608×49 2.20 against 2.61 ms."""
    panels = workspace.derived(weight, "gemm panels of the transpose",
                               lambda constant: gemm_kernel.pack_columns(constant.T))
    rows, columns = out.shape[::-1]
    frame = workspace.zeroed((rows, scratch_row(columns)), out.dtype, ("gemm transposed",))
    scratch = frame[:, :columns]
    depths = depth_split.runs(*right.T.shape)
    if len(depths) == 1:
        product = _by_panels(right.T, weight.T, panels, scratch)
    else:  # A out of L2 on its own (`depth_split`); few rows: never one BLAS spreads
        spare = workspace.zeroed(frame.shape, out.dtype, ("gemm transposed, runs of K",))
        product = depth_split.bind(right.T, panels, frame, spare, columns, depths)
    return Transposed(product, out, scratch.T)


def scratch_row(columns: int) -> int:
    """The floats from one row of a transposed product's scratch to the next, for
    ``columns`` (filters) a row: on an AVX2 host, a row of a multiple of 512 bytes is made a
    cache line longer (`SCRATCH_ROW_SHIFT`); else ``columns`` (AVX-512 hosts keep the layout
    measured there)."""
    if host_features.has("avx512f") or columns * 4 % SCRATCH_ROW_SHIFT_EVERY:
        return columns
    return columns + SCRATCH_ROW_SHIFT // 4


def _by_panels(left: Any, right: Any, panels: Any, out: Any) -> Any:
    """``out = left @ right`` with ``panels = pack_columns(right)``."""
    return _threaded(left, right, out, gemm_kernel.bind_packed_columns(left, panels, out))


def _threaded(left: Any, right: Any, out: Any, whole: Any) -> Any:
    """``whole`` (ours), or for a product BLAS spreads well over several threads (see the
    module docstring), a `Threaded` choosing at each call."""
    if not spreads(left.shape[0], left.shape[1], right.shape[1]):
        return whole
    return Threaded(whole, partial(np.matmul, left, right, out), out)


def spreads(rows: int, depth: int, columns: int) -> bool:
    """Whether BLAS spreads a product of this shape well over several threads (see the
    module docstring)."""
    return rows * depth * columns >= THREADED_MACS and min(rows, depth) >= THREADED_SIDE


def spread(whole: Any, rows: int, depth: int, columns: int) -> Any:
    """``whole`` (ours), or for a product BLAS would spread over its threads, a `Spread`:
    for a weight held only packed (`packed_weight`), which BLAS cannot multiply."""
    return Spread(whole) if spreads(rows, depth, columns) else whole


def matmul_into(xp: Any, left: Any, right: Any, out: Any) -> Callable[[], Any]:
    """``xp.matmul(left, right)`` into ``out``, as one zero-argument call.

    NumPy's ``out`` goes by position: ufunc calls without keywords are ~0.2 µs cheaper at
    batch 1. CuPy's matmul takes ``out`` only as a keyword (by position it is a TypeError).
    """
    if xp is np:
        return partial(np.matmul, left, right, out)
    return partial(xp.matmul, left, right, out=out)


class Threaded:
    """A product that runs, at each call, on BLAS when BLAS has several threads then and the
    spin pool is not armed, else on ours (`gemm_kernel.Product`, on the pool's threads). Like
    a Product it takes an epilogue (`with_epilogue`) and a residual (`with_residual`), which
    BLAS's runs apply in NumPy passes after it, in the order ours adds them."""

    leaves_blas_alone = False  # BLAS runs it on its threads where it has several

    def __init__(self, ours: Any, blas: Callable[[], Any], out: Any,
                 epilogue: tuple[Any, Any, float, float] = (None, None, -np.inf, np.inf),
                 residual: Any = None) -> None:
        self.ours, self.blas, self.out, self._epilogue = ours, blas, out, epilogue
        self._residual = residual  # laid out as ``out``: the residual's elements for C's

    def __call__(self) -> None:
        if spin_pool.spinning() or blas_threads() < 2:
            self.ours()
            return
        self.blas()
        rows, columns, low, high = self._epilogue
        if rows is not None:
            np.add(self.out, rows.reshape(-1, 1), self.out)
        if columns is not None:
            np.add(self.out, columns.reshape(1, -1), self.out)
        if self._residual is not None:
            np.add(self.out, self._residual, self.out)
        if low > -np.inf or high < np.inf:
            np.clip(self.out, low, high, out=self.out)

    def replayable(self) -> bool:
        """Where it runs on ours, a job (`steady_walk`); on BLAS, NumPy's passes after."""
        return (spin_pool.spinning() or blas_threads() < 2) and steady_walk.replayable(
            self.ours)

    def with_epilogue(self, bias_rows: Any = None, bias_columns: Any = None,
                      low: float = -np.inf, high: float = np.inf) -> Threaded:
        """This product adding a bias per row and/or column, clamped to [low, high]."""
        rows, columns, old_low, old_high = self._epilogue
        epilogue = (rows if bias_rows is None else bias_rows,
                    columns if bias_columns is None else bias_columns,
                    max(old_low, low), min(old_high, high))
        ours = self.ours.with_epilogue(bias_rows, bias_columns, low, high)
        return Threaded(ours, self.blas, self.out, epilogue, self._residual)

    def writes_within(self, out: Any) -> bool:
        """Whether the product's output lies inside ``out`` (`Product.writes_within`)."""
        return self.ours.writes_within(out)

    def with_residual(self, out: Any, other: Any) -> Threaded:
        """This product adding ``other`` (laid out as ``out``, which C lies in) before its
        clamp (`Product.with_residual`): a ResNet v2 block's sum, whose product BLAS could
        run, added as ours stores it rather than in a pass of its own (one thread: the add
        over 256 × 3136 took 0.15–0.2 ms)."""
        ours = self.ours.with_residual(out, other)  # checks ``other``
        start = (self.out.ctypes.data - out.ctypes.data) // out.itemsize
        residual = np.lib.stride_tricks.as_strided(other.reshape(-1)[start:],
                                                   self.out.shape, self.out.strides)
        return Threaded(ours, self.blas, self.out, self._epilogue, residual)


class Spread:
    """Our product on as many threads as BLAS has, at each call: as it is inside an armed run
    (its parts take the pool's workers) or while BLAS keeps to one thread, else with the pool
    armed around it over BLAS's thread count. Where a `Threaded` would hand the product to
    BLAS: its weight is held only as our panels (`packed_weight`). Like a Product it takes an
    epilogue (`with_epilogue`)."""

    # So that a plan holding it runs as one holding a `Threaded` did: armed, or BLAS held to
    # one thread, around each run (`Plan._run_spinning`), where the product is simply ours.
    leaves_blas_alone = False

    def __init__(self, ours: Any) -> None:
        self.ours = ours

    def __call__(self) -> None:
        if spin_pool.spinning() or blas_threads() < 2:
            self.ours()
            return
        with spin_pool.armed():
            self.ours()

    def with_epilogue(self, bias_rows: Any = None, bias_columns: Any = None,
                      low: float = -np.inf, high: float = np.inf) -> Spread:
        """This product adding a bias per row and/or column, clamped to [low, high]."""
        return Spread(self.ours.with_epilogue(bias_rows, bias_columns, low, high))

    def writes_within(self, out: Any) -> bool:
        """Whether our product's output lies inside ``out`` (`Product.writes_within`)."""
        return self.ours.writes_within(out)

    def with_residual(self, out: Any, other: Any) -> Spread:
        """This product adding a residual (`Product.with_residual`)."""
        return Spread(self.ours.with_residual(out, other))


class Transposed:
    """``out = weight @ right`` run as ``outᵀ``'s product into scratch, then copied into
    ``out`` transposed (`_transposed`): ``source`` is the scratch viewed as ``out``. Like a
    Product it takes an epilogue: a bias per row of ``out`` is one per column of the product
    it runs, added with the clamp as the tiles store, where it had been a pass over ``out``
    after the copy (MobileNet v2's last 1×1 layers at 7², ResNet-50 v2's at 7² before their
    ReLU). It takes a residual too (`with_residual`): added as the copy moves the sums into
    ``out`` (one strided add in place of the copy), then the clamp, where it had been a pass
    over ``out`` of its own (MobileNet v2's projections at 7² ending a block)."""

    def __init__(self, product: Any, out: Any, source: Any, residual: Any = None,
                 bounds: tuple[float, float] = (-np.inf, np.inf)) -> None:
        self.product, self.out, self.source = product, out, source
        # without a residual, the product's tiles clamp to ``bounds``; with one, the copy
        self.residual, self.bounds = residual, bounds
        if residual is None:
            self.copy = partial(np.copyto, out, source)
            self.clamp = None
        else:
            self.copy = partial(np.add, source, residual, out)
            low, high = bounds
            self.clamp = (partial(np.clip, out, low, high, out)
                          if low > -np.inf or high < np.inf else None)
        # Armed, a product of ours cut in parts and the copy as one job cut by filters,
        # each core copying the rows it computed (`gemm_transposed`); else the product,
        # then NumPy's copy.
        self.run: Callable[[], Any] = partial(_in_turn, product, self.copy)
        if type(product) is gemm_kernel.Product and int(product.args[-1]) > 1:
            self.run = spin_pool.WhenArmed(
                partial(gemm_transposed.by_filters, product, out, source, residual), self.run)

    def __call__(self) -> None:
        self.run()
        if self.clamp is not None:
            self.clamp()

    def replayable(self) -> bool:
        """Where it runs as one job, armed, with no NumPy clamp after (`steady_walk`)."""
        return self.clamp is None and steady_walk.replayable(self.run)

    def with_epilogue(self, bias_rows: Any = None, bias_columns: Any = None,
                      low: float = -np.inf, high: float = np.inf) -> Transposed:
        """This product adding a bias per row and/or column of ``out``, clamped to
        [low, high] (after the residual where it adds one)."""
        bounds = (max(self.bounds[0], float(low)), min(self.bounds[1], float(high)))
        if self.residual is None:
            return Transposed(self.product.with_epilogue(bias_columns, bias_rows, low, high),
                              self.out, self.source, bounds=bounds)
        product = self.product
        if bias_rows is not None or bias_columns is not None:  # before the residual still
            product = product.with_epilogue(bias_columns, bias_rows)
        return Transposed(product, self.out, self.source, self.residual, bounds)

    def writes_within(self, out: Any) -> bool:
        """Whether ``out`` (C-contiguous) holds this call's output whole, so that a residual
        laid out as ``out`` lies as it does; and no clamp is set yet, which would come
        before the residual's sum."""
        mine = self.out
        return (mine.flags.c_contiguous and mine.dtype == np.float32
                and self.residual is None and self.bounds == (-np.inf, np.inf)
                and gemm_kernel.residual_fits(mine.ctypes.data, mine.nbytes, out))

    def with_residual(self, out: Any, other: Any) -> Transposed:
        """This product adding ``other`` (an array of ``out``'s shape, float32,
        C-contiguous) after its biases, before its clamp, as the copy stores each sum;
        ``out`` holds this call's output (`writes_within`)."""
        if (type(other) is not np.ndarray or other.dtype != np.float32
                or other.shape != out.shape or not other.flags.c_contiguous
                or not self.writes_within(out)):
            raise ValueError(f"a fused residual must be float32, C-contiguous and of the "
                             f"output's shape {out.shape}; got "
                             f"{getattr(other, 'dtype', type(other))} "
                             f"{getattr(other, 'shape', '')}")
        start = (self.out.ctypes.data - out.ctypes.data) // out.itemsize
        residual = other.reshape(-1)[start:start + self.out.size].reshape(self.out.shape)
        return Transposed(self.product, self.out, self.source, residual)


@steady_walk.in_turn
def _in_turn(first: Callable[[], Any], second: Callable[[], Any]) -> None:
    first()
    second()


def _ours_and_copies(calls: list[Callable[[], Any]]) -> bool:
    return (any(_is_ours(call) for call in calls)
            and all(_is_ours(call) or _is_copy(call) for call in calls))


def _is_ours(call: Any) -> bool:
    # a float32 register tile's product offering bf16 planes (`gemm_tile_handoff`) is one
    return isinstance(call, (gemm_kernel.Product, Threaded, Spread, Transposed,
                             bf16.PairedProduct, part_chain.Chain,
                             gemm_amx_handoff.HandingProduct))


def _is_copy(call: Any) -> bool:
    return isinstance(call, partial) and call.func in (np.copyto, parity_split.split_into)
