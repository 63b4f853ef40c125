"""The LLVM IR of `conv_amx`'s direct convolution on AVX-512 BF16 with its filters in the
vector lanes: register tiles of `PIXELS` output pixels by `FILTER_VECTORS` vectors of 16
filters, over the same zero-bordered grid of bf16 words `conv_bf16_ir` reads.

`conv_bf16_ir`'s tiles put 32 grid columns in their lanes, and a grid row is the output row
and its padding: at 14² (16 grid columns a row) they compute 224 columns for 196 pixels, at 7²
64 for 49, and drop the rest. Here the lanes hold filters, and each step broadcasts one grid
word per pixel: a tile computes the pixels it names and no other. Its pixels are `SEGMENTS`
runs of `SEGMENT` pixels, each within one output row (`conv_amx.by_pixels` takes rows a
whole number of runs long), so a run's grid words lie side by side and each broadcast is an
address plus a constant. Per tap and channel pair a tile loads its filters' weight words (a
vector a 16 filters; the weights packed ``[filter block][tap][channel pair][filter]``,
`conv_amx.weight_rows` with `FILTERS`) and, for each pixel, the grid word the tap puts under
it, broadcast, with one ``vdpbf16ps`` per pixel and vector. A pixel's grid column is ``y·Wp
+ x`` for output pixel ``y·W + x``, as in `conv_bf16_ir`, whose sums these are bit for bit
(K in the same order), so stride, dilation and padding are the grid's (`conv_amx._Grid`).
A plane's last tile runs one run where only one is left (7²: three tiles of two runs and
one of one).

A tile computes no tap of a pixel whose input lies in the padding, as OpenVINO's
convolutions do (`run_taps_ir`: the context's ``tap_bounds``, each tap's K loop built for
every choice of its runs' pixels): the products left out are those of the grid's zero
border, so the sums are the same bit for bit. A 3×3 layer of stride 1 reads the padding at
18% of its taps at 7², 9% at 14², 5% at 28² (ResNet-18 in bf16 at batch 1 on one Zen 4 core,
each layer's best: 1.03–1.04 → 0.88–0.89 ms at 7², 1.03–1.06 → 0.95–0.98 at 14², 1.04–1.11
→ 1.01–1.07 at 28²).

The epilogue lays each run's sums by filter (`run_rows`: 7 pixels' vectors of 16 filters into
8 vectors of two filters' runs), adds each filter's bias, then the residual (read from the
two filters' planes by two masked loads), clamps, and stores each half vector as a run of its
filter's plane; filters past the last are masked off. Each pixel's 16 filters scattered to
their planes, and the residual gathered likewise, made ResNet-18's 3×3 layers from 28² down
3–6% slower in bf16 at batch 1 on one Zen 4 core, and 3–9% at batch 8 (`bench/variants.py`,
docs/benchmarks.md): there a 16-lane scatter or gather takes about 30 cycles.

``pixels_grid_part`` and ``pixels_words_part`` store the output in bf16 for its readers, as
`conv_bf16_ir`'s ``grid_part`` and ``words_part`` do: each pixel's 32 filters' values (the
float32 epilogue's, no residual) rounded and paired into 16 words, filters ``2q`` and
``2q + 1`` into word ``q``, each run's words laid by word row as the float32 epilogue lays
its sums, and stored to word row ``q`` from the run's first pixel's grid column
(``grid_shift`` on) or from the pixel itself.

``pixels_part(context, part, parts)`` is a `spin_pool` task over every (filter block, image,
pixel tile), filter blocks outside, so that a block's weights stay in L2 while every pixel of
each image meets them. The K loop asks for the next block's weights too, into L2, each of
the block's tiles its share of them at its share of the pace, so that a layer's weights
stream from memory while every tile computes, not while a block's first tile alone does
(ResNet-18's 512-channel 3×3 layers at 7², 4.7 MB of weights each, in bf16 in the plan's
walk on one Zen 5 core: 0.74 ms asking for none, 0.64–0.68 each tile asking for all of the
next block, 0.50–0.52 each its share; OpenVINO bf16: 0.53–0.55). ``context`` is
`conv_amx`'s (its `_FIELD` names the words).
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels import run_taps_ir
from engine.kernels.conv_bf16_ir import GRID, OUTPUT, WORDS_OUT, clamped, pair_rows
from engine.kernels.gemm_bf16_ir import DOT_PRODUCT, BFloatType
from engine.kernels.task_ir import (
    BlockTiles,
    as_float,
    fields,
    loop,
    masked_load,
    masked_store,
    splat,
)
from engine.kernels.task_ir import task as define_task

F32, I1, I32, I64 = ir.FloatType(), ir.IntType(1), ir.IntType(32), ir.IntType(64)
LANES = 16
# A tile's pixels: `SEGMENTS` runs of `SEGMENT` pixels of one output row each (a plane's
# width a multiple of `SEGMENT`: `by_pixels`), so that a run's grid words lie side by side
# from one address; and its 16-filter vectors. 28 accumulators, two weight vectors a step
# and a broadcast grid word: 31 of the 32 vector registers.
SEGMENT, SEGMENTS, FILTER_VECTORS = run_taps_ir.SEGMENT, 2, 2
PIXELS = SEGMENT * SEGMENTS
# Half a vector's lanes: a run's pixels in either half of a vector `run_rows` lays.
HALF = LANES // 2
FILTERS = FILTER_VECTORS * LANES
# How far ahead of its step the K loop asks for the weights, in words (64 steps).
AHEAD_WORDS = 64 * FILTERS
# The task for each store (`conv_bf16_ir.PARTS`'s).
PARTS = {OUTPUT: "pixels_part", GRID: "pixels_grid_part", WORDS_OUT: "pixels_words_part"}


def run_rows(builder: ir.IRBuilder, vectors: list[Any]) -> list[Any]:
    """A run's vectors of 16 lanes (one a pixel, at most `HALF` of them) laid by lane, an
    8 × 16 transpose: `HALF` vectors, vector ``i`` holding lane ``2i``'s values in its low
    half and lane ``2i + 1``'s in its high half, pixel ``p`` at place ``p`` of each (places
    past the run's pixels zero), so that each half is one row's run, stored by one masked
    store. Four rounds of eight two-vector shuffles, each round gathering twice as many
    pixels of a lane side by side."""
    zero = ir.Constant(vectors[0].type, None)
    x = list(vectors) + [zero] * (HALF - len(vectors))

    def shuffle(first: Any, second: Any, lanes: list[int]) -> Any:
        return builder.shuffle_vector(first, second, ir.Constant(ir.VectorType(I32, LANES),
                                                                 lanes))

    # pairs of pixels: a[k][h] holds lanes 2t + h of pixels 2k and 2k + 1, t by t
    a = [[shuffle(x[2 * k], x[2 * k + 1], [s * LANES + 2 * t + h for t in range(HALF)
                                           for s in range(2)]) for h in range(2)]
         for k in range(HALF // 2)]
    # fours: b[m][h][g] holds lanes 2(4g + t) + h of pixels 4m to 4m + 3, t by t
    b = [[[shuffle(a[2 * m][h], a[2 * m + 1][h], [u // 2 * LANES + 8 * g + 2 * t + u % 2
                                                  for t in range(4) for u in range(4)])
           for g in range(2)] for h in range(2)] for m in range(2)]
    # eights: c[h][g][pair] holds lanes 2(4g + 2·pair + w) + h of every pixel, w by w
    c = [[[shuffle(b[0][h][g], b[1][h][g], [m * LANES + 8 * pair + 4 * w + u
                                            for w in range(2) for m in range(2)
                                            for u in range(4)])
           for pair in range(2)] for g in range(2)] for h in range(2)]
    # rows: i = 4g + 2·pair + w takes lane 2i (h 0) and lane 2i + 1 (h 1)
    return [shuffle(c[0][i // 4][i // 2 % 2], c[1][i // 4][i // 2 % 2],
                    [h * LANES + 8 * (i % 2) + p for h in range(2) for p in range(HALF)])
            for i in range(HALF)]


def add_to(module: ir.Module, field: dict[str, int]) -> None:
    """``pixels_part`` and its like (`PARTS`) defined in ``module``, over a context laid out
    as ``field`` names it."""
    PixelBf16Kernel(module, field)


class PixelBf16Kernel:
    """For each store, its tiles of two runs and of one (a tile's sums and epilogue) and its
    task (`PARTS`)."""

    def __init__(self, module: ir.Module, field: dict[str, int]) -> None:
        self.module = module
        self.vector = ir.VectorType(F32, LANES)
        self.zero = ir.Constant(self.vector, [0.0] * LANES)
        self.pairs = ir.VectorType(BFloatType(), 2 * LANES)
        self.mask = ir.VectorType(I1, LANES)
        self.indices = ir.VectorType(I64, LANES)
        self.dot = module.globals.get(DOT_PRODUCT) or ir.Function(module, ir.FunctionType(
            self.vector, [self.vector, self.pairs, self.pairs]), name=DOT_PRODUCT)
        self.prefetch = module.globals.get("llvm.prefetch.p0") or ir.Function(
            module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), I32, I32, I32]),
            name="llvm.prefetch.p0")
        self.masked_load = module.globals.get("llvm.masked.load.v16f32.p0") or masked_load(
            module, self.vector, "f32")
        self.masked_store = module.globals.get("llvm.masked.store.v16f32.p0") or masked_store(
            module, self.vector, "f32")
        self.words = ir.VectorType(I32, LANES)
        self.store_words = module.globals.get("llvm.masked.store.v16i32.p0") or masked_store(
            module, self.words, "i32")
        self.halves = ir.VectorType(BFloatType(), LANES)
        for store, name in PARTS.items():
            # a tile of `SEGMENTS` runs, and one of a run: a plane's last, where one run is
            # left (7² planes: three tiles of two and one of one, no pixel computed twice)
            self._define_part(field, name, {count: self._define_tile(count, store)
                                            for count in (SEGMENTS, 1)})

    def _define_tile(self, segments: int, store: str) -> ir.Function:
        """``<store>_pixel_tile<segments>(a, b, ldb, words, taps, offsets, c, ldc, bias,
        filters, residual, low, high, grid_width, width, first, block_words, share, pace,
        word_row, bounds)``: the tile of ``segments`` runs of output pixels ``first`` on (of
        ``ldc`` an image) of the image whose grid starts at ``b`` (a plane every ``ldb`` words), its
        filter block's packed weights at ``a`` (``block_words`` of them), the block's first
        filter's plane of the output at ``c`` and of the residual at ``residual`` (null:
        none), its bias at ``bias``; ``filters`` of the block's filters are real. It asks
        for the next block's weights from ``share`` words into it on, a line a step, each
        ``pace`` halving the pace. Storing words (``store`` not the output), ``c`` is the
        block's first word row, ``word_row`` words a row, and no residual is added. At each
        tap it computes the pixels reading inside the input by ``bounds`` (`run_taps_ir`'s
        table; null: every pixel)."""
        pointer, wide = F32.as_pointer(), I64.as_pointer()
        kind = ir.FunctionType(ir.VoidType(), [pointer, pointer, I64, I64, I64, wide, pointer,
                                               I64, pointer, I64, pointer, F32, F32, I64, I64,
                                               I64, I64, I64, I64, I64, wide])
        function = ir.Function(self.module, kind, name=f"{store}_pixel_tile{segments}")
        function.linkage = "internal"
        (a, b, ldb, words, taps, offsets, c, ldc, bias, filters, residual, low, high,
         grid_width, width, first, block_words, share, pace, _, bounds) = function.args
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        pixels, columns, run_starts = [], [], []
        for k in range(segments):
            # a run past the image's last pixel reads the first run's words (and stores
            # nothing)
            start = builder.add(first, I64(k * SEGMENT))
            start = builder.select(builder.icmp_signed("<", start, ldc), start, first)
            row = builder.sdiv(start, width)
            across = builder.sub(start, builder.mul(row, width))
            columns.append(builder.add(builder.mul(row, grid_width), across))
            run_starts.append((row, across))
            pixels += [builder.add(start, I64(j)) for j in range(SEGMENT)]
        # the sums live in a stack array that LLVM's passes promote to registers
        sums = builder.alloca(ir.ArrayType(self.vector, len(pixels) * FILTER_VECTORS))
        cells = [builder.gep(sums, [I32(0), I32(index)])
                 for index in range(len(pixels) * FILTER_VECTORS)]
        for cell in cells:
            builder.store(self.zero, cell)
        if store == OUTPUT:
            self._ask_residual(builder, function, residual, ldc, pixels[::SEGMENT])
        with loop(builder, function, I64(0), taps, "tap") as tap:
            tap_offset = builder.load(builder.gep(offsets, [tap]))
            b_tap = [builder.gep(b, [builder.add(column, tap_offset)]) for column in columns]
            a_tap = builder.gep(a, [builder.mul(builder.mul(tap, words), I64(FILTERS))])
            run_taps_ir.each_variant(
                builder, function, run_taps_ir.variant(builder, bounds, tap, run_starts),
                segments, lambda computed: self._k_steps(
                    builder, function, (a, a_tap, b_tap, ldb, words, block_words, share, pace,
                                        tap), computed, cells))
        totals = [builder.load(cell) for cell in cells]
        if store == OUTPUT:
            self._epilogue(builder, function, totals, pixels)
        else:
            places = pixels if store == WORDS_OUT else [
                builder.add(columns[j // SEGMENT], I64(j % SEGMENT)) for j in range(len(pixels))]
            self._pairs_epilogue(builder, function, totals, places)
        builder.ret_void()
        return function

    def _k_steps(self, builder: ir.IRBuilder, function: ir.Function, operands: tuple[Any, ...],
                 pixels: list[int], cells: list[Any]) -> None:
        """One tap's steps of K, over its channel pairs, for the tile's ``pixels`` (by their
        place in it): the filters' weight vectors and each pixel's grid word broadcast, one
        ``vdpbf16ps`` a pixel and vector."""
        a, a_tap, b_tap, ldb, words, block_words, share, pace, tap = operands
        with loop(builder, function, I64(0), words, "pair") as pair:
            a_step = builder.gep(a_tap, [builder.mul(pair, I64(FILTERS))])
            # the weights' line `AHEAD_WORDS` on: a read (0), kept in every level (3), of
            # data (1); past the block's end it touches nothing (a prefetch never faults)
            builder.call(self.prefetch, [builder.bitcast(builder.gep(
                a_step, [I64(AHEAD_WORDS)]), ir.IntType(8).as_pointer()), I32(0), I32(3),
                I32(1)])
            # and, into L2 (2), a line of this tile's share of the next block's weights
            # (`_define_part`), as far into it as the step is into this block, paced
            step = builder.add(builder.mul(builder.mul(tap, words), I64(FILTERS)),
                               builder.mul(pair, I64(FILTERS)))
            ahead = builder.add(builder.add(block_words, share), builder.lshr(step, pace))
            builder.call(self.prefetch, [builder.bitcast(builder.gep(
                a, [ahead]), ir.IntType(8).as_pointer()), I32(0), I32(2), I32(1)])
            weights = [builder.bitcast(builder.load(builder.bitcast(
                builder.gep(a_step, [I64(v * LANES)]), self.vector.as_pointer()), align=4),
                self.pairs) for v in range(FILTER_VECTORS)]
            plane = builder.mul(pair, ldb)
            runs = [builder.gep(run, [plane]) for run in b_tap]
            for j in pixels:
                word = builder.bitcast(splat(builder, builder.load(builder.gep(
                    runs[j // SEGMENT], [I64(j % SEGMENT)]), align=4), self.vector),
                    self.pairs)
                for v in range(FILTER_VECTORS):
                    cell = cells[j * FILTER_VECTORS + v]
                    builder.store(builder.call(self.dot, [builder.load(cell), weights[v],
                                                          word]), cell)

    def _ask_residual(self, builder: ir.IRBuilder, function: ir.Function, residual: Any,
                      ldc: Any, runs: list[Any]) -> None:
        """The residual's lines the tile's epilogue gathers (each run's `SEGMENT` pixels in
        each of the block's filter planes), asked for as the tile starts, so that they arrive
        while its K loop runs (`conv_bf16_ir.DirectBf16Kernel._ask_residual`: ResNet-18's
        blocks' second 3×3 at batch 8)."""
        with builder.if_then(builder.icmp_unsigned("!=", builder.ptrtoint(residual, I64),
                                                   I64(0))):
            # past the real filters: a prefetch never faults
            with loop(builder, function, I64(0), I64(FILTERS), "ask") as plane:
                line = builder.gep(residual, [builder.mul(plane, ldc)])
                for start in runs:
                    for pixel in (0, SEGMENT - 1):
                        # a read (0), kept in every level (3), of data (1)
                        builder.call(self.prefetch, [builder.bitcast(builder.gep(
                            line, [builder.add(start, I64(pixel))]),
                            ir.IntType(8).as_pointer()), I32(0), I32(3), I32(1)])

    def _pairs_epilogue(self, builder: ir.IRBuilder, function: ir.Function,
                        totals: list[Any], places: list[Any]) -> None:
        """Each real pixel's sums plus the filters' bias, clamped (`_store_runs` with no
        residual), rounded to bf16 (``fptrunc``: to nearest even, as the pairing pass
        rounds) and paired, filters ``2q`` and ``2q + 1`` into word ``q``; each run's words
        laid by word row (`run_rows`) and stored to word row ``q`` from ``c`` at the run's
        first pixel's word ``places[j]`` on."""
        c, ldc, bias, filters, low, high, first, word_row = (
            function.args[index] for index in (6, 7, 8, 9, 11, 12, 15, 19))
        low, high = splat(builder, low, self.vector), splat(builder, high, self.vector)
        shifts = self._biases(builder, bias, filters)
        concatenated = ir.Constant(ir.VectorType(I32, 2 * LANES), list(range(2 * LANES)))
        words = builder.bitcast(c, I32.as_pointer())
        for run in range(len(places) // SEGMENT):
            inside = builder.icmp_signed("<", builder.add(first, I64(run * SEGMENT)), ldc)
            with builder.if_then(inside):
                paired = []
                for j in range(run * SEGMENT, (run + 1) * SEGMENT):
                    halves = [builder.fptrunc(clamped(builder, builder.fadd(
                        totals[j * FILTER_VECTORS + v], shifts[v]), low, high), self.halves)
                        for v in range(FILTER_VECTORS)]
                    paired.append(builder.bitcast(builder.shuffle_vector(*halves, concatenated),
                                                  self.words))
                for i, row in enumerate(run_rows(builder, paired)):
                    # word rows 2i and 2i + 1: those of an even count of real filters
                    real = [builder.icmp_signed("<", I64(4 * i + 2 * half), filters)
                            for half in range(2)]
                    self._store_row_pair(builder, self.store_words, row, words, word_row,
                                         2 * i, places[run * SEGMENT], real)

    def _epilogue(self, builder: ir.IRBuilder, function: ir.Function, totals: list[Any],
                  pixels: list[Any]) -> None:
        """Each real pixel's sums plus the filters' bias, plus the residual where there is
        one (one loop with a residual, one without, chosen once a tile), clamped, stored to
        the filters' planes run by run (`_store_runs`)."""
        c, ldc, bias, filters, residual, low, high, first = (
            function.args[index] for index in (6, 7, 8, 9, 10, 11, 12, 15))
        bounds = (splat(builder, low, self.vector), splat(builder, high, self.vector))
        shifts = self._biases(builder, bias, filters)
        has_residual = builder.icmp_unsigned("!=", builder.ptrtoint(residual, I64), I64(0))
        with builder.if_else(has_residual) as (summed, alone):
            with summed:
                self._store_runs(builder, totals, pixels, (first, ldc, filters), shifts,
                                 bounds, (c, residual))
            with alone:
                self._store_runs(builder, totals, pixels, (first, ldc, filters), shifts,
                                 bounds, (c, None))

    def _store_runs(self, builder: ir.IRBuilder, totals: list[Any], pixels: list[Any],
                    span: tuple[Any, Any, Any], shifts: list[Any], bounds: tuple[Any, Any],
                    targets: tuple[Any, Any]) -> None:
        """`_epilogue`'s stores, with or without the residual (``targets``: C and the
        residual or None): each run's sums laid by filter (`run_rows`), then, two filters a
        vector, the bias added, the residual read from those filters' planes and added,
        clamped and stored there. The same values, added in the same order, as a pixel's
        vector of filters would take."""
        (first, ldc, filters), (low, high), (c, residual) = span, bounds, targets
        for run in range(len(pixels) // SEGMENT):
            inside = builder.icmp_signed("<", builder.add(first, I64(run * SEGMENT)), ldc)
            with builder.if_then(inside):
                start = pixels[run * SEGMENT]
                for v in range(FILTER_VECTORS):
                    rows = run_rows(builder, [totals[j * FILTER_VECTORS + v] for j in range(
                        run * SEGMENT, (run + 1) * SEGMENT)])
                    for i, row in enumerate(rows):
                        filter_ = v * LANES + 2 * i
                        real = [builder.icmp_signed("<", I64(filter_ + half), filters)
                                for half in range(2)]
                        value = builder.fadd(row, builder.shuffle_vector(
                            shifts[v], shifts[v], ir.Constant(ir.VectorType(I32, LANES), [
                                2 * i + half for half in range(2) for _ in range(HALF)])))
                        if residual is not None:
                            value = builder.fadd(value, self._load_row_pair(
                                builder, residual, ldc, filter_, start, real))
                        self._store_row_pair(builder, self.masked_store,
                                             clamped(builder, value, low, high), c, ldc,
                                             filter_, start, real)

    def _row_masks(self, builder: ir.IRBuilder, real: list[Any]) -> list[Any]:
        """The lanes of a vector `run_rows` lays holding a run's pixels of its two rows:
        the low half's first `SEGMENT` where the first row is ``real``, the high half's
        where the second is."""
        masks = []
        for half, is_real in enumerate(real):
            lanes = ir.Constant(self.mask, [half * HALF <= lane < half * HALF + SEGMENT
                                            for lane in range(LANES)])
            masks.append(builder.select(is_real, lanes, ir.Constant(self.mask, [0] * LANES)))
        return masks

    def _row_pair_addresses(self, builder: ir.IRBuilder, base: Any, row_length: Any,
                            row: int, start: Any) -> list[Any]:
        """Where the vector of rows ``row`` and ``row + 1`` goes, from ``base`` (rows
        ``row_length`` apart, the run from ``start`` on): its low half at the first row's
        run, its high half (`HALF` lanes on) at the second's."""
        addresses = []
        for half in range(2):
            at = builder.add(builder.mul(I64(row + half), row_length),
                             builder.sub(start, I64(half * HALF)))
            addresses.append(builder.gep(base, [at]))
        return addresses

    def _load_row_pair(self, builder: ir.IRBuilder, base: Any, row_length: Any, row: int,
                       start: Any, real: list[Any]) -> Any:
        """Rows ``row`` and ``row + 1``'s runs from ``start`` read into one vector, as
        `run_rows` lays them (the lanes past the runs zero)."""
        value = self.zero
        for address, mask in zip(self._row_pair_addresses(builder, base, row_length, row,
                                                          start),
                                 self._row_masks(builder, real), strict=True):
            value = builder.call(self.masked_load, [
                builder.bitcast(address, self.vector.as_pointer()), I32(4), mask, value])
        return value

    def _store_row_pair(self, builder: ir.IRBuilder, store: Any, value: Any, base: Any,
                        row_length: Any, row: int, start: Any, real: list[Any]) -> None:
        """A vector `run_rows` laid stored to rows ``row`` and ``row + 1`` of ``base`` (their
        runs from ``start`` on, only the ``real`` rows) through ``store`` (a masked store of
        the vector's type)."""
        for address, mask in zip(self._row_pair_addresses(builder, base, row_length, row,
                                                          start),
                                 self._row_masks(builder, real), strict=True):
            builder.call(store, [value, builder.bitcast(address, value.type.as_pointer()),
                                 I32(4), mask])

    def _biases(self, builder: ir.IRBuilder, bias: Any, filters: Any) -> list[Any]:
        """For each vector of the block's filters, their biases (zero past the real ones)."""
        lane = ir.Constant(self.indices, list(range(LANES)))
        shifts = []
        for v in range(FILTER_VECTORS):
            index = builder.add(lane, splat(builder, I64(v * LANES), self.indices))
            mask = builder.icmp_signed("<", index, splat(builder, filters, self.indices))
            shifts.append(builder.call(self.masked_load, [builder.bitcast(
                builder.gep(bias, [I64(v * LANES)]), self.vector.as_pointer()), I32(4), mask,
                self.zero]))
        return shifts

    def _define_part(self, positions: dict[str, int], name: str,
                     tiles: dict[int, ir.Function]) -> None:
        """``name(context, part, parts)``: part ``part``'s run of ``tiles`` (by their runs),
        filter blocks outside the images and their pixel tiles; into the output, or into the
        words at ``grid`` (``grid_ldb`` a row, ``grid_shift`` on)."""
        function, builder, context, part, parts = define_task(self.module, name)
        field = fields(builder, context, positions)
        pointer = F32.as_pointer()

        def address(name: str, offset_bytes: Any) -> Any:
            return builder.inttoptr(builder.add(field[name], offset_bytes), pointer)

        low, high = (as_float(builder, field[name]) for name in ("low", "high"))
        m, ldc, words, taps = field["m"], field["ldc"], field["words"], field["taps"]
        blocks = builder.sdiv(builder.add(m, I64(FILTERS - 1)), I64(FILTERS))
        share = BlockTiles(builder, blocks, field["batch"],
                           builder.sdiv(builder.add(ldc, I64(PIXELS - 1)), I64(PIXELS)),
                           part, parts)
        offsets = builder.inttoptr(field["offsets"], I64.as_pointer())
        block_words = builder.mul(builder.mul(taps, words), I64(FILTERS))
        block_bytes = builder.mul(block_words, I64(4))
        # A block's tiles share the asking for the next block's weights: the block's tiles
        # (``tiles.per_block``, rounded up to 2^pace) each ask for a 2^-pace share of them, one
        # line a step at a 2^-pace rate, so that they stream from memory through every tile
        # of the block, not at the pace of its first tile's steps.
        ctlz = self.module.globals.get("llvm.ctlz.i64") or ir.Function(
            self.module, ir.FunctionType(I64, [I64, I1]), name="llvm.ctlz.i64")
        pace = builder.sub(I64(64), builder.call(ctlz, [builder.sub(share.per_block, I64(1)),
                                                         ir.Constant(I1, 0)]))
        with share.each(function) as (block, within, image, tile):
            pixel = builder.mul(tile, I64(PIXELS))
            first_filter = builder.mul(block, I64(FILTERS))
            filter_bytes = builder.mul(first_filter, builder.mul(ldc, I64(4)))
            output_bytes = builder.add(builder.mul(image, field["c_batch"]), filter_bytes)
            residual = builder.select(
                builder.icmp_unsigned("!=", field["residual"], I64(0)),
                address("residual", output_bytes), ir.Constant(pointer, None))
            c = address("c", output_bytes)
            if name != PARTS[OUTPUT]:  # the block's first word row, the shift on
                c = pair_rows(builder, field, first_filter)
            arguments = [
                address("a", builder.mul(block, block_bytes)),
                address("b", builder.mul(image, field["b_batch"])), field["ldb"], words,
                taps, offsets, c, ldc,
                address("rows_bias", builder.mul(first_filter, I64(4))),
                builder.sub(m, first_filter), residual, low, high, field["grid_width"],
                field["width"], pixel, block_words,
                builder.mul(within, builder.lshr(block_words, pace)), pace, field["grid_ldb"],
                builder.inttoptr(field["tap_bounds"], I64.as_pointer())]
            whole = builder.icmp_signed(">", builder.sub(ldc, pixel), I64(SEGMENT))
            with builder.if_else(whole) as (runs, run):
                with runs:
                    builder.call(tiles[SEGMENTS], arguments)
                with run:
                    builder.call(tiles[1], arguments)
        builder.ret_void()
