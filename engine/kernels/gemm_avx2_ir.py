"""The float32 tile functions for AVX2 hosts: `gemm_ir`'s tiles reading a packed A at constant
offsets, B's panels copied where many row blocks read them, and a transposed A copied into
row blocks where every panel reads it.

A 6 × 16 tile's step is 12 multiply-adds on 16 ymm registers, half an AVX-512 step's 24, so the
instructions around them weigh twice as much. Read with A's strides as arguments, each step's
six broadcasts of A need an address each, computed by a chain of adds from the row stride: about
30 instructions a step, where Zen 3's two FMA pipes take 6 cycles over its 12 multiply-adds.
With A packed (row stride 1, column stride MR: `gemm_kernel.pack`, the layout every weight
product binds) the broadcasts read at fixed offsets from one pointer that moves MR floats a
step: about 25. So each tile tests the strides once and runs a loop compiled for the packed
layout where they match, the general loop elsewhere.

The Zen 3 host measured has 512 KB of L2 a core (the AVX-512 ones 1–2 MB) and 32 KB of L1. A
panel of B read where it lies is 16 floats from each of K rows N floats apart (a page apart from
N = 1024); past L1 (K over about 400) or with B past L2 every row block reads it again from L2
or L3, a TLB miss a row, where MLAS reads a packed panel in order. So a part whose product has
`PANEL_MIN_ROW_BLOCKS` row blocks or more, K up to `PANEL_MAX_DEPTH` and B not already in panels
walks column panels outside and copies each panel it meets to a buffer on its stack (NR floats a
row) before the row blocks read it there; a product of few row blocks keeps the product's own
walk on one thread, the copy costing about what it saves, and where its job is cut in several
parts walks column panels outside, reading B where it lies, each part its own columns of B
(`SPLIT_MIN_ROW_BLOCKS`).

A part runs each line of whole tiles its walk meets (down a column panel, or along a row
block) in one call of a loop over them (`_define_run`), the tile inlined: called tile by tile,
a short-K tile's call and the part's work to place it took about 10 ns of its 50 (96 × 16 ×
784: the tile's 16 steps about 2 ns each).

A transposed product (`gemm_bind._transposed`: few columns, many filters) reads its activation
as A with unit row stride and K's steps M floats apart, each step of a row block a line of its
own, for each of the weight's panels: a line of L2 a step where a packed block reads 24 bytes.
So where the panels are walked outside and A fits the same buffer, a part copies A into packed
row blocks once, before its first tile.

The K loops ask for nothing ahead (`gemm_ir.AHEAD_STEPS`, `gemm_ir.NEAR_STEPS`, set on the Intel
machine for 24 multiply-adds a step) except where a single product streams B from panels read
where they lie (a transposed product's weight, `gemm_kernel.pack_columns`): each step there
reads the next line of one panel, and asking for it `AHEAD_STEPS` steps on (and for the next
panel's row, into L2) took MobileNet v2's classifier (one row, 1280 × 1000: 5 MB of panels
from L3) from 0.36 to 0.28 ms on one thread, and its 7² products 2–6% less. Elsewhere a
prefetch is one of about 25 instructions a step, and the hardware's prefetchers kept up
without them. ResNet-50 v2 at batch 1, one thread, six alternated pairs, every loop asking:
the steps in order 111–128 ms without (median 119) against 112–134 with (median 129);
ResNet-18 40.6–45.3 against 42.5–48.1 ms. A batch of products over panels (Winograd's) asks
for nothing: ResNet-18's and ResNet-50 v2's layers moved within their noise either way.

One thread on the AMD EPYC (Zen 3) of docs/benchmarks.md, `bench/gemm.py`'s products and
ResNet-50's 1 × 1 convolutions, against the general loop: the packed A 0.8–0.95× its time, with
the copied panels 0.55–0.9×, a transposed product with A copied 0.6–0.85×.
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.gemm_ir import (
    AHEAD_STEPS,
    F32,
    I64,
    IN_L2,
    LINE_BYTES,
    RESIDUAL,
    NarrowEdgeTileKernel,
)

# A part copies each panel of B it walks (NR columns of K rows) into a buffer on its stack
# where K is at most this (4608 × 64 bytes: 288 KB) ...
PANEL_MAX_DEPTH = 4608
# ... and the product has at least this many row blocks to read each copy.
PANEL_MIN_ROW_BLOCKS = 8
# Where a job is cut in several parts, a product of fewer row blocks, from this many, walks
# column panels outside too, B read where it lies: each part then reads its own columns of B,
# where with row blocks outside each part read B over all its columns, each thread all of it.
# Armed over both vCPUs (wall clock, 40 interleaved rounds, best and first quartile, µs): rows
# → columns outside, MobileNet v2's 32 × 32 × 12544 482 → 418 and 743 → 628, 16 × 32 × 12544
# 143 → 136 and 283 → 214, 24 × 96 × 3136 116 → 103 and 139 → 128, 12 × 64 × 3136 87 → 79
# and 98 → 81; one row block (6 × 64 × 3136) 46 against 49. On one thread the rows stay
# outside: MobileNet v2's 32 → 32 layer at 112² took 0.48 ms there, 0.53–0.57 with columns.
SPLIT_MIN_ROW_BLOCKS = 2
# A part copies an A of unit row stride into row blocks (`_rows_copied`) where they fit the
# panel's buffer (its rows padded to whole blocks) and there are at least this many blocks.
ROWS_COPY_MIN_ROW_BLOCKS = 2
# How many rows ahead the copy asks for B's rows (each step also asks for the next panel's row
# into L2, which the next copy reads).
PACK_AHEAD_ROWS = 64


class Avx2TileKernel(NarrowEdgeTileKernel):
    """`NarrowEdgeTileKernel` whose K loops read a packed A at constant offsets, and whose
    parts copy B's panels (see the module docstring)."""

    # The K loops prefetch B's panels where they stream them, nothing else: see the module
    # docstring.
    k_loop_streams = ("b",)
    # Its own `_tile` (A packed at constant offsets) keeps every column in whole vectors.
    side_columns = 0
    # Measured on AVX-512 hosts only (`gemm_ir.ASKS_MIN_C_BYTES`).
    asks_large_c = False

    def _tile(self, function: ir.Function, builder: ir.IRBuilder, rows: int, vectors: int,
              masks: list[Any] | None) -> None:
        """`TileKernel._tile`'s loop for A packed (row stride 1, column stride MR), its
        strides constants, and for any other A; each twice: prefetching B where the part
        streams it (``b_ahead`` not 0: a single product's, `_panel_arguments`) from panels
        read where they lie (``ldb`` NR: a transposed product's weight,
        `gemm_kernel.pack_columns`), and prefetching nothing."""
        lda, acs, _, ldb = function.args[2:6]
        b_ahead = function.args[RESIDUAL + 2]
        streams_panels = builder.and_(builder.icmp_signed("!=", b_ahead, I64(0)),
                                      builder.icmp_signed("==", ldb, I64(self.shape.columns)))
        packed_strides = (I64(1), I64(self.shape.rows))
        packed = builder.and_(builder.icmp_signed("==", lda, packed_strides[0]),
                              builder.icmp_signed("==", acs, packed_strides[1]))
        reads_packed = function.append_basic_block("reads_packed")
        reads_strided = function.append_basic_block("reads_strided")
        after = function.append_basic_block("after")
        builder.cbranch(packed, reads_packed, reads_strided)
        for block, strides in ((reads_packed, packed_strides), (reads_strided, None)):
            builder.position_at_end(block)
            streams_b = function.append_basic_block(f"{block.name}_streams_b")
            quiet = function.append_basic_block(f"{block.name}_quiet")
            builder.cbranch(streams_panels, streams_b, quiet)
            for loop_block, stream in ((streams_b, "b"), (quiet, "a")):  # "a": no prefetch
                builder.position_at_end(loop_block)
                self._tile_loop(function, builder, rows, vectors, masks, stream, strides)
                builder.branch(after)
        builder.position_at_end(after)

    def define_full(self, name: str) -> ir.Function:
        """``name``: one whole tile, inlined into ``name_run``, which runs whole tiles in a
        row (see `_define_run`); the part calls that alone (`_run_tile`)."""
        full = super().define_full(name)
        full.attributes.add("alwaysinline")
        full.linkage = "internal"
        self._run = self._define_run(f"{name}_run", full)
        return full

    def _define_run(self, name: str, tile: ir.Function) -> ir.Function:
        """``name(count, a_step, b_step, c_step, rows_bias_step, columns_bias_step, *tile's
        arguments)``: ``tile`` ``count`` times (at least once), each time its operands moved
        on by the steps, in floats (the residual by C's). Called tile by tile, a short-K
        tile's call, its part's division of the tile number and its choice of operands took
        about 10 ns a tile beside its own 2 ns a step of K."""
        steps = 5
        types = [I64, *[I64] * steps, *tile.function_type.args]
        function = ir.Function(self.module, ir.FunctionType(ir.VoidType(), types), name=name)
        count, a_step, b_step, c_step, rows_step, columns_step = function.args[:steps + 1]
        arguments = function.args[steps + 1:]
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        start = builder.block
        loop = function.append_basic_block("tile")
        done = function.append_basic_block("ran")
        builder.branch(loop)
        builder.position_at_end(loop)
        index = builder.phi(I64)
        moved = list(arguments)
        c_floats = builder.mul(index, c_step)
        for position, step in ((1, a_step), (4, b_step), (6, None), (8, rows_step),
                               (9, columns_step), (RESIDUAL, None)):
            floats = c_floats if step is None else builder.mul(index, step)
            moved[position] = builder.gep(arguments[position], [floats])
        builder.call(tile, moved)
        following = builder.add(index, I64(1))
        index.add_incoming(I64(0), start)
        index.add_incoming(following, builder.block)
        builder.cbranch(builder.icmp_signed("<", following, count), loop, done)
        builder.position_at_end(done)
        builder.ret_void()
        return function

    def _run_tile(self, function: ir.Function, builder: ir.IRBuilder, full: ir.Function,
                  edge: ir.Function, arguments: list[Any], rows: Any, columns: Any,
                  columns_outside: Any) -> Any:
        """A whole tile and the whole tiles after it in the part's order, as far as the
        part's last tile and the line of whole tiles it walks (down its column panel with
        panels outside, else along its row block), in one call of the run function; an edge
        tile alone. The tiles it ran (an i64)."""
        tile = self._place
        constant = tile["constant"]
        mr, nr = I64(self.shape.rows), I64(self.shape.columns)
        whole = builder.and_(builder.icmp_signed("==", rows, mr),
                             builder.icmp_signed("==", columns, nr))
        down = builder.sub(builder.sdiv(constant["m"], mr), builder.sdiv(tile["row"], mr))
        along = builder.sub(builder.sdiv(constant["n"], nr),
                            builder.sdiv(tile["column"], nr))
        in_line = builder.select(columns_outside, down, along)
        in_part = builder.sub(tile["last"], tile["number"])
        count = builder.select(builder.icmp_signed("<", in_line, in_part), in_line, in_part)
        zero = I64(0)
        steps = [builder.select(columns_outside, self._a_step, zero),
                 builder.select(columns_outside, zero, builder.mul(nr, constant["column_step"])),
                 builder.select(columns_outside, builder.mul(mr, constant["ldc"]), nr),
                 builder.select(columns_outside, mr, zero),
                 builder.select(columns_outside, zero, nr)]
        run = function.append_basic_block("run_whole")
        alone = function.append_basic_block("edge_alone")
        after = function.append_basic_block("after_tiles")
        builder.cbranch(whole, run, alone)
        builder.position_at_end(run)
        builder.call(self._run, [count, *steps, *arguments])
        builder.branch(after)
        builder.position_at_end(alone)
        builder.call(edge, [*arguments, rows, columns])
        builder.branch(after)
        builder.position_at_end(after)
        tiles = builder.phi(I64)
        tiles.add_incoming(count, run)
        tiles.add_incoming(I64(1), alone)
        return tiles

    def _part_prologue(self, builder: ir.IRBuilder) -> None:
        # One buffer on the part's stack: a panel's copy (`PANEL_MAX_DEPTH` rows of NR) or
        # A's (as many floats, and a vector's slack: see `_copy_rows`), never both.
        buffer = builder.alloca(ir.ArrayType(F32, self._copy_floats() + self.shape.width))
        buffer.align = LINE_BYTES
        self._panel = self._rows = builder.bitcast(buffer, F32.as_pointer())

    def _copy_floats(self) -> int:
        """The floats the copy buffer holds (a panel of `PANEL_MAX_DEPTH` rows)."""
        return PANEL_MAX_DEPTH * self.shape.columns

    def _walk(self, builder: ir.IRBuilder, outside: Any, constant: dict[str, Any],
              row_blocks: Any, nr: Any, parts: Any) -> Any:
        """Column panels outside wherever K is up to `PANEL_MAX_DEPTH` and B is not already
        in panels of NR, and either the part copies B's panels (`PANEL_MIN_ROW_BLOCKS` row
        blocks or more) or the job is cut in several parts (`SPLIT_MIN_ROW_BLOCKS` or
        more)."""
        panels = builder.and_(builder.icmp_signed("<=", constant["k"], I64(PANEL_MAX_DEPTH)),
                              builder.icmp_signed("!=", constant["ldb"], nr))
        self._packs = builder.and_(
            panels, builder.icmp_signed(">=", row_blocks, I64(PANEL_MIN_ROW_BLOCKS)))
        split = builder.and_(
            panels, builder.and_(builder.icmp_signed(">", parts, I64(1)), builder.icmp_signed(
                ">=", row_blocks, I64(SPLIT_MIN_ROW_BLOCKS))))
        outside = builder.or_(outside, builder.or_(self._packs, split))
        self._copies_rows = self._rows_copied(builder, outside, constant, row_blocks)
        return outside

    def _rows_copied(self, builder: ir.IRBuilder, outside: Any, constant: dict[str, Any],
                     row_blocks: Any) -> Any:
        """Whether the part copies A into row blocks (as `gemm_kernel.pack` lays them) before
        its first tile, and does so (an i1): with column panels outside, every panel reads
        all of A, and an A of unit row stride whose steps of K lie a line or more apart (a
        transposed product's activation, `gemm_bind._transposed`) costs a line of L2 per row
        block and step, where a packed block reads 24 bytes of one."""
        mr = self.shape.rows
        k, acs = constant["k"], constant["acs"]
        floats = builder.mul(builder.mul(row_blocks, I64(mr)), k)
        copies = builder.and_(
            builder.and_(outside, builder.icmp_signed("==", constant["lda"], I64(1))),
            builder.and_(builder.icmp_signed(">=", acs, I64(LINE_BYTES // 4)),
                         builder.icmp_signed("==", constant["a_batch"], I64(0))))
        copies = builder.and_(builder.and_(copies, builder.not_(self._packs)), builder.and_(
            builder.icmp_signed("<=", floats, I64(self._copy_floats())),
            builder.icmp_signed(">=", row_blocks, I64(ROWS_COPY_MIN_ROW_BLOCKS))))
        with builder.if_then(copies):
            self._copy_rows(builder, constant, row_blocks)
        return copies

    def _copy_rows(self, builder: ir.IRBuilder, constant: dict[str, Any],
                   row_blocks: Any) -> None:
        """A's rows (unit row stride) into the row-block buffer, block by block, each (K,
        MR): per step a vector of the block's rows (those past M masked off as zeros), its
        last lanes overwritten by the next step's (the buffer's slack takes the last)."""
        function = builder.function
        mr = self.shape.rows
        k_count, acs, m = constant["k"], constant["acs"], constant["m"]
        a = builder.inttoptr(constant["a"], F32.as_pointer())
        start = builder.block
        blocks = function.append_basic_block("copy_block")
        steps = function.append_basic_block("copy_step")
        block_done = function.append_basic_block("copied_block")
        done = function.append_basic_block("copied_rows")
        builder.cbranch(builder.icmp_signed(">", k_count, I64(0)), blocks, done)

        builder.position_at_end(blocks)
        block = builder.phi(I64)
        first_row = builder.mul(block, I64(mr))
        left = builder.sub(m, first_row)
        lanes = self._masks(builder, builder.select(
            builder.icmp_signed("<", left, I64(mr)), left, I64(mr)), 1)
        column = builder.gep(a, [first_row])
        target = builder.gep(self._rows, [builder.mul(first_row, k_count)])
        builder.branch(steps)

        builder.position_at_end(steps)
        k = builder.phi(I64)
        source = builder.gep(column, [builder.mul(k, acs)])
        self._prefetch(builder, builder.gep(source, [builder.mul(I64(PACK_AHEAD_ROWS), acs)]))
        value = self._load(builder, source, 0, lanes)
        at = builder.gep(target, [builder.mul(k, I64(mr))])
        builder.store(value, self._address(builder, at, 0), align=4)
        k_next = builder.add(k, I64(1))
        k.add_incoming(I64(0), blocks)
        k.add_incoming(k_next, steps)
        builder.cbranch(builder.icmp_signed("<", k_next, k_count), steps, block_done)

        builder.position_at_end(block_done)
        block_next = builder.add(block, I64(1))
        block.add_incoming(I64(0), start)
        block.add_incoming(block_next, block_done)
        builder.cbranch(builder.icmp_signed("<", block_next, row_blocks), blocks, done)
        builder.position_at_end(done)

    def _panel_arguments(self, function: ir.Function, builder: ir.IRBuilder,
                         arguments: list[Any], tile: dict[str, Any]) -> list[Any]:
        """Where the part copies B's panels: the panel copied at its first tile in the part
        (its first row block, or the part's first tile), and the tile reading the copy
        (``ldb`` NR; a narrow edge's loop, which prefetches, asks for A's steps ahead, as
        with row blocks outside). Where it copied A: the tile's block of the copy. In a
        batch of products, no B ahead (``b_ahead`` 0)."""
        constant, packs = tile["constant"], self._packs
        # Kept for `_run_tile`: the tile's place, and A's floats from one row block to the
        # next (in the copy of A's rows, or in A).
        self._place = tile
        mr = I64(self.shape.rows)
        self._a_step = builder.select(self._copies_rows, builder.mul(mr, constant["k"]),
                                      builder.mul(mr, constant["row_step"]))
        fresh = builder.or_(builder.icmp_signed("==", tile["row"], I64(0)),
                            builder.icmp_signed("==", tile["number"], tile["first"]))
        with builder.if_then(builder.and_(packs, fresh)):
            self._copy_panel(function, builder, tile["b_tile"], constant["ldb"],
                             constant["k"], tile["columns"])
        k, a, lda, acs, b, ldb = arguments[:6]
        a_ahead, b_ahead = arguments[RESIDUAL + 1:RESIDUAL + 3]
        copied = self._copies_rows
        # B's panels are asked for ahead (`_tile`) in a single product; a batch of products
        # (Winograd's, `gemm_kernel.bind_packed_columns_batch`) keeps its loops unasked, as
        # measured before (ResNet-18 and ResNet-50 v2 moved within their noise either way)
        batched = builder.icmp_signed("!=", constant["b_batch"], I64(0))
        a_rows = builder.gep(self._rows, [builder.mul(tile["row"], constant["k"])])
        return [k, builder.select(copied, a_rows, a), lda,
                builder.select(copied, I64(self.shape.rows), acs),
                builder.select(packs, self._panel, b),
                builder.select(packs, I64(self.shape.columns), ldb),
                *arguments[6:RESIDUAL + 1],
                builder.select(packs, builder.mul(I64(AHEAD_STEPS), constant["acs"]), a_ahead),
                builder.select(builder.or_(packs, batched), I64(0), b_ahead),
                *arguments[RESIDUAL + 3:]]

    def _copy_panel(self, function: ir.Function, builder: ir.IRBuilder, source: Any,
                    ldb: Any, k_count: Any, columns: Any) -> None:
        """The first ``columns`` columns of B's ``k_count`` rows from ``source`` (``ldb``
        floats apart) into the panel buffer, NR floats a row (past ``columns``: zeros,
        which the tile's masked loads never read)."""
        nr, vectors = self.shape.columns, self.shape.vectors
        masks = self._masks(builder, columns, vectors)
        start = builder.block
        loop = function.append_basic_block("pack_panel")
        done = function.append_basic_block("packed_panel")
        builder.cbranch(builder.icmp_signed(">", k_count, I64(0)), loop, done)
        builder.position_at_end(loop)
        k = builder.phi(I64)
        row = builder.gep(source, [builder.mul(k, ldb)])
        ahead = builder.gep(row, [builder.mul(I64(PACK_AHEAD_ROWS), ldb)])
        for floats in (0, nr - 1):  # the row's first and last line
            self._prefetch(builder, builder.gep(ahead, [I64(floats)]))
        following_panel = builder.gep(row, [I64(nr)])  # the next copy's row, into L2
        for floats in (0, nr - 1):
            self._prefetch(builder, builder.gep(following_panel, [I64(floats)]), IN_L2)
        copy = builder.gep(self._panel, [builder.mul(k, I64(nr))])
        for j in range(vectors):
            value = self._load(builder, row, j, masks)
            builder.store(value, self._address(builder, copy, j), align=32)
        following = builder.add(k, I64(1))
        k.add_incoming(I64(0), start)
        k.add_incoming(following, builder.block)
        builder.cbranch(builder.icmp_signed("<", following, k_count), loop, done)
        builder.position_at_end(done)
