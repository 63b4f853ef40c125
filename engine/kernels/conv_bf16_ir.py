"""The LLVM IR of `conv_amx`'s direct convolution on AVX-512 BF16 (no AMX): register tiles of
``vdpbf16ps`` over the same zero-bordered grid of bf16 words.

The input is paired once into planes of words (channel pairs) over its zero-bordered grid
(`conv_amx`: ``Wp`` words a grid row, a plane per channel pair). A tile is `ROWS` filters by
`VECTORS` vectors of 16 grid columns: per tap and channel pair, it loads its columns' words
from the plane shifted by the tap's offset (no patch array exists) and each filter's weight
word, broadcast, and adds the pairs' products into float32 sums with one ``vdpbf16ps`` per
filter and vector. The weights are packed as ``[filter block][tap][channel pair][filter]``
words (`weight_rows`), so a step reads one run of `ROWS` words.

Grid column ``n = y·Wp + x`` is output pixel ``y·W + x`` where ``x < W``; columns past the
output's width are computed and dropped. The epilogue packs each vector's kept lanes together
(``vcompressps``, `grid_lanes_ir`): their pixels lie one after another in the output. It
adds the filter's bias, then the residual (read through a mask of as many leading lanes),
clamps, and stores through that mask: `gemm_ir`'s terms in its order, so a residual block's
add and its ReLU cost no pass of their own.

``grid_part`` and ``words_part`` are ``part`` writing its output in bf16 for its readers
(`bf16_handoff`), as AMX's do (`conv_amx_ir`): each pair of filters' values, the float32
epilogue's (bias, then the clamp; no residual), rounded to bf16 as the pairing pass rounds
them and paired into one row of words; ``grid_part`` stores the grid columns' words where a
direct reader's zero-bordered grid has them (the same grid width, ``grid_shift`` on, the
dropped columns masked off: they fall on its border), ``words_part`` the kept lanes packed
where the output's pixels lie (a 1×1 reader's words). The context's ``grid`` and
``grid_ldb`` say where; one image, an even number of filters.

``part(context, part, parts)`` is a `spin_pool` task over every (filter block, image, column
tile), filter blocks outside, so that a block's weights stay in cache while they meet each
image's columns; ``context`` is `conv_amx`'s (its `_FIELD` names the words).
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.gemm_bf16_ir import DOT_PRODUCT, BFloatType
from engine.kernels.grid_lanes_ir import GridLanes
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
# Filters and 16-column vectors of a tile: 16 accumulators, two loads of grid words for
# eight broadcast weights a step, and 32 grid columns, `conv_amx.TILE`, whose grid extent
# and parts it shares.
ROWS, VECTORS = 8, 2
TILE_COLUMNS = VECTORS * LANES
# How far ahead of its step the K loop asks for the weights, in words (64 steps): a layer's
# weights come from memory in a plan's walk (ResNet-18's 512-channel layer at 7², 4.7 MB, one
# Zen 5 core: 0.92 ms without, 0.66 with).
AHEAD_WORDS = 64 * ROWS
# Whether a tile storing float32 asks for its output's lines (for writing) as it starts, as
# it asks for the residual's. ResNet-18 bf16 on one Zen 4 core (`bench/variants.py`, three
# runs): its blocks' second 3×3 at 56² (residual added, float32 stored) 0.92-0.97× at batch 1;
# at batch 8 0.93-1.02×, within the runs' scatter. (A constant so that a benchmark can turn it
# off.)
ASKS_OUTPUT = True
# Where a product stores its output: as float32, as a reader's grid of pairs, as a 1×1
# reader's words; and the task of each.
OUTPUT, GRID, WORDS_OUT = "output", "grid", "words"
PARTS = {OUTPUT: "part", GRID: "grid_part", WORDS_OUT: "words_part"}


def module(field: dict[str, int]) -> ir.Module:
    """The module holding ``part``, ``grid_part`` and ``words_part`` over a context laid out
    as ``field`` names it (`conv_bf16_pixels_ir.add_to` adds its tasks to it)."""
    return DirectBf16Kernel(field).module


class DirectBf16Kernel:
    """The module: a tile (one tile's sums and epilogue) and the task for each store
    (`PARTS`)."""

    def __init__(self, field: dict[str, int]) -> None:
        self.module = ir.Module(name="hybridserve_conv_bf16_direct")
        self.vector = ir.VectorType(F32, LANES)
        self.zero = ir.Constant(self.vector, [0.0] * LANES)
        self.pairs = ir.VectorType(BFloatType(), 2 * LANES)
        self.mask = ir.VectorType(I1, LANES)
        self.dot = ir.Function(self.module, ir.FunctionType(
            self.vector, [self.vector, self.pairs, self.pairs]), name=DOT_PRODUCT)
        self.compress = ir.Function(self.module, ir.FunctionType(
            self.vector, [self.vector, self.vector, self.mask]),
            name=f"llvm.x86.avx512.mask.compress.v{LANES}f32")
        self.grid_lanes = GridLanes(self.module)
        self.prefetch = ir.Function(self.module, ir.FunctionType(
            ir.VoidType(), [ir.IntType(8).as_pointer(), I32, I32, I32]), name="llvm.prefetch.p0")
        self.masked_load = masked_load(self.module, self.vector, "f32")
        self.masked_store = masked_store(self.module, self.vector, "f32")
        self.words = ir.VectorType(I32, LANES)
        self.store_words = masked_store(self.module, self.words, "i32")
        self.halves = ir.VectorType(BFloatType(), LANES)
        for store, name in PARTS.items():
            self._define_part(field, name, self._define_tile(store))

    def _define_tile(self, store: str) -> ir.Function:
        """``tile(a, b, column, ldb, words, taps, offsets, c, ldc, bias, rows, residual, low,
        high, grid_width, width, n)``: the tile from grid column ``column`` of the image
        whose grid starts at ``b`` (a plane every ``ldb`` words), its filter block's packed
        weights at ``a``, its first filter's output row at ``c`` (``ldc`` floats a filter),
        bias at ``bias`` and residual at ``residual`` (null: none); ``rows`` of its filters
        are real. Storing the ``store`` of `PARTS` other than the output, ``c`` is its first
        pair of filters' row of words (``ldc`` words a row) and no residual is added."""
        pointer, wide = F32.as_pointer(), I64.as_pointer()
        kind = ir.FunctionType(ir.VoidType(), [pointer, pointer, I64, I64, I64, I64, wide,
                                               pointer, I64, pointer, I64, pointer, F32, F32,
                                               I64, I64, I64])
        function = ir.Function(self.module, kind, name=f"{store}_tile")
        function.linkage = "internal"
        (a, b, column, ldb, words, taps, offsets, c, ldc, bias, rows, residual, low, high,
         grid_width, width, n) = function.args
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        # the sums live in a stack array that LLVM's passes promote to registers
        sums = builder.alloca(ir.ArrayType(self.vector, ROWS * VECTORS))
        cells = [builder.gep(sums, [I32(0), I32(index)]) for index in range(ROWS * VECTORS)]
        for cell in cells:
            builder.store(self.zero, cell)
        if store == OUTPUT:
            self._ask_residual(builder, function)
            if ASKS_OUTPUT:
                self._ask_lines(builder, function, function.args[7], 1)
        b_column = builder.gep(b, [column])
        with loop(builder, function, I64(0), taps, "tap") as tap:
            b_tap = builder.gep(b_column, [builder.load(builder.gep(offsets, [tap]))])
            a_tap = builder.gep(a, [builder.mul(builder.mul(tap, words), I64(ROWS))])
            with loop(builder, function, I64(0), words, "pair") as pair:
                b_row = builder.gep(b_tap, [builder.mul(pair, ldb)])
                grid_words = [builder.bitcast(builder.load(builder.bitcast(
                    builder.gep(b_row, [I64(j * LANES)]), self.vector.as_pointer()), align=4),
                    self.pairs) for j in range(VECTORS)]
                a_step = builder.gep(a_tap, [builder.mul(pair, I64(ROWS))])
                # the weights' line `AHEAD_WORDS` on: a read (0), kept in every level (3), of
                # data (1); past the block's end it touches nothing (a prefetch never faults)
                builder.call(self.prefetch, [builder.bitcast(builder.gep(
                    a_step, [I64(AHEAD_WORDS)]), ir.IntType(8).as_pointer()), I32(0), I32(3),
                    I32(1)])
                for i in range(ROWS):
                    weight = builder.bitcast(splat(builder, builder.load(
                        builder.gep(a_step, [I64(i)])), self.vector), self.pairs)
                    for j in range(VECTORS):
                        cell = cells[i * VECTORS + j]
                        builder.store(builder.call(self.dot, [builder.load(cell), weight,
                                                              grid_words[j]]), cell)
        sums = [builder.load(cell) for cell in cells]
        if store == OUTPUT:
            self._epilogue(builder, function, sums)
        else:
            self._pairs_epilogue(builder, function, sums, store == WORDS_OUT)
        builder.ret_void()
        return function

    def _ask_residual(self, builder: ir.IRBuilder, function: ir.Function) -> None:
        """The residual's lines the tile's epilogue reads, asked for as the tile starts, so
        that they arrive while its K loop runs. Read only in the epilogue, they came from
        memory or a busy L3 there, tile after tile: ResNet-18 at batch 8, where each image's
        residual was last touched several images before, took 0.63 ms an image for a
        block's second 3×3 at 56² in the plan's walk against the first's 0.57 (warm, both
        0.56)."""
        residual = function.args[11]
        with builder.if_then(builder.icmp_unsigned("!=", builder.ptrtoint(residual, I64),
                                                   I64(0))):
            self._ask_lines(builder, function, residual, 0)

    def _ask_lines(self, builder: ir.IRBuilder, function: ir.Function, base: Any,
                   write: int) -> None:
        """The lines from ``base`` (laid as C: ``ldc`` floats a filter, the tile's pixels
        packed) that the epilogue reads (``write`` 0) or writes (1), asked for now: a
        prefetch, kept in every level (3), of data (1)."""
        column, ldc, grid_width, width = (function.args[index] for index in (2, 8, 14, 15))
        for j in range(VECTORS):
            pixel = self.grid_lanes.pixels_before(
                builder, builder.add(column, I64(j * LANES)), grid_width, width)
            for i in range(ROWS):  # past the real filters: a prefetch never faults
                first = builder.gep(base, [builder.add(builder.mul(I64(i), ldc), pixel)])
                for floats in (0, LANES - 1):
                    builder.call(self.prefetch, [builder.bitcast(
                        builder.gep(first, [I64(floats)]), ir.IntType(8).as_pointer()),
                        I32(write), I32(3), I32(1)])

    def _epilogue(self, builder: ir.IRBuilder, function: ir.Function, sums: list[Any]) -> None:
        """The tile's sums into C: each vector's kept lanes packed from its first pixel on,
        plus the bias, plus the residual where there is one, clamped, for each real filter
        (one loop with a residual, one without, chosen once a tile)."""
        residual, low, high = (function.args[index] for index in (11, 12, 13))
        low, high = splat(builder, low, self.vector), splat(builder, high, self.vector)
        placed = self._placed(builder, function, True)
        has_residual = builder.icmp_unsigned("!=", builder.ptrtoint(residual, I64), I64(0))
        with builder.if_else(has_residual) as (summed, alone):
            with summed:
                self._store_rows(builder, function, sums, placed, (low, high), True)
            with alone:
                self._store_rows(builder, function, sums, placed, (low, high), False)

    def _placed(self, builder: ir.IRBuilder, function: ir.Function,
                packed: bool) -> list[tuple[Any, Any, Any]]:
        """For each vector of the tile's grid columns: which lanes are pixels, as many
        leading lanes, and where the vector's values go: its first pixel where they go
        ``packed`` together, else its first grid column."""
        column, grid_width, width, n = (function.args[index] for index in (2, 14, 15, 16))
        placed = []
        for j in range(VECTORS):
            start = builder.add(column, I64(j * LANES))
            kept = self.grid_lanes.kept(builder, start, grid_width, width, n)
            placed.append((kept, self.grid_lanes.leading(builder, kept),
                           self.grid_lanes.pixels_before(builder, start, grid_width, width)
                           if packed else start))
        return placed

    def _store_rows(self, builder: ir.IRBuilder, function: ir.Function, sums: list[Any],
                    placed: list[tuple[Any, Any, Any]], bounds: tuple[Any, Any],
                    with_residual: bool) -> None:
        """Each real filter's row of the tile stored (`_epilogue`)."""
        c, ldc, bias, rows, residual = (function.args[index] for index in (7, 8, 9, 10, 11))
        low, high = bounds
        for i in range(ROWS):
            with builder.if_then(builder.icmp_signed("<", I64(i), rows)):
                row_shift = splat(builder, builder.load(builder.gep(bias, [I64(i)])),
                                  self.vector)
                line = builder.mul(I64(i), ldc)
                for j, (kept, leading, pixel) in enumerate(placed):
                    at = builder.add(line, pixel)
                    value = builder.call(self.compress, [sums[i * VECTORS + j], self.zero, kept])
                    value = builder.fadd(value, row_shift)
                    if with_residual:
                        value = builder.fadd(value, builder.call(self.masked_load, [
                            builder.bitcast(builder.gep(residual, [at]),
                                            self.vector.as_pointer()),
                            I32(4), leading, self.zero]))
                    target = builder.bitcast(builder.gep(c, [at]), self.vector.as_pointer())
                    builder.call(self.masked_store, [clamped(builder, value, low, high),
                                                     target, I32(4), leading])

    def _pairs_epilogue(self, builder: ir.IRBuilder, function: ir.Function, sums: list[Any],
                        words_out: bool) -> None:
        """The tile's sums as bf16 words, filters ``2p`` and ``2p + 1`` (the even one's half
        low) into word row ``p`` from ``c``: each value the float32 epilogue's (`_store_rows`
        with no residual), rounded to nearest even (``fptrunc``, the pairing pass's
        rounding). The grid's words go at the tile's grid columns through the kept lanes'
        mask; the words' (``words_out``) packed where the output's pixels lie."""
        c, ldc, bias, rows, low, high = (function.args[index] for index in (7, 8, 9, 10, 12, 13))
        low, high = splat(builder, low, self.vector), splat(builder, high, self.vector)
        words = builder.bitcast(c, I32.as_pointer())
        order = ir.Constant(ir.VectorType(I32, 2 * LANES),
                            [lane for index in range(LANES) for lane in (index, index + LANES)])
        placed = self._placed(builder, function, words_out)
        for pair in range(ROWS // 2):
            with builder.if_then(builder.icmp_signed("<", I64(2 * pair), rows)):
                shifts = [splat(builder, builder.load(builder.gep(bias, [I64(row)])),
                                self.vector) for row in (2 * pair, 2 * pair + 1)]
                line = builder.gep(words, [builder.mul(I64(pair), ldc)])
                for j, (kept, leading, at) in enumerate(placed):
                    halves = [builder.fptrunc(clamped(builder, builder.fadd(
                        sums[row * VECTORS + j], shift), low, high), self.halves)
                        for row, shift in zip((2 * pair, 2 * pair + 1), shifts, strict=True)]
                    paired = builder.bitcast(builder.shuffle_vector(*halves, order),
                                             self.words)
                    target = builder.gep(line, [at])
                    if words_out:  # the kept lanes packed, from their first pixel on
                        packed = builder.call(self.compress, [
                            builder.bitcast(paired, self.vector), self.zero, kept])
                        builder.call(self.masked_store, [packed, builder.bitcast(
                            target, self.vector.as_pointer()), I32(4), leading])
                    else:
                        builder.call(self.store_words, [paired, builder.bitcast(
                            target, self.words.as_pointer()), I32(4), kept])

    def _define_part(self, positions: dict[str, int], name: str, run: ir.Function) -> None:
        """``name(context, part, parts)``: part ``part``'s run of ``run``'s tiles, filter blocks
        outside the images and their column tiles; into the output, or (``grid_part``,
        ``words_part``) into the words at ``grid``, ``grid_ldb`` a row, ``grid_shift`` on."""
        function, builder, context, part, parts = define_task(self.module, name)
        field = fields(builder, context, positions)
        pointer = F32.as_pointer()

        def address(name: str, offset_bytes: Any) -> Any:
            return builder.inttoptr(builder.add(field[name], offset_bytes), pointer)

        low, high = (as_float(builder, field[name]) for name in ("low", "high"))
        m, n, words, taps = field["m"], field["n"], field["words"], field["taps"]
        blocks = builder.sdiv(builder.add(m, I64(ROWS - 1)), I64(ROWS))
        columns = builder.sdiv(builder.add(n, I64(TILE_COLUMNS - 1)), I64(TILE_COLUMNS))
        tiles = BlockTiles(builder, blocks, field["batch"], columns, part, parts)
        offsets = builder.inttoptr(field["offsets"], I64.as_pointer())
        block_words = builder.mul(builder.mul(taps, words), I64(ROWS * 4))
        with tiles.each(function) as (block, _, image, tile):
            column = builder.mul(tile, I64(TILE_COLUMNS))
            filter_bytes = builder.mul(builder.mul(block, I64(ROWS)),
                                       builder.mul(field["ldc"], I64(4)))
            output_bytes = builder.add(builder.mul(image, field["c_batch"]), filter_bytes)
            residual = builder.select(
                builder.icmp_unsigned("!=", field["residual"], I64(0)),
                address("residual", output_bytes), ir.Constant(pointer, None))
            first_filter = builder.mul(block, I64(ROWS))
            rows = builder.sub(m, first_filter)
            rows = builder.select(builder.icmp_signed("<", rows, I64(ROWS)), rows, I64(ROWS))
            c, ldc = address("c", output_bytes), field["ldc"]
            if name != PARTS[OUTPUT]:  # the block's first pair row of words, the shift on
                c, ldc = pair_rows(builder, field, first_filter), field["grid_ldb"]
            builder.call(run, [
                address("a", builder.mul(block, block_words)),
                address("b", builder.mul(image, field["b_batch"])), column, field["ldb"],
                words, taps, offsets, c, ldc,
                address("rows_bias", builder.mul(first_filter, I64(4))), rows, residual,
                low, high, field["grid_width"], field["width"], n])
        builder.ret_void()


def pair_rows(builder: ir.IRBuilder, field: dict[str, Any], first_filter: Any) -> Any:
    """Where filter ``first_filter`` (even) and the next one's words start: their word row
    of the reader's words at ``grid`` (``grid_ldb`` words a row), ``grid_shift`` words on."""
    row = builder.mul(builder.sdiv(first_filter, I64(2)), field["grid_ldb"])
    words = builder.add(row, field["grid_shift"])
    return builder.inttoptr(builder.add(field["grid"], builder.mul(words, I64(4))),
                            F32.as_pointer())


def clamped(builder: ir.IRBuilder, value: Any, low: Any, high: Any) -> Any:
    """``value`` clamped to [low, high] as ``np.clip`` clamps: NaN stays NaN."""
    value = builder.select(builder.fcmp_ordered("<", value, low), low, value)
    return builder.select(builder.fcmp_ordered(">", value, high), high, value)
