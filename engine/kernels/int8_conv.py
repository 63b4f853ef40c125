"""A quantized 2-d convolution as `spin_pool` jobs over the cores, every pass compiled.

The data are laid channels-last (padded, shifted onto uint8) once, unless the product can read
them where they lie (uint8 handed over channels-last without padding: the direct product's
tiles, a 1×1 product's rows, a table product's windows; `FusedConv.reads_data_in_place`).
The int8 GEMM then takes its rows in one of four ways:

* on AMX, a layer of whole 64-channel blocks has its tiles read the windows where they lie
  (`gemm_int8.direct_job`);
* on VNNI's kernels, or an AVX2 host's narrow-weight ones, the product reads the windows
  where they lie through a table of their addresses (`gemm_int8.table_job`), a stem's short
  kernel rows as runs padded to whole groups (`run_matrix`); uint8 windows at the border
  walk only their taps inside the image, on the AVX2 host by the taps product
  (`border_taps`), on VNNI by tiles of runs of 7 output pixels requantizing in their
  epilogue (`skips_padding_in_runs`: ResNet-18's 3×3 layers in int8 at batch 1 on one Zen 4
  core, each layer's best, 0.61–0.62 → 0.50–0.51 ms at 7², 0.53–0.55 → 0.48–0.49 at 14²,
  0.52–0.53 → 0.50–0.51 at 28², 0.54–0.56 → 0.52–0.53 at 56²);
* a 1×1 convolution of stride 1 whose channels fill K exactly reads the channels-last rows
  as they are;
* else each chunk of output positions has its patches gathered into the GEMM's rows.

The requantize adds the bias, scales, applies the activation, adds the residual, applies the
activation after the sum and rounds to the int8/uint8 output. Where the output goes
channels-last on AMX's direct tiles or VNNI's fused ones, it runs in the product's epilogue
(`FusedConv.requantizes_in_product`: one job over every row, no int32 sums written). Else it
is one pass over each chunk's sums after the chunk's product (`gemm_int8.product_job`),
written into the output's NCHW layout or channels-last (on an AVX2 host, output and residual
channels-last, `int8_requantize_ir`'s pass in LLVM IR, which writes the next pre-activation
beside it where asked, `Rescaled`). A chunk's rows and sums fit in L2 (`CHUNK_BYTES`), so each
pass reads the last one's writes from cache. A layer whose table product reads its windows
where they lie, or whose 1×1 product reads its rows in the copy, runs its products and
requantize passes as one chained job instead, share by share (`FusedConv._window_chain`), a
share's rows copied first in it where the 1×1 layer's data come channels-last.

The NumPy path (`engine.ops.quantized.integer.conv` then `requantize.finish`) makes about
ten passes over each layer's values, most in float64, on one core. The arithmetic here is
that path's step for step in float32 (the sums are exact integers, converted to float32 once;
products and sums in float32, in the same order, never fused into one rounding; halves
rounded to even), so the outputs are equal bit for bit (`tests/engine/kernels/
test_int8_conv.py` compares the two).

Scratch (the channels-last copy, the patch rows, the sums) comes from one `int8_memory.Scratch`
per thread: a plan runs its steps one at a time on one thread, so its layers share its
buffers, on huge pages for a layer whose plan is (``huge_pages``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import cache_sizes, compiled, host_features, kernel_jobs, llvm_jit, spin_pool
from engine.kernels import (
    border_taps,
    gemm_int8,
    int8_memory,
    int8_requantize_ir,
    part_chain,
    run_taps_ir,
)
from engine.kernels.gemm_int8_fused_ir import REQUANTIZED_COLUMNS

_kernels: dict[str, Any] = {}
# Output positions the requantize pass holds as bytes between its loops: up to TILE, fewer
# for many filters, so that its tiles (TILE_BYTES each, the output's and the residual's)
# stay in L1.
TILE, TILE_BYTES = 64, 8192
# `_requantize`'s flags: a residual is added; the residual is laid channels-last (N, H, W, C
# in its NCHW-shaped buffer); the output is; every sum plus its bias fits int32
# (`sums_fit_int32`), so they are added in int32 and converted to float32 from there: set only
# where the host lacks AVX-512 DQ, which converts int64 eight at once, where AVX2 converts
# int32 eight at once but int64 one at a time (a 64-filter layer's pass at 56², channels-last:
# 42 → 14 µs a chunk, one thread, Zen 3).
RESIDUAL, RESIDUAL_CHANNELS_LAST, OUT_CHANNELS_LAST, INT32_SUMS = 1, 2, 4, 8
# The shortest K a layer's product takes AMX for (32 rows at least): from 64, below the plain
# product's 256 (`integer.AMX_MIN_DEPTH`), as the direct product and its epilogue save the
# gather and the requantize pass, and the 3-channel stem (K 147) gains too (one thread,
# ResNet-18 at batch 1 3.8 → 3.5 ms, ResNet-50 v2 17.0 → 15.6 ms, in turn with 256; MobileNet
# v2 no change measured through the load).
AMX_MIN_DEPTH = 64
# A direct product requantized in its epilogue shares out its row blocks among its parts
# (each block's panels in turn, `gemm_int8_direct_ir`'s task) where its packed weights stay
# in cache from one block to the next and cost the cores less than the activations they
# would otherwise pass each other (`rows_first`): up to `ROWS_FIRST_BYTES` whatever its
# activations, up to `ROWS_FIRST_MOST_BYTES` where they are at most `ROWS_FIRST_RATIO` times
# its data and output; past that, as ResNet-18's 3×3 layers into 512 (2.3 MB), every block
# read them from L3 (1.4× their time at 7², one thread), and panel by panel each panel's
# weights serve all the blocks from L2.
ROWS_FIRST_BYTES, ROWS_FIRST_MOST_BYTES, ROWS_FIRST_RATIO = 2 ** 17, 2 ** 20, 2
# A tile's rows on wide rows (`FusedConv.wide_grid`): AMX's whole 16.
WIDE_TILE_ROWS = 16
# The grid width that makes every sum row its own output position (no wide rows): past any
# row count.
ONE_ROW = 2 ** 40
# Activation codes the requantize pass understands (`Activation.kind`).
ACTIVATIONS = {None: 0, "relu": 1, "bounded_relu": 2}


@dataclass(frozen=True)
class Geometry:
    """A 2-d convolution's shape: kernel, stride, dilation and padding, each (rows, columns)."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    dilate: tuple[int, int]
    pad: tuple[int, int]

    def out_size(self, height: int, width: int) -> tuple[int, int]:
        return tuple((size + 2 * p - (k - 1) * d - 1) // s + 1 for size, k, s, d, p in zip(
            (height, width), self.kernel, self.stride, self.dilate, self.pad, strict=True))


@dataclass
class Epilogue:
    """What the requantize pass applies to each sum, in `requantize.finish`'s order:
    ``(sum + bias[f]) · scales[f]``, the activation (``act``: relu or relu clipped at
    ``act_high``), ``+ residual_scale · residual``, the activation after the sum, then
    rounding half to even, saturated to ``[low, high]`` (stored with a wrap into the output's
    dtype, as NumPy's ``astype`` stores an int8 result into uint8)."""

    bias: np.ndarray  # int32 (F,)
    scales: np.ndarray  # float32 (F,)
    act: str | None = None
    act_high: float = 0.0
    residual_scale: float = 0.0
    postsum_act: str | None = None
    postsum_high: float = 0.0
    low: int = -128
    high: int = 127
    rescaled: Rescaled | None = None  # a second output, where the product writes one


@dataclass(frozen=True, eq=False)
class Rescaled:
    """A second output of a layer that writes one (`FusedConv.writes_rescaled`: its
    requantize in the direct product's epilogue, or `int8_requantize_ir`'s pass): ``out``
    (uint8, the first output's shape, laid channels-last) = saturate(rint(x · scale[f] +
    shift[f])) for each byte x of the first output as its dtype reads it, in float32, one
    product and one sum, as `int8_affine`'s pass makes it from the first (ResNet v2's next
    pre-activation BatchNorm and relu of a residual sum), so that pass does not read the
    first output again."""

    out: np.ndarray  # uint8, (N, F, OH, OW), written N, OH, OW, F
    scale: np.ndarray  # float32 (F,)
    shift: np.ndarray  # float32 (F,)


def supported_here() -> bool:
    """Whether the compiled pieces are present: numba, the spin pool and the int8 GEMM."""
    return compiled.available() and spin_pool.available() and gemm_int8.available()


