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

The epilogue adds each filter's bias, then the residual (read as the output lies, by a
gather), clamps, and scatters each vector's 16 filters into their planes of the output at the
pixel's place; lanes past the last filter, and pixels past the last, are masked off.

``pixels_grid_part`` and ``pixels_words_part`` store the output in bf16 for its readers, as
`conv_bf16_ir`'s ``grid_part`` and ``words_part`` do: each pixel's 32 filters' values (the
float32 epilogue's, no residual) rounded and paired into 16 words, filters ``2q`` and
``2q + 1`` into word row ``q``, scattered at the pixel's grid column (``grid_shift`` on) or
at the pixel itself.

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
from engine.kernels.task_ir import BlockTiles, as_float, fields, loop, masked_load, splat
from engine.kernels.task_ir import task as define_task

F32, I1, I32, I64 = ir.FloatType(), ir.IntType(1), ir.IntType(32), ir.IntType(64)
LANES = 16
# A tile's pixels: `SEGMENTS` runs of `SEGMENT` pixels of one output row each (a plane's
# width a multiple of `SEGMENT`: `by_pixels`), so that a run's grid words lie side by side
# from one address; and its 16-filter vectors. 28 accumulators, two weight vectors a step
# and a broadcast grid word: 31 of the 32 vector registers.
SEGMENT, SEGMENTS, FILTER_VECTORS = run_taps_ir.SEGMENT, 2, 2
PIXELS = SEGMENT * SEGMENTS
FILTERS = FILTER_VECTORS * LANES
# How far ahead of its step the K loop asks for the weights, in words (64 steps).
AHEAD_WORDS = 64 * FILTERS
# The task for each store (`conv_bf16_ir.PARTS`'s).
PARTS = {OUTPUT: "pixels_part", GRID: "pixels_grid_part", WORDS_OUT: "pixels_words_part"}


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
        self.pointers = ir.VectorType(F32.as_pointer(), LANES)
        self.dot = module.globals.get(DOT_PRODUCT) or ir.Function(module, ir.FunctionType(
            self.vector, [self.vector, self.pairs, self.pairs]), name=DOT_PRODUCT)
        self.prefetch = module.globals.get("llvm.prefetch.p0") or ir.Function(
            module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), I32, I32, I32]),
            name="llvm.prefetch.p0")
        self.masked_load = module.globals.get("llvm.masked.load.v16f32.p0") or masked_load(
            module, self.vector, "f32")
        self.gather = ir.Function(module, ir.FunctionType(
            self.vector, [self.pointers, I32, self.mask, self.vector]),
            name=f"llvm.masked.gather.v{LANES}f32.v{LANES}p0")
        self.scatter = ir.Function(module, ir.FunctionType(
            ir.VoidType(), [self.vector, self.pointers, I32, self.mask]),
            name=f"llvm.masked.scatter.v{LANES}f32.v{LANES}p0")
        self.words = ir.VectorType(I32, LANES)
        self.scatter_words = ir.Function(module, ir.FunctionType(
            ir.VoidType(), [self.words, self.pointers, I32, self.mask]),
            name=f"llvm.masked.scatter.v{LANES}i32.v{LANES}p0")
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
        """Each real pixel's sums plus the filters' bias, clamped (`_store_pixels` with no
        residual), rounded to bf16 (``fptrunc``: to nearest even, as the pairing pass
        rounds) and paired, filters ``2q`` and ``2q + 1`` into word ``q``, scattered to word
        row ``q`` from ``c`` at word ``places[j]`` of pixel ``j``."""
        c, ldc, bias, filters, low, high, first, word_row = (
            function.args[index] for index in (6, 7, 8, 9, 11, 12, 15, 19))
        low, high = splat(builder, low, self.vector), splat(builder, high, self.vector)
        _, _, shifts = self._filter_lanes(builder, bias, filters)
        lane = ir.Constant(self.indices, list(range(LANES)))
        # word q holds filters 2q and 2q + 1: those of an even count of real filters
        pairs = builder.icmp_signed("<", builder.mul(lane, splat(builder, I64(2),
                                                                  self.indices)),
                                    splat(builder, filters, self.indices))
        rows = builder.mul(lane, splat(builder, builder.mul(word_row, I64(4)), self.indices))
        concatenated = ir.Constant(ir.VectorType(I32, 2 * LANES), list(range(2 * LANES)))
        for j, place in enumerate(places):
            inside = builder.icmp_signed("<", builder.add(first, I64(j)), ldc)
            with builder.if_then(inside):
                halves = [builder.fptrunc(clamped(builder, builder.fadd(
                    totals[j * FILTER_VECTORS + v], shifts[v]), low, high), self.halves)
                    for v in range(FILTER_VECTORS)]
                paired = builder.bitcast(builder.shuffle_vector(*halves, concatenated),
                                         self.words)
                builder.call(self.scatter_words, [paired, self._addresses(
                    builder, c, builder.mul(place, I64(4)), rows), I32(4), pairs])

    def _epilogue(self, builder: ir.IRBuilder, function: ir.Function, totals: list[Any],
                  pixels: list[Any]) -> None:
        """Each real pixel's sums plus the filters' bias, plus the residual where there is
        one (one loop with a residual, one without, chosen once a tile), clamped, scattered
        to the filters' planes."""
        c, ldc, bias, filters, residual, low, high, first = (
            function.args[index] for index in (6, 7, 8, 9, 10, 11, 12, 15))
        low, high = splat(builder, low, self.vector), splat(builder, high, self.vector)
        indices, masks, shifts = self._filter_lanes(builder, bias, filters)
        # each lane's filter plane, in bytes from the block's first
        planes = [builder.mul(index, splat(builder, builder.mul(ldc, I64(4)), self.indices))
                  for index in indices]
        has_residual = builder.icmp_unsigned("!=", builder.ptrtoint(residual, I64), I64(0))
        with builder.if_else(has_residual) as (summed, alone):
            with summed:
                self._store_pixels(builder, totals, pixels, (first, ldc), (masks, shifts,
                                   planes), (low, high), (c, residual))
            with alone:
                self._store_pixels(builder, totals, pixels, (first, ldc), (masks, shifts,
                                   planes), (low, high), (c, None))

    def _store_pixels(self, builder: ir.IRBuilder, totals: list[Any], pixels: list[Any],
                      span: tuple[Any, Any], lanes: tuple[list[Any], list[Any], list[Any]],
                      bounds: tuple[Any, Any], targets: tuple[Any, Any]) -> None:
        """`_epilogue`'s stores, with or without the residual (``targets``: C and the
        residual or None)."""
        (first, ldc), (masks, shifts, planes), (low, high), (c, residual) = (
            span, lanes, bounds, targets)
        for j in range(len(pixels)):
            inside = builder.icmp_signed("<", builder.add(first, I64(j)), ldc)
            with builder.if_then(inside):
                at = builder.mul(pixels[j], I64(4))
                for v in range(FILTER_VECTORS):
                    value = builder.fadd(totals[j * FILTER_VECTORS + v], shifts[v])
                    if residual is not None:
                        value = builder.fadd(value, builder.call(self.gather, [
                            self._addresses(builder, residual, at, planes[v]), I32(4),
                            masks[v], self.zero]))
                    builder.call(self.scatter, [clamped(builder, value, low, high),
                                                self._addresses(builder, c, at, planes[v]),
                                                I32(4), masks[v]])

    def _filter_lanes(self, builder: ir.IRBuilder, bias: Any,
                      filters: Any) -> tuple[list[Any], list[Any], list[Any]]:
        """For each vector of the block's filters: each lane's filter, whether it is real
        (one of ``filters``), and its bias (zero past them)."""
        lane = ir.Constant(self.indices, list(range(LANES)))
        indices, masks, shifts = [], [], []
        for v in range(FILTER_VECTORS):
            index = builder.add(lane, splat(builder, I64(v * LANES), self.indices))
            mask = builder.icmp_signed("<", index, splat(builder, filters, self.indices))
            indices.append(index)
            masks.append(mask)
            shifts.append(builder.call(self.masked_load, [builder.bitcast(
                builder.gep(bias, [I64(v * LANES)]), self.vector.as_pointer()), I32(4), mask,
                self.zero]))
        return indices, masks, shifts

    def _addresses(self, builder: ir.IRBuilder, base: Any, at: Any, planes: Any) -> Any:
        """Each lane's address: ``base`` plus ``at`` bytes plus its filter plane's."""
        start = builder.add(builder.ptrtoint(base, I64), at)
        return builder.inttoptr(builder.add(splat(builder, start, self.indices), planes),
                                self.pointers)

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
