"""The LLVM IR of `conv_amx`'s direct convolution: AMX tiles over a zero-bordered bf16 grid.

The input is paired once into planes of words (channel pairs) over its zero-bordered grid,
``Wp`` words a grid row (`conv_amx`). Output column ``n = y·Wp + x`` of the flattened grid
is then a product like `gemm_amx_ir`'s, with K running over the taps and, within a tap, over
the channel pairs: tap ``t``'s B is the grid shifted by ``offsets[t]`` words (``kh·Wp +
kw`` at stride 1; into a phase plane at stride 2, `conv_amx._Grid`), so no patch array
exists. Columns with ``x`` at or past the output width are computed and dropped: the
epilogue (`AmxTileKernel._epilogue`, shared with the GEMM) packs each 16 lanes' kept ones
together (``vcompressps`` into a register) and adds the residual (where one is given) and
stores them through a mask of as many leading lanes, where the output's pixels lie one after
another (``y·W + x``).
``vcompressps`` straight to memory took 12% of ResNet-18's 64-filter layers at 56² (0.195 ms
against 0.175, one thread).

``grid_part`` is ``part`` writing its output as another direct convolution's input
(`bf16_handoff`): a pair of filters' rows rounded to bf16 and paired into one row of words,
each column ``n`` at word ``n + shift`` of the reader's zero-bordered grid (of the same grid
width, so the shift is constant), the kept lanes stored through their mask (no compress):
the dropped columns would fall on the border, which stays zero. The context's ``grid``
(the words' address), ``grid_ldb`` (words a row) and ``grid_shift`` say where; one image, an
even number of filters, no residual.

``part(context, part, parts)`` is a `spin_pool` task over the tiles of every image, row
blocks outside (a block of the weights stays in L2 while it meets each image's column tiles).
A tile's sums wait in a buffer on the part's stack and go through the epilogue a few rows at
a time between the next tile's steps of K (``tile`` calling ``rows_epilogue``), the last
tile's after the loop: AMX's products run on while the core stores. A row block's first tile,
whose steps stream its weights in, stores the tile before it whole first; over a long K
(`INTERLEAVED_STEPS`) each tile stores its own right after its sums.
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.gemm_amx_ir import (
    INTERLEAVED_STEPS,
    ROWS,
    TILE_COLUMNS,
    WORDS,
    AmxTileKernel,
    release_tiles_at_returns,
)
from engine.kernels.gemm_bf16_ir import BFloatType
from engine.kernels.gemm_ir import F32, I32, I64
from engine.kernels.gemm_kernel import AMX_TILE
from engine.kernels.grid_lanes_ir import GridLanes
from engine.kernels.task_ir import as_float, fields, loop, masked_store, task

I8 = ir.IntType(8)
LINE_WORDS = 16
# Four steps of K ahead in the packed weights (8 KB). ResNet-18's 512-filter layer at 7²
# (4.7 MB of weights, two column tiles), one thread: 0.315 ms with no prefetch, 0.278 at 4
# steps, 0.284 at 2 or 8; the 64- to 256-filter layers unchanged.
PREFETCH_WORDS = 4 * 2 * ROWS * WORDS


class DirectConvKernel(AmxTileKernel):
    """`AmxTileKernel` whose K loop walks the taps of a convolution over a bordered grid."""

    def __init__(self, shape: Any) -> None:
        super().__init__(shape)
        lanes_mask = ir.VectorType(ir.IntType(1), WORDS)
        self.compress = ir.Function(self.module, ir.FunctionType(
            self.vector, [self.vector, self.vector, lanes_mask]),
            name=f"llvm.x86.avx512.mask.compress.v{WORDS}f32")
        self.grid_lanes = GridLanes(self.module)
        self._targets: list[Any] = []
        self._kept: list[tuple[Any, Any]] = []

    def define_rows_epilogue(self, name: str) -> ir.Function:
        """``name(floats, first, last, column, grid_width, width, c, ldc, bias_rows,
        bias_columns, low, high, residual, n, ask_first, ask_last)``: rows [first, last) of a
        finished tile's sums (32 × 32 floats at ``floats``, the tile from grid column
        ``column`` of ``n``) through the epilogue into C, the residual's rows [ask_first,
        ask_last) asked for first (those of the next call, or these), and the output's where
        they are the next call's. C, its biases, bounds and residual sit at `gemm_ir`'s
        argument positions, which `_epilogue_terms` reads."""
        pointer = F32.as_pointer()
        arguments = [pointer, I64, I64, I64, I64, I64, pointer, I64, pointer, pointer, F32, F32,
                     pointer, I64, I64, I64]
        function = ir.Function(self.module, ir.FunctionType(ir.VoidType(), arguments),
                               name=name)
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        floats, first, last, column, grid_width, width = function.args[:6]
        n = function.args[13]
        masks, self._targets, self._kept = [], [], []
        for j in range(self.shape.vectors):
            start = builder.add(column, I64(j * WORDS))
            masks.append(self.grid_lanes.kept(builder, start, grid_width, width, n))
            self._kept.append((masks[-1], self.grid_lanes.leading(builder, masks[-1])))
            self._targets.append(self.grid_lanes.pixels_before(builder, start, grid_width, width))
        self._rows_through_epilogue(function, builder, floats, first, last, masks,
                                    *function.args[14:16])
        builder.ret_void()
        return function

    def define_grid_rows_epilogue(self, name: str, words_out: bool = False) -> ir.Function:
        """`define_rows_epilogue`'s function (its arguments alike, rows [first, last) even)
        storing bf16 pairs of filter rows: row pair ``p``'s words at ``c + p·ldc``, column
        ``n``'s at word ``n`` on (``c`` is the tile's row block in the reader's grid, the
        shift added). The values are the float32 epilogue's (biases, then the clamp, in its
        order), rounded as the pairing pass rounds them (``fptrunc``: to nearest even).

        ``words_out``: the pairs go where the output's pixels lie instead (``y·W + x`` words
        on from ``c + p·ldc``), each vector's kept lanes packed together as the float32
        epilogue packs them: the words a 1×1 product's pairing pass makes of the output."""
        words_type = ir.VectorType(I32, WORDS)
        halves_type = ir.VectorType(BFloatType(), WORDS)
        # declared once a module: the grid's epilogue stores words, the words' floats
        store_words = None if words_out else masked_store(self.module, words_type, "i32")
        function = ir.Function(self.module, self.define_rows_epilogue_type(), name=name)
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        floats, first, last, column, grid_width, width = function.args[:6]
        n = function.args[13]
        masks = [self.grid_lanes.kept(builder, builder.add(column, I64(j * WORDS)), grid_width,
                                  width, n) for j in range(self.shape.vectors)]
        targets = [self.grid_lanes.pixels_before(builder, builder.add(column, I64(j * WORDS)),
                                       grid_width, width) for j in range(self.shape.vectors)]
        leading = [self.grid_lanes.leading(builder, mask) for mask in masks]
        terms = self._epilogue_terms(function, builder, self.shape.vectors, masks)
        words = builder.bitcast(terms["c"], I32.as_pointer())
        order = [lane for index in range(WORDS) for lane in (index, index + WORDS)]

        def line_of(pair: Any) -> Any:
            row_words = builder.mul(pair, terms["ldc"])
            return builder.gep(words, [row_words if words_out else builder.add(row_words,
                                                                              column)])

        def starts() -> list[Any]:
            return targets if words_out else [I64(j * WORDS) for j in range(self.shape.vectors)]

        # The lines of the next call's row pairs owned before they are stored, as the float32
        # epilogue owns its output's (`AmxTileKernel._rows_through_epilogue`): in a run of
        # layers they are rarely in cache.
        ask_first, ask_last = function.args[14:16]
        with builder.if_then(builder.icmp_signed(">=", ask_first, last)), loop(
                builder, function, builder.sdiv(ask_first, I64(2)),
                builder.sdiv(ask_last, I64(2)), "ask") as pair:
            line = builder.bitcast(line_of(pair), F32.as_pointer())
            for start in starts():
                for offset in (0, WORDS - 1):
                    builder.call(self.prefetch, [builder.gep(line, [builder.add(
                        start, I64(offset))]), I32(1), I32(3), I32(1)])
        with loop(builder, function, builder.sdiv(first, I64(2)), builder.sdiv(last, I64(2)),
                  "pair") as pair:
            rows = (builder.mul(pair, I64(2)), builder.add(builder.mul(pair, I64(2)), I64(1)))
            shifts = [self._row_shift(builder, terms, row) for row in rows]
            line = line_of(pair)
            for j in range(self.shape.vectors):
                halves = []
                for row, row_shift in zip(rows, shifts, strict=True):
                    source = builder.gep(floats, [builder.mul(row, I64(TILE_COLUMNS))])
                    value = builder.load(self._address(builder, source, j), align=64)
                    value = builder.fadd(builder.fadd(value, row_shift), terms["shifts"][j])
                    halves.append(builder.fptrunc(self._clamp(builder, terms, value),
                                                  halves_type))
                paired = builder.bitcast(builder.shuffle_vector(
                    halves[0], halves[1], ir.Constant(ir.VectorType(I32, 2 * WORDS), order)),
                    words_type)
                if words_out:  # the kept lanes packed, from their first pixel on
                    packed = builder.call(self.compress, [
                        builder.bitcast(paired, self.vector), self.zero, masks[j]])
                    target = builder.bitcast(builder.gep(line, [targets[j]]),
                                             self.vector.as_pointer())
                    builder.call(self.masked_store, [packed, target, I32(4), leading[j]])
                else:
                    target = builder.bitcast(builder.gep(line, [I64(j * WORDS)]),
                                             words_type.as_pointer())
                    builder.call(store_words, [paired, target, I32(4), masks[j]])
        builder.ret_void()
        return function

    def define_rows_epilogue_type(self) -> ir.FunctionType:
        """The rows epilogue's type (see `define_rows_epilogue`)."""
        pointer = F32.as_pointer()
        return ir.FunctionType(ir.VoidType(), [pointer, I64, I64, I64, I64, I64, pointer, I64,
                                               pointer, pointer, F32, F32, pointer, I64, I64,
                                               I64])

    def define_tile(self, name: str, epilogue: ir.Function, pairs: bool = False) -> ir.Function:
        """``name(words, a, lda, acs, b, ldb, taps, offsets, fresh, floats, pending, <the
        pending tile's epilogue arguments from column on>)``: one tile of 32 filters by 32
        grid columns summed into tiles 0-3 and stored to ``floats``; ``fresh`` (not 0)
        where the tile is its row block's first, whose weights come from memory. The tile
        before it (its sums at ``floats``, ``pending`` rows of them kept) goes through
        ``epilogue`` meanwhile, as many rows after each step of K: the core's stores run
        while AMX multiplies, where AMX waited on them with the epilogue after its own tile
        (ResNet-18's 64-filter layer at 56², one thread: 0.26 → 0.20 ms, 0.35 → 0.23 with
        the residual; a tile with no epilogue at all took 0.13)."""
        pointer = F32.as_pointer()
        arguments = [I64, pointer, I64, I64, pointer, I64, I64, I64.as_pointer(), I64,
                     pointer, I64, *epilogue.function_type.args[3:14]]
        function = ir.Function(self.module, ir.FunctionType(ir.VoidType(), arguments),
                               name=name)
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        fresh, floats, pending = function.args[8:11]
        pending_arguments = list(function.args[11:])

        steps = builder.sdiv(builder.mul(function.args[6], function.args[0]), I64(WORDS))

        def finish(first: Any, last: Any, ask_first: Any, ask_last: Any) -> None:
            builder.call(epilogue, [floats, first, last, *pending_arguments, ask_first,
                                    ask_last])

        # The first column tile of a row block meets its weights first, from memory: it
        # prefetches them ahead; the others find them in L2 and skip the prefetches. The
        # grid's epilogue stores rows two at a time: an even share.
        self._sums_meanwhile(function, builder, steps, fresh, floats, pending, finish,
                             lambda prefetching, finish_rows: self._k_loop(
                                 function, builder, prefetching, finish_rows), pairs)
        builder.ret_void()
        return function

    def _k_loop(self, function: ir.Function, builder: ir.IRBuilder, prefetching: bool,
                finish_rows: Any) -> None:
        """The sums over the taps and, within each, the channel pairs, into tiles 0-3; after
        step ``s``, ``finish_rows(s)`` (where given): its share of the pending tile's rows."""
        words, a, lda, acs, b, ldb = function.args[:6]
        taps, offsets = function.args[6:8]
        a_stride, b_stride = builder.mul(lda, I64(4)), builder.mul(ldb, I64(4))
        a_lower = builder.gep(a, [builder.mul(lda, I64(ROWS))])
        steps_per_tap = builder.sdiv(words, I64(WORDS))
        with loop(builder, function, I64(0), taps, "tap") as tap:
            b_tap = builder.gep(b, [builder.load(builder.gep(offsets, [tap]), align=8)])
            a_tap = builder.mul(builder.mul(tap, words), acs)
            with loop(builder, function, I64(0), words, "pairs", WORDS) as k:
                b_row = builder.gep(b_tap, [builder.mul(k, ldb)])
                a_step = builder.add(a_tap, builder.mul(k, acs))
                if prefetching:
                    ahead = builder.gep(a, [builder.add(a_step, I64(PREFETCH_WORDS))])
                    for line in range(0, 2 * ROWS * WORDS, LINE_WORDS):
                        self._prefetch(builder, builder.gep(ahead, [I64(line)]))
                self._step(builder, builder.gep(a, [a_step]), builder.gep(a_lower, [a_step]),
                           a_stride, b_row, b_stride)
                step = builder.add(builder.mul(tap, steps_per_tap),
                                   builder.sdiv(k, I64(WORDS)))
                if finish_rows is not None:
                    finish_rows(step)

    def _grid_column_bytes(self, builder: ir.IRBuilder, column: Any,
                           field: dict[str, Any]) -> Any:
        """A grid column's bytes from the image's first: a word each."""
        return builder.mul(column, I64(4))

    def _offset(self, builder: ir.IRBuilder, j: int) -> Any:
        """Vector ``j``'s first pixel: where its kept lanes lie."""
        return self._targets[j]

    def _placed(self, builder: ir.IRBuilder, value: Any, j: int,
                masks: list[Any] | None) -> tuple[Any, Any, Any]:
        """The kept lanes of ``value`` packed together, to lie from their first pixel: the
        residual is read and the result stored there, through a mask of as many lanes."""
        kept, leading = self._kept[j]
        packed = builder.call(self.compress, [value, self.zero, kept])
        return packed, self._offset(builder, j), leading

    def define_direct_part(self, name: str, tile: ir.Function, epilogue: ir.Function,
                           positions: dict[str, int], grid: bool = False) -> None:
        """``name(context, part, parts)``: a run of the tiles, row blocks outside the images
        and their column tiles, each tile's epilogue run during the next one's K loop and
        the last one's after it. ``context``: the int64 array `conv_amx` fills;
        ``positions`` names its words (the bounds are float64s). ``grid``: the output goes
        to the grid of words at ``grid`` (`define_grid_rows_epilogue`), one image."""
        function, builder, context, part, parts = task(self.module, name)
        self._part_prologue(builder)
        buffer = builder.alloca(ir.ArrayType(F32, 4 * ROWS * WORDS))
        buffer.align = 64
        floats = builder.bitcast(buffer, F32.as_pointer())
        field = fields(builder, context, positions)
        low, high = (as_float(builder, field[name]) for name in ("low", "high"))
        m, n = field["m"], field["n"]
        row_blocks = builder.sdiv(builder.add(m, I64(ROWS * 2 - 1)), I64(ROWS * 2))
        column_tiles = builder.sdiv(builder.add(n, I64(TILE_COLUMNS - 1)), I64(TILE_COLUMNS))
        each = builder.mul(field["batch"], column_tiles)  # tiles per row block
        total = builder.mul(row_blocks, each)
        first = builder.sdiv(builder.mul(part, total), parts)
        last = builder.sdiv(builder.mul(builder.add(part, I64(1)), total), parts)
        depth = builder.mul(field["taps"], field["words"])  # words of K in all
        steps = builder.sdiv(depth, I64(WORDS))

        def address(base: str, offset_bytes: Any) -> Any:
            return builder.inttoptr(builder.add(field[base], offset_bytes), F32.as_pointer())

        # The tile whose sums wait in the buffer: its rows (0 for none), column, and where
        # its output, residual and biases start.
        pending = {"rows": I64, "column": I64, "c": F32.as_pointer(),
                   "residual": F32.as_pointer(), "bias": F32.as_pointer()}
        slots = {key: builder.alloca(kind) for key, kind in pending.items()}
        for key in ("rows", "column"):
            builder.store(I64(0), slots[key])
        for key in ("c", "residual", "bias"):
            builder.store(address("c", I64(0)), slots[key])

        def pending_arguments() -> list[Any]:
            held = {key: builder.load(slot) for key, slot in slots.items()}
            return [held["rows"], held["column"], field["grid_width"], field["width"],
                    held["c"], field["grid_ldb" if grid else "ldc"], held["bias"],
                    address("columns_bias", I64(0)),
                    low, high, held["residual"], n]

        with loop(builder, function, first, last, "tile") as number:
            block, within = builder.sdiv(number, each), builder.srem(number, each)
            row = builder.mul(block, I64(ROWS * 2))
            image = builder.sdiv(within, column_tiles)
            column = builder.mul(builder.srem(within, column_tiles), I64(TILE_COLUMNS))
            fresh = builder.zext(builder.or_(builder.icmp_signed("==", within, I64(0)),
                                             builder.icmp_signed("==", number, first)), I64)
            rows = builder.sub(m, row)
            rows = builder.select(builder.icmp_signed("<", rows, I64(ROWS * 2)), rows,
                                  I64(ROWS * 2))
            b_at = builder.add(builder.mul(image, field["b_batch"]),
                               self._grid_column_bytes(builder, column, field))
            c_at = builder.add(builder.mul(image, field["c_batch"]),
                               builder.mul(builder.mul(row, field["ldc"]), I64(4)))
            builder.call(tile, [
                field["words"], address("a", builder.mul(builder.mul(row, depth), I64(4))),
                I64(WORDS), I64(2 * WORDS), address("b", b_at), field["ldb"], field["taps"],
                builder.inttoptr(field["offsets"], I64.as_pointer()), fresh, floats,
                *pending_arguments()])
            # The residual lies as the output does (the output itself for none).
            residual = builder.select(builder.icmp_signed("!=", field["residual"], I64(0)),
                                      address("residual", c_at), address("c", c_at))
            if grid:  # row pair row / 2 of the grid, the shift on; no residual
                c_out = address("grid", builder.mul(builder.add(builder.mul(builder.sdiv(
                    row, I64(2)), field["grid_ldb"]), field["grid_shift"]), I64(4)))
                residual = c_out
            else:
                c_out = address("c", c_at)
            for key, value in (("rows", rows), ("column", column), ("c", c_out),
                               ("residual", residual),
                               ("bias", address("rows_bias", builder.mul(row, I64(4))))):
                builder.store(value, slots[key])
            # Over a long K a tile stores its own sums at once, none pending.
            with builder.if_then(builder.icmp_signed(">", steps, I64(INTERLEAVED_STEPS))):
                builder.call(epilogue, [floats, I64(0), rows, *pending_arguments()[1:], I64(0),
                                        rows])
                builder.store(I64(0), slots["rows"])
        held = pending_arguments()
        with builder.if_then(builder.icmp_signed(">", held[0], I64(0))):
            builder.call(epilogue, [floats, I64(0), *held, I64(0), held[0]])
        builder.ret_void()
        release_tiles_at_returns(self, function)


def module(positions: dict[str, int]) -> ir.Module:
    """A module holding ``part`` (and the tile and epilogue it calls), reading its context
    by ``positions``."""
    kernel = DirectConvKernel(AMX_TILE)
    define_parts(kernel, positions)
    return kernel.module


def define_parts(kernel: DirectConvKernel, positions: dict[str, int]) -> None:
    """``kernel``'s ``part``, ``grid_part`` (writing a reader's grid of pairs) and
    ``words_part`` (writing a 1×1 product's words: the grid's pairs placed as the output's
    pixels, ``grid_shift`` 0), with the tiles and epilogues they call, reading their context
    by ``positions``."""
    epilogue = kernel.define_rows_epilogue("rows_epilogue")
    kernel.define_direct_part("part", kernel.define_tile("tile", epilogue), epilogue,
                              positions)
    pairs = kernel.define_grid_rows_epilogue("grid_rows_epilogue")
    kernel.define_direct_part("grid_part", kernel.define_tile("grid_tile", pairs, True), pairs,
                              positions, grid=True)
    words = kernel.define_grid_rows_epilogue("words_rows_epilogue", words_out=True)
    kernel.define_direct_part("words_part", kernel.define_tile("words_tile", words, True),
                              words, positions, grid=True)