def supported(data: np.ndarray, weight: np.ndarray, geometry: Geometry, groups: int) -> bool:
    """Whether this module runs the convolution: int8/uint8 data of 4 axes, int8 weights of
    one group within the GEMM's exact depth, and the compiled pieces present."""
    return (data.ndim == 4 and data.dtype in (np.uint8, np.int8) and weight.dtype == np.int8
            and groups == 1 and weight.ndim == 4 and weight.shape[1] == data.shape[1]
            and weight[0].size <= gemm_int8.EXACT_DEPTH and supported_here())


class EpilogueLayer:
    """What a fused int8 layer (`FusedConv`, `int8_depthwise.FusedDepthwise`) shares: its
    output and residual checked, the epilogue's bias and scales in arrays its jobs read, and
    the jobs bound once per thread (`_bind`) and again when a different `Epilogue` comes.
    ``huge_pages``: its scratch is carved from huge pages (its plan's arrays are on them,
    `int8_memory`)."""

    def __init__(self, what: str, out: np.ndarray, residual: np.ndarray | None,
                 shape: tuple[int, ...], huge_pages: bool = False) -> None:
        self.huge_pages = huge_pages
        if out.shape != shape or out.dtype not in (np.uint8, np.int8):
            raise ValueError(f"{what}: output {out.dtype} {out.shape} is not int8/uint8 "
                             f"{shape}")
        if residual is not None and (residual.shape != out.shape
                                     or residual.dtype not in (np.uint8, np.int8)):
            raise ValueError(f"{what}: residual {residual.dtype} {residual.shape} does not "
                             f"match the output {out.shape}")
        self.out, self.residual = out, residual
        self.bias = np.zeros(shape[1], np.int32)
        self.scales = np.zeros(shape[1], np.float32)
        self._jobs: dict[int, tuple[Any, ...]] = {}
        self._epilogue: Epilogue | None = None

    def __call__(self, epilogue: Epilogue) -> None:
        """Compute the layer into ``out`` with ``epilogue``'s terms (the jobs are bound
        again when a different `Epilogue` comes: callers keep one per data range)."""
        for job in self.jobs_for(epilogue):
            job()

    def jobs_for(self, epilogue: Epilogue) -> tuple[Any, ...]:
        """The calling thread's jobs computing the layer with ``epilogue``'s terms, called
        in order: bound at the first ask, valid until another `Epilogue` is asked for."""
        if epilogue is not self._epilogue:
            np.copyto(self.bias, epilogue.bias)
            np.copyto(self.scales, epilogue.scales)
            self._jobs.clear()
            self._epilogue = epilogue
        jobs = self._jobs.get(threading.get_ident())
        if jobs is None:
            jobs = self._jobs[threading.get_ident()] = self._bind(epilogue)
        return jobs

    def _bind(self, epilogue: Epilogue) -> tuple[Any, ...]:
        raise NotImplementedError


@dataclass(frozen=True)
class Layouts:
    """Which of a `FusedConv`'s arrays hold their values channels-last: N, H, W, C in the
    bytes of an array shaped (N, C, H, W), as one fused layer hands its output to the next
    (no transpose on either side)."""

    data: bool = False
    out: bool = False
    residual: bool = False


class FusedConv(EpilogueLayer):
    """The convolution of ``data`` (N, C, H, W) by ``weight`` (F, C, kh, kw), packed in
    ``packed`` (`weight_matrix`'s, packed for ``N · OH · OW`` rows), requantized
    into ``out`` (N, F, OH, OW) int8 or uint8, with ``residual`` (the shape of ``out``) added
    where given; ``laid`` says which arrays hold channels-last bytes instead (`Layouts`).
    The arrays are the plan's buffers: their addresses are bound into the jobs once per
    thread, and each call reads their contents. ``huge_pages``: `EpilogueLayer`'s."""

    def __init__(self, data: np.ndarray, weight: np.ndarray, packed: gemm_int8.PackedWeights,
                 geometry: Geometry, out: np.ndarray, residual: np.ndarray | None = None,
                 laid: Layouts | None = None, huge_pages: bool = False) -> None:
        batch, channels, height, width = data.shape
        self.laid = laid or Layouts()
        out_h, out_w = geometry.out_size(height, width)
        super().__init__("int8 convolution", out, residual,
                         (batch, weight.shape[0], out_h, out_w), huge_pages)
        self.data, self.weight, self.geometry = data, weight, geometry
        filters = weight.shape[0]
        self.rows = batch * out_h * out_w
        self.positions = out_h * out_w
        self.padded_size = (height + 2 * geometry.pad[0], width + 2 * geometry.pad[1])
        # weights packed from `tap_rows_matrix` (K of 64 a group of ``stack`` kernel rows)
        # where the layer has rows of taps, else from `weight_matrix`; the copy the
        # product reads then holds ``stack`` padded rows a pixel (`stacked_rows`), or one
        # where the weights were packed a kernel row a step
        self.stack = 1
        self.tap_rows = has_tap_rows(channels, geometry, out_w) and packed.amx
        if self.tap_rows:
            stack = stacked_rows(channels, geometry, out_w)
            if packed.k == -(-geometry.kernel[0] // stack) * 64:
                self.stack = stack
            self.tap_rows = packed.k == -(-geometry.kernel[0] // self.stack) * 64
        # weights packed from `run_matrix` (each kernel row's run padded to `run_bytes`)
        self.run = run_bytes(channels, geometry) if packed.k == geometry.kernel[0] * \
            (run_bytes(channels, geometry) or 0) and not packed.amx else None
        if (packed.k != weight[0].size and not (self.tap_rows or self.run)) or \
                packed.n != filters:
            raise ValueError(f"int8 convolution: packed weights ({packed.k}, {packed.n}) do "
                             f"not fit {weight.shape}")
        self.packed = packed
        # On AMX with whole 64-channel blocks (or rows of taps, or a 1×1 kernel: its last
        # step's bytes past a pixel's channels meet zero weights), the product's tiles read
        # the windows from the channels-last copy where they lie (`gemm_int8.direct_job`,
        # which can requantize in its epilogue): no gather.
        self.tile_rows = gemm_int8.direct_tile_rows(out_w) if (packed.amx and (
            channels % 64 == 0 or self.tap_rows or geometry.kernel == (1, 1))) else 0
        # Else a 1×1 convolution of stride 1 without padding whose channels fill K's padding
        # exactly: the channels-last copy's rows are the GEMM's rows as they are, no gather.
        self.gathers = not (self.tile_rows or (
            geometry.kernel == (1, 1) and geometry.stride == (1, 1) and geometry.pad == (0, 0)
            and channels == packed.groups * 4))
        # Else, on VNNI's kernels or the AVX2 host's narrow-weight ones, where each group of
        # four K values lies in one pixel's channels (channels a multiple of 4), the product
        # reads each window where it lies in the channels-last copy, by a table of the
        # windows' addresses and one of the groups' offsets within a window
        # (`gemm_int8.table_job`): no gather. (ResNet-18 int8 at batch 1 on Zen 5, before
        # VNNI's tiles requantized in their epilogue: 4.9 → 4.7 ms on one core, 3.8 → 2.5 on
        # two, where the cores then met once a layer, `_window_chain`.)
        # Kernel rows whose runs are not (a stem's 7 × 3 channels) take weights packed
        # from `run_matrix` instead, each run read as whole groups.
        self.reads_windows = bool(self.gathers and gemm_int8.table_runs(packed) and (
            self.run or (channels % 4 == 0 and packed.groups * 4 == weight[0].size)))
        if self.run and not self.reads_windows:
            raise ValueError("int8 convolution: weights packed by padded runs need the "
                             "table product (VNNI, or narrow weights on AVX2)")
        self.gathers = self.gathers and not self.reads_windows
        # On VNNI's tiles, a product reading its rows without a gather (windows by their
        # table, or a 1×1 layer's rows) can requantize each tile in its epilogue
        # (`gemm_int8.fused_job`) where the output goes channels-last: no sums written, no
        # pass of their own (`requantizes_in_product`).
        self.vnni_epilogue = not (self.tile_rows or self.gathers) and \
            gemm_int8.fused_runs(packed)
        # The product's sum rows: one an output position, or on wide rows (`wide_grid`) one
        # a pixel of the padded image up to the last output position's.
        self.grid = self.wide_grid()
        self.sum_rows = self.rows
        if self.grid is not None:
            self.tile_rows = WIDE_TILE_ROWS
            padded_h, padded_w = self.padded_size
            self.sum_rows = (batch - 1) * padded_h * padded_w + (out_h - 1) * padded_w + out_w

    def wide_grid(self) -> tuple[int, int] | None:
        """The padded image's (width, height) where a stride-1 layer's product runs on wide
        rows, else None. A tile's rows need not stay in one output row: at stride 1 the
        windows of consecutive pixels of the padded image lie one pixel apart, so a tile of
        16 sum rows reads 16 consecutive pixels whatever rows they cross, and the sums at
        pixels past the output's columns (the padding's) are computed and dropped by the
        epilogue. Taken for a kernel wider than 1×1 requantized in its epilogue where it
        makes a quarter fewer row blocks than tiles within an output row: at 7² a tile of
        those holds 7 rows of AMX's 16, wide rows 16 (7 of each 9 kept), so each block's K
        steps multiply twice the rows (ResNet-18's 512-channel 3×3 layers at batch 1:
        4 row blocks of 14 → 2 of 32)."""
        geometry = self.geometry
        if not (self.tile_rows and self.requantizes_in_product and not self.tap_rows
                and geometry.stride == (1, 1) and geometry.kernel != (1, 1)):
            return None
        batch = self.data.shape[0]
        out_h, out_w = self.out.shape[2:]
        padded_h, padded_w = self.padded_size
        rows = (batch - 1) * padded_h * padded_w + (out_h - 1) * padded_w + out_w
        wide_blocks = -(-rows // (2 * WIDE_TILE_ROWS))
        blocks = -(-self.rows // (2 * self.tile_rows))
        return (padded_w, padded_h) if 4 * wide_blocks <= 3 * blocks else None

    @property
    def requantizes_in_product(self) -> bool:
        """Whether the product requantizes each block in its epilogue: a channels-last
        output (and residual) on AMX's direct tiles or VNNI's fused ones
        (`vnni_epilogue`)."""
        return bool((self.tile_rows or self.vnni_epilogue) and self.laid.out
                    and (self.residual is None or self.laid.residual))

    @property
    def writes_rescaled(self) -> bool:
        """Whether the layer can write an `Epilogue`'s second output (`Rescaled`): where
        its requantize runs in the direct product's epilogue, or as `int8_requantize_ir`'s
        pass (an AVX2 host's, `vector_requantizes`), each from the codes in registers."""
        return self.requantizes_in_product or self.vector_requantizes

    @property
    def vector_requantizes(self) -> bool:
        """Whether the requantize runs as `int8_requantize_ir`'s pass: int32 sums
        (`INT32_SUMS`, an AVX2 host's), the output and any residual channels-last, whole
        steps of filters, the pass compiled here."""
        if self.requantizes_in_product:
            return False
        flags = self._requantize_flags()
        laid = OUT_CHANNELS_LAST | INT32_SUMS
        if flags & laid != laid or flags & RESIDUAL and not flags & RESIDUAL_CHANNELS_LAST \
                or not int8_requantize_ir.supported(self.weight.shape[0]):
            return False
        return _requantize_vector.address(int8_requantize_ir.task_name(False)) is not None

    @property
    def skips_padding(self) -> bool:
        """Whether the product walks only the taps of each window inside the image
        (`gemm_int8.taps_job`, `border_taps`): windows read where they lie in whole groups
        of channels (`reads_windows`, no runs), padding to skip, and uint8 data, whose
        padding holds zeros that add nothing (int8 data's holds 128, which the column
        offsets take out over every tap)."""
        return bool(self.reads_windows and not self.run and self.stack == 1
                    and any(self.geometry.pad) and self.data.dtype == np.uint8
                    and gemm_int8.taps_run(self.packed))

    @property
    def skips_padding_in_runs(self) -> bool:
        """Whether VNNI's tiles requantizing in their epilogue run over runs of output
        positions, leaving out each tap of a window in the padding (`gemm_int8.fused_job`'s
        ``runs``): windows read by their table in whole groups of channels (no runs of
        kernel rows), uint8 data (the padding's bytes zeros), padding to skip, output rows a
        whole number of runs, and panels of 2 or 4 vectors."""
        return bool(self.reads_windows and self.requantizes_in_product and not self.tile_rows
                    and not self.run and self.stack == 1 and any(self.geometry.pad)
                    and self.data.dtype == np.uint8
                    and self.out.shape[3] % run_taps_ir.SEGMENT == 0
                    and self.packed.vectors % 2 == 0)

    @property
    def reads_data_in_place(self) -> bool:
        """Whether the product reads the data where they lie, not a copy made before it:
        unpadded uint8 handed over channels-last (the copy's bytes already), read by the
        direct product's tiles in whole 64-channel blocks, or as a 1×1 product's rows
        (`reads_rows_in_place`)."""
        unpadded = self.laid.data and self.geometry.pad == (0, 0) and \
            self.data.dtype == np.uint8
        return bool(unpadded and (self.tile_rows and self.data.shape[1] % 64 == 0
                                  and self.grid is None or self.reads_rows_in_place))

    @property
    def reads_rows_in_place(self) -> bool:
        """Whether the GEMM reads its rows where they lie in unpadded uint8 data handed over
        channels-last, whose copy would be the same bytes: a 1×1 product of stride 1 whose
        channels fill K exactly, in whole row blocks of the packing or with a short last block
        computed a row at a time (`gemm_int8.reads_rows_only`: no block reads past the data's
        end; ResNet-50 v2's 7² layers, 49 rows), or a product reading windows by their
        addresses (`table_job`, where no window passes the data's end) of kernel rows in
        whole groups of four (a 1×1 layer of stride 2). ResNet-50 v2's 1×1 layers:
        0.01–0.07 ms of copy a layer on an AVX2 host."""
        if self.gathers or self.tile_rows or not (
                self.laid.data and self.geometry.pad == (0, 0)
                and self.data.dtype == np.uint8):
            return False
        if self.reads_windows:
            return not self.run
        return gemm_int8.reads_rows_only(self.packed, self.rows)

    def _bind(self, epilogue: Epilogue) -> tuple[Any, ...]:
        data, geometry, packed = self.data, self.geometry, self.packed
        batch, channels, height, width = data.shape
        padded_h, padded_w = self.padded_size
        out_h, out_w = self.out.shape[2:]
        signed = data.dtype == np.int8
        scratch = int8_memory.scratch()
        huge = self.huge_pages
        runs = None
        if self.skips_padding_in_runs:
            block = gemm_int8.RUN_ROWS
            runs = gemm_int8.TapRuns(border_taps.tap_bounds(
                (height, width), (out_h, out_w), geometry.kernel, geometry.stride,
                geometry.dilate, geometry.pad), out_w, out_h * out_w,
                geometry.stride[1] * channels)
        else:
            block = 2 * self.tile_rows if self.tile_rows else packed.rows
        fused = self.requantizes_in_product
        # A product requantized in its epilogue writes no sums and reads no patch rows: one
        # job over every row, not a chunk's each (a job a chunk cost ResNet-18's 64 → 64 3×3
        # at 56², batch 8, one thread, 1.10× its time: 13 calls, each part starting anew)
        total = self.sum_rows if fused else self.rows
        chunk = total if fused else chunk_rows(self.rows, packed, block, self.gathers)
        blocks = -(-chunk // block)
        # without a gather the GEMM reads the copy's rows, its last row block whole: room for
        # that block's rows past the end (their sums are computed and never read)
        tail = packed.rows * channels if not (self.gathers or self.tile_rows
                                              or self.reads_windows) else 0
        if self.run:  # a window's last run read on past the image's last pixel
            tail = self.run
        # a pixel of the copy: its channels, for each of the ``stack`` rows it holds
        depth = channels * self.stack
        image_bytes = batch * padded_h * padded_w * depth
        if self.tile_rows:
            steps, starts = self._direct_offsets(block)
            # a tile row reads whole 64-byte steps on, and wide rows' last tiles pixels
            # past the image's last (their sums dropped)
            reach = int(starts.max()) + (self.tile_rows - 1) * geometry.stride[1] * depth \
                + int(steps.max()) + 64
            tail = max(tail, reach - image_bytes)
        padded = scratch.take("channels_last", image_bytes + tail, np.uint8, huge)
        rows = scratch.take("rows", blocks * packed.rows * packed.groups * 4 if self.gathers
                            else 0, np.uint8, huge)
        columns = packed.panels * packed.vectors * gemm_int8.LANES
        sums = scratch.take("sums", (1 if fused else blocks) * block * columns,
                            np.int32, huge).reshape(-1, columns)
        flat = data.reshape(-1).view(np.uint8)
        if self.stack > 1:
            jobs = self._stacked_lay(flat, signed, padded, scratch)
        else:
            jobs = [kernel_jobs.bind(
                (__name__, "padded_copy" if self.laid.data else "channels_last"), (
                    flat, 128 if signed else 0, channels, height, width, geometry.pad[0],
                    geometry.pad[1], padded, padded_h, padded_w), batch * padded_h,
                kernel_jobs.parts_for(batch * padded_h, 2 * padded.size))]
        residual = self.residual
        if residual is None:
            residual = np.zeros(1, np.int8)
        out = self.out.reshape(-1)
        if self.reads_data_in_place:
            # unpadded uint8 channels-last data is the copy already: the tiles or the GEMM
            # read it there (where no step passes a pixel's channels, and no row block the
            # data's end, so none reads past it)
            jobs, padded = [], flat
        if epilogue.rescaled is not None and not self.writes_rescaled:
            raise ValueError("int8 convolution: a second output needs the requantize in the "
                             "direct product (channels-last output and residual on AMX) or "
                             "in `int8_requantize_ir`'s pass")
        chained = None
        if self.reads_windows:
            addresses, group_offsets = self._window_table(padded, block)
        if fused and not self.tile_rows:  # VNNI's tiles requantizing in their epilogue
            rows_or_table = (addresses, group_offsets) if self.reads_windows else (
                self._rows_from(padded, 0, blocks * block), 0)
            jobs.append(gemm_int8.fused_job(
                *rows_or_table, total, packed, signed,
                self._epilogue_terms(epilogue, 0, total, columns), padded, runs))
            total = 0  # one job over every row
        elif self.reads_windows:
            windows = partial(self._table_share, addresses, group_offsets, signed, padded)
            if self.skips_padding:
                windows = partial(self._taps_share, border_taps.TapRows(
                    addresses, group_offsets, packed, geometry, (height, width),
                    (out_h, out_w)), padded)
            chained = self._window_chain(epilogue, windows, residual, out, scratch)
        elif not (self.tile_rows or self.gathers or fused or host_features.has("avx512f")):
            # (measured on AVX2 hosts; AVX-512 ones keep their chunks' jobs)
            lay = partial(self._copy_share, flat, signed, padded) if (
                jobs and self.laid.data and self.stack == 1) else None
            chained = self._window_chain(epilogue, partial(
                self._rows_share, padded, signed), residual, out, scratch, lay)
            if chained is not None and lay is not None:
                jobs = []  # each share copies its own rows first
        if chained is not None:
            jobs.append(chained)
            total = 0  # no chunk's jobs of their own
        for first in range(0, total, chunk):
            count = min(chunk, total - first)
            used = -(-count // block) * block
            if self.tile_rows:
                jobs.append(gemm_int8.direct_job(
                    padded, geometry.stride[1] * depth, steps,
                    starts[first // self.tile_rows:], count, packed, signed, self.tile_rows,
                    sums if fused else sums[:used],
                    self._epilogue_terms(epilogue, first, count, columns) if fused else None))
                if fused:
                    continue
            elif self.reads_windows:
                jobs.append(windows(first, count, sums[:used]))
            else:
                if self.gathers:
                    patches = rows.reshape(-1, packed.groups * 4)
                    jobs.append(kernel_jobs.bind((__name__, "gather"), (
                        padded, channels, padded_h, padded_w, out_h, out_w, *geometry.kernel,
                        *geometry.stride, *geometry.dilate, first, patches), count,
                        kernel_jobs.parts_for(count, 2 * count * packed.k)))
                else:
                    patches = self._rows_from(padded, first, used)
                jobs.append(gemm_int8.product_job(patches[:used], count, packed, signed,
                                                  sums[:min(used, len(patches))]))
            jobs.append(self._requantize_job(epilogue, sums, first, count, residual, out))
        if any(job is None for job in jobs):
            raise RuntimeError("int8 convolution: a job could not be bound")
        return tuple(jobs)

    def _requantize_job(self, epilogue: Epilogue, sums: np.ndarray, first: int, count: int,
                        residual: np.ndarray, out: np.ndarray) -> Any:
        """The requantize pass over ``sums``' first ``count`` rows, output positions [first,
        first + count): `int8_requantize_ir`'s where it covers the layer (writing the
        epilogue's second output too where it has one), else `_requantize`'s; None where
        neither binds."""
        return self._vector_requantize(epilogue, sums, first, count) or kernel_jobs.bind(
            (__name__, "requantize"), (
                sums, self.bias, self.scales, ACTIVATIONS[epilogue.act],
                np.float32(epilogue.act_high), residual.reshape(-1), self._requantize_flags(),
                np.float32(epilogue.residual_scale), ACTIVATIONS[epilogue.postsum_act],
                np.float32(epilogue.postsum_high), epilogue.low, epilogue.high, out,
                self.weight.shape[0], self.positions, first), count,
            kernel_jobs.parts_for(count, 3 * count * self.weight.shape[0]))

    def _table_share(self, addresses: np.ndarray, group_offsets: np.ndarray, signed: bool,
                     padded: np.ndarray, first: int, count: int, region: np.ndarray) -> Any:
        """The product of a share reading its windows where they lie (`reads_windows`)."""
        return gemm_int8.table_job(addresses[first:], group_offsets, count, self.packed,
                                   signed, region, padded)

    def _taps_share(self, taps: border_taps.TapRows, padded: np.ndarray, first: int,
                    count: int, region: np.ndarray) -> Any:
        """The product of a share walking only its windows' taps inside the image
        (`skips_padding`)."""
        entries, steps = taps.entries(first, count)
        return gemm_int8.taps_job(entries, count, self.packed, region, (padded, *steps))

    def _rows_share(self, padded: np.ndarray, signed: bool, first: int, count: int,
                    region: np.ndarray) -> Any:
        """The product of a share whose patch rows lie in ``padded`` (a 1×1 layer of stride
        1), each position's channels one row: whole row blocks, the last read past the
        layer's end into the copy's tail, as the chunks' products read it, or, read in the
        data handed over, ending at its end (`_rows_from`)."""
        used = -(-count // self.packed.rows) * self.packed.rows
        patches = self._rows_from(padded, first, used)
        return gemm_int8.product_job(patches, count, self.packed, signed,
                                     region[:len(patches)])

    def _rows_from(self, padded: np.ndarray, first: int, used: int) -> np.ndarray:
        """The GEMM's rows from position ``first`` on in ``padded`` (the copy, or the data
        where its rows are read in place), one a position's channels: ``used`` of them (whole
        row blocks), or those that lie before the data's end where a short last block is
        read in place (`gemm_int8.reads_rows_only`: computed a row at a time, nothing past
        the data read)."""
        channels = self.data.shape[1]
        rows = min(used, padded.size // channels - first)
        return padded[first * channels:(first + rows) * channels].reshape(rows, channels)

    def _copy_share(self, flat: np.ndarray, signed: bool, padded: np.ndarray, first: int,
                    count: int) -> Any:
        """The copy of output positions [first, first + count) of a 1×1 layer of stride 1
        whose data come channels-last without padding (int8 shifted onto uint8): one
        contiguous run of bytes, laid as `_padded_copy`'s one row of ``count`` pixels, in
        one part. The rows past the layer's end that a share's last row block reads stay as
        the copy made by the whole layer left them (their sums are never read)."""
        channels = self.data.shape[1]
        start, stop = first * channels, (first + count) * channels
        return kernel_jobs.bind((__name__, "padded_copy"), (
            flat[start:stop], 128 if signed else 0, channels, 1, count, 0, 0,
            padded[start:stop], 1, count), 1, 1)

    def _window_chain(self, epilogue: Epilogue, product: Callable[[int, int, np.ndarray], Any],
                      residual: np.ndarray, out: np.ndarray, scratch: int8_memory.Scratch,
                      lay: Callable[[int, int], Any] | None = None) -> Any:
        """A layer reading its windows where they lie (`reads_windows`), or its patch rows in
        the copy (`_rows_share`: a 1×1 layer of stride 1), as one job over the cores
        (`part_chain`): its output positions cut into shares of at most about `chunk_bytes`
        of sums, as many for each part, each share's product (``product(first, count,
        region)``) and then its requantize pass (`_requantize_job`, the chunks' own) run on
        one thread with no wait between, where the chunks' products and passes were a job
        each and the cores met at the end of every one (ResNet-18 at batch 8: 13 chunks of a
        3×3 layer at 56², 27 jobs; MobileNet v2's 1×1 expansion 16 → 96 at 112², batch 1,
        13 chunks, 26 jobs). Armed, the job runs in one part a core, each claiming shares as
        it comes to them and reusing a region of sums of its own, so that every share is
        bound once over each part's region; on one thread every share reuses the first.
        None where the layer's weights are better shared among the cores by panels than its
        rows are (`chain_rows_first`: ResNet-18's 3×3 layers of stages 3 and 4 at batch 1, of
        stage 4 at batch 8), where the host has one core, or where the chain cannot run
        here. ``lay(first, count)``: a step copying a share's data before its product (the
        channels-last copy of a 1×1 layer's int8 data, folded into the chain: the cores
        meet once a layer, not twice, and a share's product reads the rows its core has
        just written)."""
        packed, block = self.packed, self.packed.rows
        parts = spin_pool.cores()
        row_blocks = -(-self.rows // block)
        if parts < 2 or not chain_rows_first(packed, self.data.nbytes + self.out.nbytes,
                                             row_blocks):
            return None
        columns = packed.panels * packed.vectors * gemm_int8.LANES
        # as many shares for each part, each about a chunk of sums at most (rows_first leaves
        # two row blocks a part at least, so whole blocks make as many shares as parts)
        shares = parts * max(1, -(-self.rows * 4 * columns // (parts * chunk_bytes())))
        share_blocks = -(-row_blocks // shares)
        shares = -(-row_blocks // share_blocks)
        share_rows = share_blocks * block
        sums = scratch.take("sums", parts * share_rows * columns, np.int32,
                            self.huge_pages).reshape(parts, share_rows, columns)
        # each share bound over the region run alone (the first), then over each part's
        tables: list[list[list[Any]]] = [[] for _ in range(parts + 1)]
        for index in range(shares):
            first = index * share_rows
            count = min(share_rows, self.rows - first)
            copy = [] if lay is None else [lay(first, count)]
            for table, region in zip(tables, (sums[0], *sums), strict=True):
                table.append([
                    *copy, product(first, count, region),
                    self._requantize_job(epilogue, region, first, count, residual, out)])
        if any(step is None for table in tables for steps in table for step in steps):
            return None
        return part_chain.chain(tables[1:], tables[0], parts)

    def _stacked_lay(self, flat: np.ndarray, signed: bool, stacked: np.ndarray,
                     scratch: int8_memory.Scratch) -> list[Any]:
        """The jobs laying the data with `stack` padded rows a pixel into ``stacked``
        (`int8_stack_ir`, which shifts int8 onto uint8): read where it lies channels-last,
        else first copied channels-last (unpadded) into scratch."""
        batch, channels, height, width = self.data.shape
        padded_h, padded_w = self.padded_size
        address = stack_task(channels, self.stack)
        if address is None:
            raise RuntimeError("int8 convolution: the stacked copy does not compile here")
        shift = 128 if signed else 0
        jobs: list[Any] = []
        source = flat
        if not self.laid.data:  # the bytes as they are: the stacked copy shifts them
            source = scratch.take("unstacked", flat.size, np.uint8, self.huge_pages)
            jobs.append(kernel_jobs.bind((__name__, "channels_last"), (
                flat, 0, channels, height, width, 0, 0, source, height, width),
                batch * height, kernel_jobs.parts_for(batch * height, 2 * flat.size)))
        rows = batch * padded_h
        context = np.array([source.ctypes.data, stacked.ctypes.data, rows, padded_h, padded_w,
                            height, width, *self.geometry.pad, self.geometry.dilate[0], shift],
                           np.int64)
        jobs.append(spin_pool.job(address, context, kernel_jobs.parts_for(
            rows, 2 * stacked.size), keep=(source, stacked)))
        return jobs

    def _epilogue_terms(self, epilogue: Epilogue, first: int, count: int,
                        columns: int) -> tuple[Any, ...]:
        """`int8_epilogue_ir`'s requantize terms for output positions [first, first +
        count): the same arithmetic as `_requantize` (its bounds as numbers, infinite where
        an activation has none), into the channels-last output."""
        filters = self.weight.shape[0]
        # whole calls of the requantize's columns (a 16-column panel's reads 32 of each)
        columns = -(-columns // REQUANTIZED_COLUMNS) * REQUANTIZED_COLUMNS
        bias = np.zeros(columns, np.int32)
        bias[:filters] = self.bias
        scales = np.zeros(columns, np.float32)
        scales[:filters] = self.scales
        if self.residual is not None:
            residual, stride = self.residual.reshape(-1)[first * filters:], filters
        else:  # a zero row read for each position: the sum adds 0
            residual, stride = np.zeros(columns, np.int8), 0
        out = self.out.reshape(-1)[first * filters:]
        # the second output's scales and shifts padded as the first's (zeros read, never
        # used, where there is none)
        rescale = np.zeros((2, columns), np.float32)
        rescaled = epilogue.rescaled
        second = 0
        if rescaled is not None:
            _check_rescaled(rescaled, self.out)
            rescale[0, :filters], rescale[1, :filters] = rescaled.scale, rescaled.shift
            second_out = rescaled.out.reshape(-1)[first * filters:]
            second = second_out.ctypes.data
        from engine.kernels.int8_epilogue_ir import saturation as saturation_of

        block = 2 * self.tile_rows if self.tile_rows else self.packed.rows

        act = activation_bounds(epilogue.act, epilogue.act_high)
        post = activation_bounds(epilogue.postsum_act, epilogue.postsum_high)
        limits = (np.float32(epilogue.low), np.float32(epilogue.high))
        alone, summed = folded_bounds((act, post), limits), folded_bounds((post,), limits)
        # the bounds the rounded value meets (after the sum where there is a residual)
        saturation = saturation_of(*(summed if self.residual is not None else alone))
        # the grid the sum rows run over (`int8_epilogue_ir.WIDE_FIELDS`): the padded
        # image's on wide rows, else one row of every sum row, each its output position
        out_h, out_w = self.out.shape[2:]
        grid = (self.grid[0], out_w, self.grid[1], out_h) if self.grid is not None else (
            ONE_ROW, ONE_ROW, 1, 1)
        terms = np.array([out.ctypes.data, residual.ctypes.data, bias.ctypes.data,
                          scales.ctypes.data, filters, count, int(residual.dtype == np.int8),
                          stride, int(sums_fit_int32(self.packed.groups * 4, bias)), second,
                          rescale[0].ctypes.data, rescale[1].ctypes.data, saturation,
                          int(rows_first(self.packed, self.data.nbytes + self.out.nbytes,
                                         -(-count // block))), *grid],
                         np.int64)
        factors = np.array([*act, epilogue.residual_scale, *alone, *summed], np.float32)
        # the job keeps them alive
        return terms, factors, (bias, scales, residual, out, rescale, rescaled)

    def _direct_offsets(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        """The direct product's byte offsets in the channels-last copy: each K step's (64
        channels of one kernel tap) from a window's first pixel, and each tile's first
        pixel (tiles past the last position start at the first: read, never used)."""
        channels = self.data.shape[1] * self.stack  # a pixel's bytes in the copy
        padded_h, padded_w = self.padded_size
        out_w = self.out.shape[3]
        (kernel_w, stride_h, stride_w, dilate_h, dilate_w) = (
            self.geometry.kernel[1], *self.geometry.stride, *self.geometry.dilate)
        k = np.arange(0, self.packed.groups * 4, 64)
        if self.tap_rows:  # a K step a group of kernel rows: its taps' bytes run on
            steps = (k // 64 * self.stack * dilate_h * padded_w * channels).astype(np.int64)
        else:
            tap_y, tap_x = np.divmod(k // channels, kernel_w)
            steps = ((tap_y * dilate_h * padded_w + tap_x * dilate_w) * channels
                     + k % channels).astype(np.int64)
        tiles = -(-self.sum_rows // block) * (block // self.tile_rows)
        first = np.arange(tiles, dtype=np.int64) * self.tile_rows
        if self.grid is not None:  # wide rows: a sum row a pixel of the padded image
            starts = first * channels
        else:
            image, within = np.divmod(first, self.positions)
            y, x = np.divmod(within, out_w)
            starts = ((image * padded_h + y * stride_h) * padded_w + x * stride_w) * channels
        starts[first >= self.sum_rows] = 0
        return steps, starts.astype(np.int64)

    def _window_table(self, padded: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
        """`gemm_int8.table_job`'s tables for the channels-last copy ``padded``: each output
        position's window's first byte (its address; rows past the last, up to a whole row
        block, the copy's first), and each group of four K values' byte offset from there
        (K ordered kernel row, kernel column, channel, as `weight_matrix`)."""
        channels = self.data.shape[1]
        padded_h, padded_w = self.padded_size
        out_w = self.out.shape[3]
        kernel_w = self.geometry.kernel[1]
        (stride_h, stride_w), (dilate_h, dilate_w) = self.geometry.stride, self.geometry.dilate
        image, within = np.divmod(np.arange(self.rows, dtype=np.int64), self.positions)
        y, x = np.divmod(within, out_w)
        addresses = np.full(-(-self.rows // block) * block, padded.ctypes.data, np.int64)
        addresses[:self.rows] += ((image * padded_h + y * stride_h) * padded_w
                                  + x * stride_w) * channels
        k = np.arange(0, self.packed.groups * 4, 4, dtype=np.int64)
        if self.run:  # a kernel row's run, its bytes in order (past its end: zero weights)
            tap_y, within = np.divmod(k, self.run)
            return addresses, tap_y * dilate_h * padded_w * channels + within
        tap, channel = np.divmod(k, channels)
        tap_y, tap_x = np.divmod(tap, kernel_w)
        offsets = (tap_y * dilate_h * padded_w + tap_x * dilate_w) * channels + channel
        return addresses, offsets

    def _vector_requantize(self, epilogue: Epilogue, sums: np.ndarray, first: int,
                           count: int) -> Any:
        """`int8_requantize_ir`'s job for the sums of output positions [first, first +
        count), where it covers the layer (`vector_requantizes`), writing ``epilogue``'s
        second output too where it has one; else None."""
        if not self.vector_requantizes:
            return None
        filters = self.weight.shape[0]
        residual, rescaled = self.residual, epilogue.rescaled
        address = _requantize_vector.address(int8_requantize_ir.task_name(
            epilogue.low < 0, None if residual is None else residual.dtype == np.int8,
            rescaled is not None))
        if address is None:
            return None
        act_low, act_top = activation_bounds(epilogue.act, epilogue.act_high)
        post_low, post_top = activation_bounds(epilogue.postsum_act, epilogue.postsum_high)
        # one clamp before the rounding, as `_requantize` folds them
        low, high = max(post_low, np.float32(epilogue.low)), min(post_top, np.float32(
            epilogue.high))
        if residual is None:
            low, high = max(low, act_low), min(high, act_top)
            residual = np.zeros(1, np.int8)
        arrays = (sums, self.bias, self.scales, self.out, residual)
        second: tuple[np.ndarray, ...] = ()
        if rescaled is not None:
            _check_rescaled(rescaled, self.out)
            second = (rescaled.out, np.ascontiguousarray(rescaled.scale, np.float32),
                      np.ascontiguousarray(rescaled.shift, np.float32))
        context = np.array([array.ctypes.data for array in arrays] + [
            count, filters, sums.shape[1], first] + [
            int(np.float64(bound).view(np.int64)) for bound in (
                act_low, act_top, epilogue.residual_scale, low, high)]
            + [array.ctypes.data for array in second], np.int64)
        return spin_pool.job(address, context, kernel_jobs.parts_for(
            count, 3 * count * filters), keep=arrays + second)

    def _requantize_flags(self) -> int:
        flags = OUT_CHANNELS_LAST if self.laid.out else 0
        if not host_features.has("avx512dq") and sums_fit_int32(self.packed.groups * 4,
                                                                self.bias):
            flags |= INT32_SUMS
        if self.residual is not None:
            flags |= RESIDUAL | (RESIDUAL_CHANNELS_LAST if self.laid.residual else 0)
        return flags


def _check_rescaled(rescaled: Rescaled, out: np.ndarray) -> None:
    """Refuse a second output that does not fit the layer's output ``out``: uint8 of its
    shape, contiguous, with a scale and a shift a filter."""
    filters = out.shape[1]
    if rescaled.out.shape != out.shape or rescaled.out.dtype != np.uint8 or \
            not rescaled.out.flags.c_contiguous or rescaled.scale.shape != (filters,) or \
            rescaled.shift.shape != (filters,):
        raise ValueError(f"int8 convolution: second output {rescaled.out.dtype} "
                         f"{rescaled.out.shape} with {rescaled.scale.shape} scales "
                         f"does not fit the output {out.shape}")


# Bytes of patch rows and sums one chunk of a layer holds: with a panel of weights, well
# inside a core's L2 (2 MB here), so the GEMM reads the rows the gather just wrote, and the
# requantize pass the sums the GEMM just wrote, from cache rather than memory. A chained
# layer's shares (`FusedConv._window_chain`) hold at most `chunk_bytes` of sums: as much, or
# a `CHUNK_L2_SHARE` of a smaller L2 (128 KB of Zen 3's 512 KB), the share a 2 MB L2 gives.
CHUNK_BYTES, CHUNK_L2_SHARE = 2 ** 19, 4
# A chained layer's weights at most this share of a core's L2 (`chain_rows_first`): all of
# it (MobileNet v2's 320 → 1280 layer at 7², 410 KB, one thread as fast chained).
CHAIN_WEIGHT_L2_SHARE = 1


def chunk_bytes() -> int:
    """A chained layer's bytes of sums a share on this host: `CHUNK_BYTES`, or a
    `CHUNK_L2_SHARE` of the core's L2 where that is less."""
    l2 = cache_sizes.l2_bytes()
    return min(CHUNK_BYTES, l2 // CHUNK_L2_SHARE) if l2 else CHUNK_BYTES


def chunk_rows(rows: int, packed: gemm_int8.PackedWeights, block: int | None = None,
               gathers: bool = True) -> int:
    """Output positions per chunk: whole row blocks of the GEMM (``block`` rows, the
    packing's by default), at least one; the patch rows count where ``gathers``."""
    block = block or packed.rows
    columns = packed.panels * packed.vectors * gemm_int8.LANES
    per_row = (packed.groups * 4 if gathers else 0) + 4 * columns
    blocks = max(1, CHUNK_BYTES // (per_row * block))
    return min(rows, blocks * block)


def rows_first(packed: gemm_int8.PackedWeights, activation_bytes: int, row_blocks: int) -> bool:
    """Whether a direct product requantized in its epilogue shares out its ``row_blocks``
    rather than its panels among its parts. By rows, with two threads, each reads all the
    weights, but only the rows of the data its own part of the layer before wrote (the
    pool's caller takes parts from the front, its workers from the back), and writes the
    rows the next layer's same part reads; by panels, each reads half the weights, but every
    row of the data, and writes a share of every output row, so that about half of the
    layer's data and output (``activation_bytes``) pass from one core to the other, each
    line costing more than one read from L3. Rows first where the weights are small, or
    within `ROWS_FIRST_RATIO` times those activations and what stays in a core's L2 from
    block to block (ResNet-18's 3×3 layers at 28²: 144 KB of weights against 196 KB;
    ResNet-50 v2's 1×1 layers at 14²: 256 KB against 245 KB, not its 3×3 ones there, 576 KB
    against 98 KB), and with two row blocks a core at least, so that the cores' shares of
    whole blocks stay within a block of each other."""
    weight_bytes = packed.packed.nbytes
    small = weight_bytes <= ROWS_FIRST_BYTES or (
        weight_bytes <= ROWS_FIRST_MOST_BYTES
        and weight_bytes <= ROWS_FIRST_RATIO * activation_bytes)
    return small and row_blocks >= 2 * spin_pool.cores()


def chain_rows_first(packed: gemm_int8.PackedWeights, activation_bytes: int,
                     row_blocks: int) -> bool:
    """Whether a layer runs as a chain of shares of rows (`FusedConv._window_chain`):
    `rows_first`, or weights of at most `CHAIN_WEIGHT_L2_SHARE` of a core's L2 with two row
    blocks a core. Panel by panel such a layer is three jobs (the copy, the product, the
    requantize pass) and the cores meet at the end of each; as a chain they meet once, each
    core reading all the weights (MobileNet v2's 1×1 layers at 7², 150–410 KB) where it
    read half."""
    l2 = cache_sizes.l2_bytes() or CHUNK_BYTES
    return rows_first(packed, activation_bytes, row_blocks) or (
        packed.packed.nbytes <= l2 // CHAIN_WEIGHT_L2_SHARE
        and row_blocks >= 2 * spin_pool.cores())


def activation_bounds(kind: str | None, high: float) -> tuple[np.float32, np.float32]:
    """An activation as the clamp `_requantize` takes: relu from 0, clipped relu from 0 to
    ``high``, none between infinities."""
    infinite = np.float32(np.inf)
    if kind == "relu":
        return np.float32(0.0), infinite
    if kind == "bounded_relu":
        return np.float32(0.0), np.float32(high)
    return -infinite, infinite


def folded_bounds(clamps: tuple[tuple[np.float32, np.float32], ...],
                  limits: tuple[np.float32, np.float32]) -> tuple[np.float32, np.float32]:
    """``(low, high)`` such that ``clamp(rint(x), low, high)`` is, for every real ``x``,
    ``x`` through ``clamps`` in turn, rounded half to even, then saturated to ``limits``:
    clamps, and rounding (never decreasing), compose into one clamp, whose bounds are where
    the chain takes the two infinities. The fused epilogue then clamps once, not three
    times, the same bytes."""
    ends = []
    for value in (np.float32(-np.inf), np.float32(np.inf)):
        for low, high in clamps:
            value = min(max(value, low), high)
        ends.append(min(max(np.rint(value), limits[0]), limits[1]))
    return np.float32(ends[0]), np.float32(ends[1])


def sums_fit_int32(depth: int, bias: np.ndarray) -> bool:
    """Whether every sum of ``depth`` products of a uint8 or int8 by an int8 (at most 255 ·
    128 each), plus its int32 ``bias``, stays inside int32: the requantize may then add them
    in int32, where otherwise it widens to int64 first."""
    largest = depth * 255 * 128 + int(np.abs(bias.astype(np.int64)).max(initial=0))
    return largest <= np.iinfo(np.int32).max


def weight_matrix(weight: np.ndarray) -> np.ndarray:
    """The weights (F, C, kh, kw) as the GEMM's (K, F) matrix, K ordered (kh, kw, C) as the
    gathered rows are (what the caller packs, `gemm_int8.PackedWeights`)."""
    return np.moveaxis(weight, 1, -1).reshape(len(weight), -1).T


def run_bytes(channels: int, geometry: Geometry) -> int | None:
    """The bytes each kernel row's run takes in `run_matrix`'s weights: its ``kernel_w ·
    C`` rounded up to whole groups of four, where that is not whole already (a stem's 7 × 3
    channels: 21 → 24) and the run lies in one piece (no dilation across it); else None."""
    run = geometry.kernel[1] * channels
    return -(-run // 4) * 4 if run % 4 and geometry.dilate[1] == 1 else None


def run_matrix(weight: np.ndarray, run: int) -> np.ndarray:
    """The weights (F, C, kh, kw) as a (kh · ``run``, F) matrix: kernel row ky's taps at K
    ``ky · run + kx · C + c``, zero past ``kw · C`` in each run, so that each run of a
    window's row reads as whole groups of four bytes (the bytes past its end, the next
    pixel's, meet zeros)."""
    filters, channels, kernel_h, kernel_w = weight.shape
    matrix = np.zeros((kernel_h, run, filters), np.int8)
    matrix[:, :kernel_w * channels] = np.moveaxis(weight, 0, -1).transpose(1, 2, 0, 3).reshape(
        kernel_h, kernel_w * channels, filters)
    return matrix.reshape(kernel_h * run, filters)


def has_tap_rows(channels: int, geometry: Geometry, out_width: int) -> bool:
    """Whether a layer's kernel rows are runs of under 64 bytes in a channels-last image (a
    stem's 7 × 3 channels: 21) and its output rows take the direct product's tiles
    (`gemm_int8.direct_tile_rows`): the direct product then reads each kernel row as one
    step of K, its 64 bytes the row's taps and whatever follows (times zero weights), with
    weights from `tap_rows_matrix`; not for whole 64-channel blocks (the plain layout)."""
    run = geometry.kernel[1] * channels
    return (channels % 64 != 0 and run < 64 and geometry.dilate[1] == 1
            and gemm_int8.direct_tile_rows(out_width) > 0)


def stacked_rows(channels: int, geometry: Geometry, out_width: int) -> int:
    """How many kernel rows one step of the direct product's K takes for a layer of rows
    of taps (`has_tap_rows`): as many as fit their taps' bytes in 64 where a copy holding
    that many padded rows a pixel (`int8_stack_ir`) lays them side by side, each pixel's
    channels for each row in turn (a stem's 7 × 3 channels: 3 rows of 21 bytes, 63, so 3
    steps for 7 kernel rows in place of 7); 1 where the layer has no rows of taps."""
    if not has_tap_rows(channels, geometry, out_width):
        return 1
    stack = min(geometry.kernel[0], 64 // (geometry.kernel[1] * channels))
    return stack if stack > 1 and stack_task(channels, stack) is not None else 1


def stack_task(channels: int, stack: int) -> int | None:
    """The address of `int8_stack_ir`'s task stacking ``stack`` rows of ``channels`` a
    pixel, compiled on first ask; None where it cannot run here."""
    from engine.kernels import int8_stack_ir

    made = _stack_modules.get((channels, stack))
    if made is None:
        made = _stack_modules.setdefault((channels, stack), llvm_jit.HostModule(
            lambda: int8_stack_ir.module(((channels, stack),)), "avx512vbmi"))
    return made.address(int8_stack_ir.task_name(channels, stack))


# `int8_stack_ir`'s modules, one a (channels, stack), compiled on first use
_stack_modules: dict[tuple[int, int], Any] = {}


def tap_rows_matrix(weight: np.ndarray, stack: int = 1) -> np.ndarray:
    """The weights (F, C, kh, kw) as a (64 · ⌈kh / stack⌉, F) matrix: kernel row ky = g ·
    stack + r's taps at K ``64 · g + kx · stack · C + r · C + c`` (the bytes of a copy
    holding ``stack`` rows a pixel, `stacked_rows`), zero in the rest of each 64 and for
    rows past the kernel's (`has_tap_rows`)."""
    filters, channels, kernel_h, kernel_w = weight.shape
    groups = -(-kernel_h // stack)
    taps = np.zeros((groups * stack, kernel_w, channels, filters), np.int8)
    taps[:kernel_h] = np.moveaxis(weight, 0, -1).transpose(1, 2, 0, 3)  # (kh, kw, C, F)
    run = kernel_w * stack * channels
    matrix = np.zeros((groups, 64, filters), np.int8)
    matrix[:, :run] = taps.reshape(groups, stack, kernel_w, channels, filters).transpose(
        0, 2, 1, 3, 4).reshape(groups, run, filters)
    return matrix.reshape(groups * 64, filters)


def _requantize_vector_module() -> Any:
    return int8_requantize_ir.module()


# `int8_requantize_ir`, compiled once where the host has AVX2
_requantize_vector = llvm_jit.HostModule(_requantize_vector_module, "avx2")


def compiled_kernels() -> dict[str, Any]:
    """The kernels by name (`kernel_jobs` runs them as jobs), compiled on first use."""
    return compiled.compiled_once(_kernels, _compile)


def _compile() -> dict[str, Any]:
    # compiled first, inlined: both copies call it
    globals()["_fill_border"] = compiled.compile_kernel(_fill_border, inline="always")
    return {
        "channels_last": compiled.compile_kernel(_channels_last),
        "padded_copy": compiled.compile_kernel(_padded_copy),
        "gather": compiled.compile_kernel(_gather),
        "requantize": compiled.compile_kernel(_requantize, error_model="numpy"),
    }


def _channels_last(data: Any, shift: int, channels: int, height: int, width: int,
                   pad_h: int, pad_w: int, padded: Any, padded_h: int, padded_w: int,
                   first: int, last: int) -> None:  # pragma: no cover - runs compiled
    """Padded rows [first, last) (image by image) of ``padded`` (N, padded_h, padded_w, C)
    from ``data`` (N, C, H, W) as bytes, each xor ``shift`` (128 moves int8 onto uint8); the
    border holds ``shift`` (a zero)."""
    fill = np.uint8(shift)
    fill_word = np.uint64(shift) * np.uint64(0x0101010101010101)
    depth = np.uint64(channels)
    plane = np.uint64(height * width)
    for row in range(first, last):
        image = row // padded_h
        y = row - image * padded_h - pad_h
        base = np.uint64(row * padded_w) * depth
        if _fill_border(padded, base, y, height, pad_w, width, padded_w, depth, fill):
            continue
        # unsigned offsets (no negative-index checks); each channel's row read in order
        start = base + np.uint64(pad_w) * depth
        source = np.uint64((image * channels * height + y) * width)
        if channels % 8 == 0:  # 8 channels' bytes of a pixel as one word: 2.5× the bytes
            words, stride = padded.view(np.uint64), depth // np.uint64(8)
            for block in range(stride):
                line = source + block * np.uint64(8) * plane
                at = start // np.uint64(8) + block
                for x in range(np.uint64(width)):
                    word = np.uint64(0)
                    for k in range(8):
                        word |= np.uint64(data[line + np.uint64(k) * plane + x]) << np.uint64(
                            8 * k)
                    words[at + x * stride] = word ^ fill_word
            continue
        for c in range(depth):
            line = source + c * plane
            for x in range(np.uint64(width)):
                padded[start + x * depth + c] = data[line + x] ^ fill


def _fill_border(padded: Any, base: Any, y: int, height: int, pad_w: int, width: int,
                 padded_w: int, depth: Any,
                 fill: Any) -> bool:  # pragma: no cover - runs compiled
    """The border bytes of the padded row at ``base`` (image row ``y``) set to ``fill``: the
    whole row where ``y`` lies outside the image (then True: nothing of it left to copy),
    else its left and right margins."""
    end = base + np.uint64(padded_w) * depth
    if y < 0 or y >= height:
        for at in range(base, end):
            padded[at] = fill
        return True
    for at in range(base, base + np.uint64(pad_w) * depth):
        padded[at] = fill
    for at in range(base + np.uint64(pad_w + width) * depth, end):
        padded[at] = fill
    return False


def _padded_copy(data: Any, shift: int, channels: int, height: int, width: int,
                 pad_h: int, pad_w: int, padded: Any, padded_h: int, padded_w: int,
                 first: int, last: int) -> None:  # pragma: no cover - runs compiled
    """`_channels_last` for ``data`` laid channels-last already (N, H, W, C): each image row
    one run of ``width · C`` bytes, copied in order (it vectorises)."""
    fill = np.uint8(shift)
    depth = np.uint64(channels)
    run = np.uint64(width) * depth
    for row in range(first, last):
        image = row // padded_h
        y = row - image * padded_h - pad_h
        base = np.uint64(row * padded_w) * depth
        if _fill_border(padded, base, y, height, pad_w, width, padded_w, depth, fill):
            continue
        start = base + np.uint64(pad_w) * depth
        source = np.uint64(image * height + y) * run
        for at in range(run):
            padded[start + at] = data[source + at] ^ fill


def _gather(padded: Any, channels: int, padded_h: int, padded_w: int, out_h: int,
            out_w: int, kernel_h: int, kernel_w: int, stride_h: int, stride_w: int,
            dilate_h: int, dilate_w: int, offset: int, rows: Any, first: int,
            last: int) -> None:  # pragma: no cover - runs compiled
    """Rows [first, last) of ``rows``: the patches of output positions ``offset + row``
    (image by image, row by row), each position (n, y, x)'s window, K ordered (kernel row,
    kernel column, channel) as runs of ``channels`` bytes of ``padded``. K's padding past
    the window is left as it is: the packed weights are zero there."""
    positions = out_h * out_w
    width = np.uint64(channels)
    run = np.uint64(kernel_w) * width
    flat_rows = rows.reshape(rows.size)
    for row in range(first, last):
        at = offset + row
        image = at // positions
        y = (at - image * positions) // out_w
        x = at - image * positions - y * out_w
        # unsigned offsets: numba then skips its negative-index check, and the byte loop
        # compiles to vector copies (0.15 ms against 2.1 for a 3136 × 576 layer)
        into = np.uint64(row) * np.uint64(rows.shape[1])
        for ky in range(kernel_h):
            line = (image * padded_h + y * stride_h + ky * dilate_h) * padded_w
            if dilate_w == 1:  # the window's row is one run of kernel_w · C bytes
                source = np.uint64(line + x * stride_w) * width
                for c in range(run):
                    flat_rows[into + c] = padded[source + c]
                into += run
                continue
            for kx in range(kernel_w):
                source = np.uint64(line + x * stride_w + kx * dilate_w) * width
                for c in range(width):
                    flat_rows[into + c] = padded[source + c]
                into += width


def _requantize(sums: Any, bias: Any, scales: Any, act: int, act_high: Any, residual: Any,
                flags: int, residual_scale: Any, postsum_act: int, postsum_high: Any,
                low: int, high: int, out: Any, filters: int, positions: int, offset: int,
                first: int, last: int) -> None:  # pragma: no cover - runs compiled
    """Rows [first, last) of ``sums``, output positions ``offset + row`` (image by image),
    into ``out`` (N, F, positions flat; or N, positions, F under ``OUT_CHANNELS_LAST``), as
    `Epilogue` describes; ``flags``: `RESIDUAL` and its layout, the output's, and
    `INT32_SUMS`.

    Up to TILE positions of one image at a time: an NCHW residual's bytes laid position by
    position (F bytes each) into ``summands``, then every sum's arithmetic in the sums'
    own order into ``codes`` (the output bytes, position by position), then ``codes`` laid
    filter by filter into an NCHW ``out``. The arithmetic reads and writes consecutive values
    and branches on nothing that changes inside the loop (the activations are clamps between
    bounds, infinite where there is none), so it vectorises; only the byte copies to and from
    NCHW change the order, and channels-last arrays need none."""
    has_residual = flags & RESIDUAL != 0
    residual_laid = flags & RESIDUAL_CHANNELS_LAST != 0
    out_laid = flags & OUT_CHANNELS_LAST != 0
    int32_sums = flags & INT32_SUMS != 0
    zero, infinite = np.float32(0.0), np.float32(np.inf)
    act_low = zero if act != 0 else -infinite
    act_top = act_high if act == 2 else infinite
    post_low = zero if postsum_act != 0 else -infinite
    post_top = postsum_high if postsum_act == 2 else infinite
    lowest, highest = np.float32(low), np.float32(high)
    depth, plane = np.uint64(filters), np.uint64(positions)
    # Without a residual the activations and the saturation are one clamp before the
    # rounding: their ranges overlap (each holds 0 or reaches below it, and tops above 0),
    # and rounding to an integer bound commutes with clamping to it. One clamp, not three,
    # takes a channels-last layer's loop from 44 to 26 µs (96 filters, 1,300 rows in cache).
    bottom, top = max(act_low, post_low, lowest), min(act_top, post_top, highest)
    if out_laid and not has_residual:
        for row in range(first, last):
            laid = np.uint64(offset + row) * depth
            if int32_sums:
                for f in range(depth):
                    value = np.float32(np.int32(sums[row, f] + bias[f])) * scales[f]
                    out[laid + f] = np.uint8(np.int32(np.rint(min(max(value, bottom), top)))
                                             & 255)
                continue
            for f in range(depth):
                value = np.float32(np.int64(sums[row, f]) + np.int64(bias[f])) * scales[f]
                out[laid + f] = np.uint8(np.int32(np.rint(min(max(value, bottom), top))) & 255)
        return
    if out_laid and residual_laid:
        # Both channels-last: each row's filters in one straight loop, the sums' width chosen
        # once outside it. The activation after the sum and the saturation are one clamp, as
        # above (rounding to the integer saturation bounds commutes with clamping to them):
        # 0.082 → 0.057 ms for 64 filters at 56², 0.30 → 0.22 ms for 256 (one thread, Zen 3).
        post_bottom, post_top = max(post_low, lowest), min(post_top, highest)
        for row in range(first, last):
            laid = np.uint64(offset + row) * depth
            if int32_sums:
                for f in range(depth):
                    value = np.float32(np.int32(sums[row, f] + bias[f])) * scales[f]
                    value = min(max(value, act_low), act_top) + residual_scale * np.float32(
                        residual[laid + f])
                    value = np.rint(min(max(value, post_bottom), post_top))
                    out[laid + f] = np.uint8(np.int32(value) & 255)
                continue
            for f in range(depth):
                value = np.float32(np.int64(sums[row, f]) + np.int64(bias[f])) * scales[f]
                value = min(max(value, act_low), act_top) + residual_scale * np.float32(
                    residual[laid + f])
                value = np.rint(min(max(value, post_bottom), post_top))
                out[laid + f] = np.uint8(np.int32(value) & 255)
        return
    size = max(16, min(TILE, TILE_BYTES // filters))
    codes = np.empty(1 if out_laid else filters * size, np.uint8)
    summands = np.empty(filters * size if has_residual and not residual_laid else 1,
                        residual.dtype)
    row = first
    while row < last:
        image = (offset + row) // positions
        start = offset + row - image * positions
        count = np.uint64(min(positions - start, last - row, size))
        base = np.uint64((image * filters) * positions + start)  # (image, 0, start) in NCHW
        laid = np.uint64(offset + row) * depth  # (image, start, 0) channels-last
        if has_residual and not residual_laid:  # each filter's run of positions in order
            for f in range(depth):
                at = base + f * plane
                for i in range(count):
                    summands[i * depth + f] = residual[at + i]
        for i in range(count):
            line = np.uint64(row) + i
            for f in range(depth):
                if int32_sums:
                    value = np.float32(np.int32(sums[line, f] + bias[f])) * scales[f]
                else:
                    value = np.float32(np.int64(sums[line, f]) + np.int64(bias[f])) * scales[f]
                if has_residual:
                    value = min(max(value, act_low), act_top)
                    summand = residual[laid + i * depth + f] if residual_laid else summands[
                        i * depth + f]
                    value = value + residual_scale * np.float32(summand)
                    value = min(max(value, post_low), post_top)
                    value = min(max(np.rint(value), lowest), highest)
                else:
                    value = np.rint(min(max(value, bottom), top))
                # the low byte: an int8 result stored into uint8 wraps, as NumPy's astype
                code = np.uint8(np.int32(value) & 255)
                if out_laid:
                    out[laid + i * depth + f] = code
                else:
                    codes[i * depth + f] = code
        if not out_laid:
            for f in range(depth):  # each filter's run of positions written in order
                at = base + f * plane
                for i in range(count):
                    out[at + i] = codes[i * depth + f]
        row += count
