"""The LLVM IR of `gemm_kernel`'s register-tile micro-kernels, built with `llvmlite.ir`.

One function computes one tile of ``C = A @ B``::

    tile(K, a, lda, acs, b, ldb, c, ldc, bias_rows, bias_columns, low, high, residual,
         a_ahead, b_ahead, b_next [, rows, columns])

``a`` points at the tile's first row of A (element (i, k) at ``a + i·lda + k·acs``), ``b`` at
its first column of B (row k at ``b + k·ldb``, contiguous floats), ``c`` at its corner of C
(row i at ``c + i·ldc``); strides count floats. Each result is stored as
``clip(sum + bias_rows[i] + bias_columns[j] + residual[i, j], low, high)`` (NaN stays NaN,
as ``clip`` keeps it): a convolution's bias per filter row, a dense layer's per column, a
residual block's other operand (laid out as C, ``ldc`` floats a row; C's own address for
none), their ReLU or ReLU6 (callers pass zeros and ±inf for none). The terms are added in
that order, the order a network's separate add steps take. The K loop carries the tile as
SSA values (phi nodes), which LLVM keeps in vector registers: per step, one vector load of B
per vector of a row, one scalar load of A per row, broadcast, and a fused multiply-add per
row and vector (``llvm.fmuladd``: one instruction where the CPU has FMA).

Each step also prefetches the operand the product streams from memory, `AHEAD_STEPS` steps of
K on: with column panels outside (``b_ahead``, in floats, not 0) each line of B's row there,
so a packed panel and the panel after it arrive while the tile works; with row blocks outside
(``a_ahead``) A's column there, a packed block of weights. The part passes one offset or the
other, and each tile has a loop for each, so no step tests which. Each step asks for B once
more, ``b_next`` floats from its row (`NEAR_STEPS`): the next panel's row into L2 with
column panels outside, a row B's next tile or this one reads soon into L1 with row blocks
outside.

``tile_full`` computes a whole ``MR × NR`` tile. ``tile_edge`` serves the last row and column
blocks: one loop per row count (1 to MR) and per vector count (1 or all), so that a thin edge
does only its own rows' work, B read and C written through lane masks (``llvm.masked.*``).
In the float32 kernel (`NarrowEdgeTileKernel`) an edge of up to half a vector of columns
over an A whose rows lie one float apart (a packed A, or a transposed product's
activation) has a loop per column count instead, its sums a column to a vector: N = 196
leaves 4 columns past 6 panels of 32, which the row-wise loop took about as long over as
over a whole panel. An edge tile of whole rows keeps up to `TileKernel.side_columns`
columns past its whole vectors a column to a vector in the same loop (AVX-512's float32 and
bf16 tiles: at 7², 49 columns, a panel of 32 and then one vector and a column), laid in its
rows' last vector before the epilogue, which every kernel's edge then shares.
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.task_ir import as_float, task
from engine.kernels.task_ir import fields as context_fields

F32 = ir.FloatType()
I64 = ir.IntType(64)
I32 = ir.IntType(32)
I1 = ir.IntType(1)
# How far ahead the K loop prefetches, in steps of K. A product of few rows reads its packed
# weights once, from memory, faster than the hardware prefetchers bring them (they stop at each
# 4 KB page): 64 steps is 8 KB ahead in a panel of 32 columns. Intel machine of
# docs/benchmarks.md, one thread, load 0.7, weights cold, medians of 40 interleaved rounds:
# Winograd's 16 products of ResNet-18's 512-channel layer at 7² (16 × 512 × 512 each, 16.8 MB
# of panels, as one call) 2.72 ms with no prefetch ahead, 2.13 at 32 steps, 2.14 at 64, 2.17
# at 128, 2.26 at 256 (NumPy's sum of the panels 1.38); with row blocks outside (36 products
# 256 × 256 × 16, A packed: the F(4×4) layer at 14²) 1.71 → 1.21 ms at 64 (the sum 1.0).
AHEAD_STEPS = 64
# What else each step asks for of B, by the tile function's ``b_next`` (floats from the step's
# row of B): with column panels outside, the same row of the next panel, into L2 (`IN_L2`):
# the row blocks after a panel's first read it from cache while the core's memory stream sits
# idle, and the next panel can arrive meanwhile. With row blocks outside, B (read by every
# row block, from L2) is asked for into L1 as well: over a K of `NEXT_PANEL_MAX_DEPTH` or
# less the same row of the next panel (the next tile's, which fits in L1 beside this one),
# deeper `NEAR_STEPS` rows on in this one. Rows 784 B to 12.5 KB apart defeat the hardware's
# own prefetchers (one stream per row, a page each). One thread, operands cold, medians of 8
# interleaved rounds over 8-16 copies (docs/benchmarks.md, "fp32: the GEMM asking for B"):
# columns outside 64 × 256 × 3136 0.91 → 0.81-0.90 ms, 128 × 512 × 784 0.97 → 0.87; rows
# outside 256 × 1024 × 196 1.12 → 0.98, 512 × 128 × 784 0.87 → 0.77, 256 × 64 × 3136 1.00
# → 0.77.
IN_L2 = 2  # LLVM's locality for prefetcht1
NEAR_STEPS = 16
NEXT_PANEL_MAX_DEPTH = 128
# A product with column panels outside asks for the next panel only where it and the panel
# it works on fit in this many bytes of L2 beside A, which each panel re-reads whole (else
# ``b_next`` 0, the row it reads: nothing more). Past it the next panel evicts A: ResNet-50
# v2's 3×3 stride-2 layer at 7² (49 × 4608 × 512 transposed, 2.3 MB) took 1.23-1.30× as
# long asking, ResNet-18's stride-2 layer at 14² and batch 8 (256 × 1152 × 392, 1.5 MB)
# 1.10-1.29×; ResNet-50 v2's 49 × 2048 × 512 (1.0 MB) took 0.89-1.00×.
NEXT_PANEL_L2_BYTES = 1 << 20
# C's bytes at least of a product whose part asks for each tile's lines of C and the
# residual as the tile starts (`TileKernel.asks_large_c`): a C past L2, whose lines come from
# memory, and which a short K loop ends long before they arrive. One Zen 4 core, float32 at
# batch 1, in the walk (`bench/variants.py`), without ÷ with, asking for every product
# adding a residual: ResNet-50 v2's residual products at 56² (C 3.2 MB) 1.11-1.17, 28² (1.6
# MB) 1.08-1.13, 14² (0.8 MB) 1.01-1.04, 7² 1.00-1.01; MobileNet v2's (C 0.03-0.3 MB)
# 0.98-0.99.
ASKS_MIN_C_BYTES = 512 << 10
# A product's ``columns_outside`` field at this: B's column panels outside where the job runs
# in several parts, row blocks outside where it runs whole (`gemm_bind.streams_right`).
COLUMNS_WHEN_SPLIT = 2
LINE_BYTES = 64
RESIDUAL = 12  # the tile functions' argument holding the residual's pointer
B_NEXT = RESIDUAL + 3  # the tile functions' argument ``b_next`` (see `NEAR_STEPS`)


class TileKernel:
    """A module holding the tile functions for one register tile (`gemm_kernel.Tile`)."""

    # The streamed operands ("a", "b") whose K loops prefetch (`AHEAD_STEPS`, `NEAR_STEPS`;
    # on AVX2 B's panels alone: `gemm_avx2_ir`).
    k_loop_streams: tuple[str, ...] = ("a", "b")
    # Whether a part asks for each tile's lines of C (for writing) and the residual's as the
    # tile starts (`_ask_lines`), its K loop running while they come, where the product adds
    # a residual and C holds `ASKS_MIN_C_BYTES` or more.
    asks_large_c = False
    # Up to how many columns past its whole vectors an edge tile of whole rows over an A
    # whose rows lie one float apart keeps a column to a vector (`_tile_loop`'s ``side``);
    # 0: none.
    side_columns = 0

    def __init__(self, shape: Any) -> None:
        self.shape = shape
        self.module = ir.Module(name="hybridserve_gemm")
        width = shape.width
        self.vector = ir.VectorType(F32, width)
        self.zero = ir.Constant(self.vector, [0.0] * width)
        vector, pointer = self.vector, self.vector.as_pointer()
        mask = ir.VectorType(I1, width)
        self.fmuladd = ir.Function(self.module, ir.FunctionType(vector, [vector] * 3),
                                   name=f"llvm.fmuladd.v{width}f32")
        self.masked_load = ir.Function(
            self.module, ir.FunctionType(vector, [pointer, I32, mask, vector]),
            name=f"llvm.masked.load.v{width}f32.p0")
        self.masked_store = ir.Function(
            self.module, ir.FunctionType(ir.VoidType(), [vector, pointer, I32, mask]),
            name=f"llvm.masked.store.v{width}f32.p0")
        self.prefetch = ir.Function(
            self.module, ir.FunctionType(ir.VoidType(), [F32.as_pointer(), I32, I32, I32]),
            name="llvm.prefetch.p0")

    def define_full(self, name: str) -> ir.Function:
        """``name``: one whole tile, no masks."""
        function, builder = self._function(name, edge=False)
        self._tile(function, builder, self.shape.rows, self.shape.vectors, None)
        builder.ret_void()
        return function

    def define_edge(self, name: str) -> ir.Function:
        """``name``: the first ``rows`` rows and ``columns`` columns of a tile."""
        function, builder = self._function(name, edge=True)
        rows, columns = function.args[-2:]
        finish = function.append_basic_block("finish")
        narrow = self._narrow_columns()
        if narrow:
            by_columns = function.append_basic_block("by_columns")
            by_rows = function.append_basic_block("by_rows")
            builder.cbranch(builder.and_(builder.icmp_signed("<=", columns, I64(narrow)),
                                         builder.icmp_signed("==", function.args[2], I64(1))),
                            by_columns, by_rows)
            builder.position_at_end(by_columns)
            column_cases = builder.switch(columns, finish)
            for count in range(1, narrow + 1):
                block = function.append_basic_block(f"columns{count}")
                column_cases.add_case(I64(count), block)
                builder.position_at_end(block)
                self._column_tile(function, builder, count, rows)
                builder.branch(finish)
            builder.position_at_end(by_rows)
        cases = builder.switch(rows, finish)
        for count in range(1, self.shape.rows + 1):
            block = function.append_basic_block(f"rows{count}")
            cases.add_case(I64(count), block)
            builder.position_at_end(block)
            if count == self.shape.rows and self.sides():
                self._side_tiles(function, builder, columns, finish)
            narrow = function.append_basic_block(f"rows{count}_narrow")
            wide = function.append_basic_block(f"rows{count}_wide")
            builder.cbranch(builder.icmp_signed("<=", columns, I64(self.shape.width)),
                            narrow, wide)
            for target, vectors in ((narrow, 1), (wide, self.shape.vectors)):
                builder.position_at_end(target)
                self._tile(function, builder, count, vectors, self._masks(builder, columns,
                                                                          vectors))
                builder.branch(finish)
        builder.position_at_end(finish)
        builder.ret_void()
        return function

    def _narrow_columns(self) -> int:
        """Up to how many columns an edge tile runs as `_column_tile` (0: never)."""
        return 0

    def sides(self) -> int:
        """`side_columns` where the tile's rows fit in one vector's lanes (not NEON's 6 rows
        by 4 lanes), fewer than a vector; else 0."""
        if self.shape.rows > self.shape.width:
            return 0
        return min(self.side_columns, self.shape.width - 1)

    def _side_tiles(self, function: ir.Function, builder: ir.IRBuilder, columns: Any,
                    finish: ir.Block) -> None:
        """An edge tile of whole rows whose columns run up to `side_columns` past whole
        vectors, over an A whose rows lie one float apart: its whole vectors row by row,
        the columns past them a column to a vector (`_tile_loop`'s ``side``); the builder
        ends in the block for every other edge tile of whole rows."""
        rows, width, most = self.shape.rows, self.shape.width, self.sides()
        sides = function.append_basic_block("side_columns")
        others = function.append_basic_block("no_side_columns")
        builder.cbranch(builder.icmp_signed("==", function.args[2], I64(1)), sides, others)
        builder.position_at_end(sides)
        cases = builder.switch(columns, others)
        # An edge of no whole vector and as few columns the narrow loop takes first.
        for vectors in range(1 if self._narrow_columns() >= most else 0, self.shape.vectors):
            for side in range(1, most + 1):
                block = function.append_basic_block(f"vectors{vectors}_side{side}")
                cases.add_case(I64(vectors * width + side), block)
                builder.position_at_end(block)
                self._tile(function, builder, rows, vectors,
                           self._masks(builder, columns, vectors + 1), side)
                builder.branch(finish)
        builder.position_at_end(others)

    def _column_tile(self, function: ir.Function, builder: ir.IRBuilder, columns: int,
                     rows: Any) -> None:
        """An edge tile of ``columns`` columns (see `NarrowEdgeTileKernel`)."""
        raise NotImplementedError

    def define_part(self, name: str, full: ir.Function, edge: ir.Function,
                    fields: dict[str, int]) -> None:
        """``name(context, part, parts)``: a `spin_pool` job's part over the tiles of C, a
        run of tile numbers in the order of the outer loop (row blocks or column panels),
        each product of a batch in turn. ``context`` is the int64 array `gemm_kernel`
        fills; ``fields`` names its positions (the bounds are float64s)."""
        function, builder, context, part, parts = task(self.module, name)
        self._part_prologue(builder)
        words = context_fields(builder, context, fields)

        def field(name: str) -> ir.Value:
            return words[name]

        def bound(name: str) -> ir.Value:
            return as_float(builder, field(name))

        mr, nr, m, n = field("mr"), field("nr"), field("m"), field("n")
        row_blocks = builder.sdiv(builder.add(m, builder.sub(mr, I64(1))), mr)
        panels = builder.sdiv(builder.add(n, builder.sub(nr, I64(1))), nr)
        each = builder.mul(row_blocks, panels)
        total = builder.mul(field("batch"), each)
        first = builder.sdiv(builder.mul(part, total), parts)
        last = builder.sdiv(builder.mul(builder.add(part, I64(1)), total), parts)
        constant = {name: field(name) for name in (
            "a", "row_step", "lda", "acs", "b", "column_step", "ldb", "c", "ldc",
            "rows_bias", "columns_bias", "k", "columns_outside", "a_batch", "b_batch",
            "c_batch", "residual", "m", "n")}
        low, high = bound("low"), bound("high")
        # 1: column panels outside; `COLUMNS_WHEN_SPLIT`: so only where the job is cut in
        # several parts (each thread then reads its own columns of B, not all of it).
        walk = constant["columns_outside"]
        outside = builder.or_(
            builder.icmp_signed("==", walk, I64(1)),
            builder.and_(builder.icmp_signed("==", walk, I64(COLUMNS_WHEN_SPLIT)),
                         builder.icmp_signed(">", parts, I64(1))))
        outside = self._walk(builder, outside, constant, row_blocks, nr, parts)
        # a residual added to a C larger than L2 (whose lines come from memory)
        asks = None if not self.asks_large_c else builder.and_(
            builder.icmp_signed("!=", constant["residual"], I64(0)),
            builder.icmp_signed(">=", builder.mul(builder.mul(m, constant["ldc"]), I64(4)),
                                I64(ASKS_MIN_C_BYTES)))
        start = builder.block
        loop = function.append_basic_block("loop")
        done = function.append_basic_block("done")
        builder.cbranch(builder.icmp_signed("<", first, last), loop, done)

        builder.position_at_end(loop)
        number = builder.phi(I64)
        product, within = builder.sdiv(number, each), builder.srem(number, each)
        row = builder.mul(builder.select(outside, builder.srem(within, row_blocks),
                                         builder.sdiv(within, panels)), mr)
        column = builder.mul(builder.select(outside, builder.sdiv(within, row_blocks),
                                            builder.srem(within, panels)), nr)

        def address(base: str, batch: str, floats: ir.Value) -> ir.Value:
            offset = builder.add(builder.mul(product, constant[batch]),
                                 builder.mul(floats, I64(4)))
            return builder.inttoptr(builder.add(constant[base], offset), F32.as_pointer())

        c_floats = builder.add(builder.mul(row, constant["ldc"]), column)
        c_tile = address("c", "c_batch", c_floats)
        # The residual lies as C does: its element (i, j) at the same offset from its start.
        # None is C itself (see `_epilogue_terms`).
        residual = builder.select(builder.icmp_signed("!=", constant["residual"], I64(0)),
                                  address("residual", "c_batch", c_floats), c_tile)

        def at(base: str, floats: ir.Value) -> ir.Value:
            return builder.inttoptr(builder.add(constant[base], builder.mul(floats, I64(4))),
                                    F32.as_pointer())

        arguments = [
            constant["k"], address("a", "a_batch", builder.mul(row, constant["row_step"])),
            constant["lda"], constant["acs"],
            address("b", "b_batch", builder.mul(column, constant["column_step"])),
            constant["ldb"],
            c_tile, constant["ldc"], at("rows_bias", row), at("columns_bias", column), low, high,
            residual,
            # the streamed operand: B's panels with column panels outside, A's blocks within
            builder.select(outside, I64(0), builder.mul(I64(AHEAD_STEPS), constant["acs"])),
            builder.select(outside, builder.mul(I64(AHEAD_STEPS), constant["ldb"]), I64(0)),
            self._b_next(builder, constant, builder.mul(row_blocks, mr), nr, outside)]
        rows = builder.select(builder.icmp_signed("<", builder.sub(m, row), mr),
                              builder.sub(m, row), mr)
        columns = builder.select(builder.icmp_signed("<", builder.sub(n, column), nr),
                                 builder.sub(n, column), nr)
        if asks is not None:
            with builder.if_then(asks):
                self._ask_lines(builder, c_tile, constant["ldc"], residual, self.shape.rows,
                                self.shape.vectors + (1 if self.side_columns else 0))
        arguments = self._panel_arguments(function, builder, arguments, {
            "constant": constant, "first": first, "number": number, "row": row,
            "column": column, "columns": columns, "b_tile": arguments[4], "last": last})
        tiles = self._run_tile(function, builder, full, edge, arguments, rows, columns, outside)
        following = builder.add(number, I64(1) if tiles is None else tiles)
        number.add_incoming(first, start)
        number.add_incoming(following, builder.block)
        builder.cbranch(builder.icmp_signed("<", following, last), loop, done)
        builder.position_at_end(done)
        self._end_part(function, builder)
        builder.ret_void()

    def _walk(self, builder: ir.IRBuilder, outside: Any, constant: dict[str, Any],
              row_blocks: Any, nr: Any, parts: Any) -> Any:
        """Whether a part of a job of ``parts`` walks column panels outside (an i1), given
        the product's choice ``outside`` (here that choice; `gemm_avx2_ir` packs B's panels,
        walked outside)."""
        return outside

    def _panel_arguments(self, function: ir.Function, builder: ir.IRBuilder,
                         arguments: list[Any], tile: dict[str, Any]) -> list[Any]:
        """The tile function's arguments for the tile ``tile`` names (its row, column and
        columns, the part's tile ``number`` and ``first``, the product's fields), the
        builder at the tile (here ``arguments`` as they are; `gemm_avx2_ir` points B at a
        copy of its panel, or A at a packed copy of its rows)."""
        return arguments

    @staticmethod
    def _b_next(builder: ir.IRBuilder, constant: dict[str, Any], rows: Any, nr: Any,
                outside: Any) -> Any:
        """The tile function's ``b_next`` (see `NEAR_STEPS`): floats from a step's row of B
        to what the step asks for besides, for a product of ``rows`` rows of A (whole row
        blocks) by ``nr``-column panels."""
        k = constant["k"]
        next_panel = builder.mul(nr, constant["column_step"])
        near = builder.mul(I64(NEAR_STEPS), constant["ldb"])
        held = builder.mul(builder.mul(builder.add(rows, builder.mul(nr, I64(2))), k), I64(4))
        panels = builder.select(builder.icmp_signed("<=", held, I64(NEXT_PANEL_L2_BYTES)),
                                next_panel, I64(0))
        rows = builder.select(builder.icmp_signed("<=", k, I64(NEXT_PANEL_MAX_DEPTH)),
                              next_panel, near)
        return builder.select(outside, panels, rows)

    def _run_tile(self, function: ir.Function, builder: ir.IRBuilder, full: ir.Function,
                  edge: ir.Function, arguments: list[Any], rows: Any, columns: Any,
                  columns_outside: Any) -> None:
        """One tile of a part: ``full`` where it is whole, else ``edge`` with its ``rows`` and
        ``columns`` (``columns_outside``: whether the part walks column panels outside, an
        i1); the builder ends in a block after it."""
        mr, nr = I64(self.shape.rows), I64(self.shape.columns)
        whole = builder.and_(builder.icmp_signed("==", rows, mr),
                             builder.icmp_signed("==", columns, nr))
        whole_block = function.append_basic_block("whole")
        edge_block = function.append_basic_block("edge")
        next_block = function.append_basic_block("next")
        builder.cbranch(whole, whole_block, edge_block)
        builder.position_at_end(whole_block)
        builder.call(full, arguments)
        builder.branch(next_block)
        builder.position_at_end(edge_block)
        builder.call(edge, [*arguments, rows, columns])
        builder.branch(next_block)
        builder.position_at_end(next_block)

    def _end_part(self, function: ir.Function, builder: ir.IRBuilder) -> None:
        """What a part does after its last tile (nothing here; AMX stores the tile whose
        sums still wait, `gemm_amx_ir`)."""

    def _part_prologue(self, builder: ir.IRBuilder) -> None:
        """What a part does before its first tile (nothing here; AMX loads its tile
        configuration, `gemm_amx_ir`)."""

    def _function(self, name: str, edge: bool) -> tuple[ir.Function, ir.IRBuilder]:
        pointer = F32.as_pointer()
        arguments = [I64, pointer, I64, I64, pointer, I64, pointer, I64, pointer, pointer, F32, F32,
                     pointer, I64, I64, I64]
        if edge:
            arguments += [I64, I64]
        function = ir.Function(self.module, ir.FunctionType(ir.VoidType(), arguments), name=name)
        return function, ir.IRBuilder(function.append_basic_block("entry"))

    def _tile(self, function: ir.Function, builder: ir.IRBuilder, rows: int, vectors: int,
              masks: list[Any] | None, side: int = 0) -> None:
        """The K loop of a ``rows × vectors`` tile from the builder's block (and ``side``
        columns after them, `_tile_loop`), then its stores; the builder ends in a block after
        them. One loop prefetching B, one prefetching A, chosen by which offset the part
        passes (not 0), so no step tests it."""
        b_ahead = function.args[RESIDUAL + 2]
        streams_b = function.append_basic_block("streams_b")
        streams_a = function.append_basic_block("streams_a")
        after = function.append_basic_block("after")
        builder.cbranch(builder.icmp_signed("!=", b_ahead, I64(0)), streams_b, streams_a)
        for block, stream in ((streams_b, "b"), (streams_a, "a")):
            builder.position_at_end(block)
            self._tile_loop(function, builder, rows, vectors, masks, stream, side=side)
            builder.branch(after)
        builder.position_at_end(after)

    def _tile_loop(self, function: ir.Function, builder: ir.IRBuilder, rows: int,
                   vectors: int, masks: list[Any] | None, stream: str,
                   a_strides: tuple[Any, Any] | None = None, side: int = 0) -> None:
        """`_tile`'s loop and stores, prefetching operand ``stream`` ("a" or "b"; neither
        where `k_loop_streams` leaves it out); A's row and column strides ``a_strides`` where given
        (constants), else the arguments'.

        ``side``: that many columns after the ``vectors`` whole ones, each summed in a vector
        of its own with the tile's rows in its lanes (A's rows one float apart: per step one
        load of A's column and a broadcast of B's element per column), then laid in a row's
        last vector for the epilogue. A whole vector holding them would sum every row over
        all its lanes: at 7² (49 columns, a panel of 32 and one of 17) the tile's second
        panel took as long as its first. Each lane adds the same products in the same order
        as a row's vector would, so the sums are the same to the bit."""
        k_count, a, lda, acs, b, ldb = function.args[:6]
        if a_strides is not None:
            lda, acs = a_strides
        a_ahead, b_ahead, b_next = function.args[RESIDUAL + 1:B_NEXT + 1]
        start = builder.block
        loop = function.append_basic_block("loop")
        done = function.append_basic_block("done")
        row_offsets = [builder.mul(I64(i), lda) for i in range(rows)]
        builder.cbranch(builder.icmp_signed(">", k_count, I64(0)), loop, done)

        builder.position_at_end(loop)
        k = builder.phi(I64)
        tile = [[builder.phi(self.vector) for _ in range(vectors)] for _ in range(rows)]
        columns = [builder.phi(self.vector) for _ in range(side)]
        b_row = builder.gep(b, [builder.mul(k, ldb)])
        b_values = [self._load(builder, b_row, j, masks) for j in range(vectors)]
        a_column = builder.mul(k, acs)
        if stream not in self.k_loop_streams:
            stream = "neither"
        if stream == "b":
            self._prefetch_row(builder, builder.gep(b_row, [b_ahead]))
            self._prefetch_row(builder, builder.gep(b_row, [b_next]), IN_L2)
        elif stream == "a":
            self._prefetch(builder, builder.gep(builder.gep(a, [a_column]), [a_ahead]))
            self._prefetch_row(builder, builder.gep(b_row, [b_next]))
        stepped = []
        for i in range(rows):
            scalar = builder.load(builder.gep(a, [builder.add(row_offsets[i], a_column)]),
                                  align=4)
            broadcast = self._splat(builder, scalar)
            stepped.append([self._multiply_add(builder, broadcast, b_values[j], tile[i][j])
                            for j in range(vectors)])
        if side:
            lanes = ir.Constant(ir.VectorType(I1, self.shape.width),
                                [lane < rows for lane in range(self.shape.width)])
            a_rows = builder.call(self.masked_load, [
                self._vector_at(builder, builder.gep(a, [a_column]), I64(0)), I32(4), lanes,
                self.zero])
            first = vectors * self.shape.width
            stepped_columns = [self._multiply_add(builder, a_rows, self._splat(
                builder, builder.load(builder.gep(b_row, [I64(first + j)]), align=4)),
                columns[j]) for j in range(side)]
        k_next = builder.add(k, I64(1))
        latch = builder.block
        builder.cbranch(builder.icmp_signed("<", k_next, k_count), loop, done)
        k.add_incoming(I64(0), start)
        k.add_incoming(k_next, latch)
        for i in range(rows):
            for j in range(vectors):
                tile[i][j].add_incoming(self.zero, start)
                tile[i][j].add_incoming(stepped[i][j], latch)
        for j in range(side):
            columns[j].add_incoming(self.zero, start)
            columns[j].add_incoming(stepped_columns[j], latch)

        builder.position_at_end(done)

        def summed(after: Any) -> Any:
            value = builder.phi(self.vector)
            value.add_incoming(self.zero, start)
            value.add_incoming(after, latch)
            return value

        results = [[summed(stepped[i][j]) for j in range(vectors)] for i in range(rows)]
        if side:
            sums = [summed(after) for after in stepped_columns]
            for i, row in enumerate(results):
                last = self.zero
                for j, column in enumerate(sums):
                    last = builder.insert_element(
                        last, builder.extract_element(column, I32(i)), I32(j))
                row.append(last)
            vectors += 1
        terms = self._epilogue_terms(function, builder, vectors, masks)
        self._either_epilogue(
            function, builder, terms, rows, vectors,
            lambda adding: self._store_tile(builder, terms, results, masks, adding))

    def _store_tile(self, builder: ir.IRBuilder, terms: dict[str, Any], results: list[list[Any]],
                    masks: list[Any] | None, adding: bool) -> None:
        """The tile's sums (``results[i][j]``: vector ``j`` of row ``i``) through the
        epilogue, row by row (a subclass may store rows in pairs: `gemm_preact_ir`)."""
        for i, values in enumerate(results):
            row_shift = self._row_shift(builder, terms, I64(i))
            for j, value in enumerate(values):
                self._finish(builder, terms, I64(i), row_shift, value, j, masks, adding)

    def _epilogue_terms(self, function: ir.Function, builder: ir.IRBuilder, vectors: int,
                        masks: list[Any] | None) -> dict[str, Any]:
        """What the epilogue reads once per tile: the bias per column (one vector per
        vector of a row), the bounds splat, whether a residual is added (a tile without
        one gets C's own address as the residual's, and never reads it)."""
        c, bias_columns, low, high, residual = (function.args[index]
                                                for index in (6, *range(9, RESIDUAL + 1)))
        present = builder.icmp_unsigned("!=", builder.ptrtoint(residual, I64),
                                        builder.ptrtoint(c, I64))
        return {"c": c, "ldc": function.args[7], "rows": function.args[8],
                "residual": residual, "present": present,
                "shifts": [self._load(builder, bias_columns, j, masks) for j in range(vectors)],
                "low": self._splat(builder, low), "high": self._splat(builder, high)}

    def _either_epilogue(self, function: ir.Function, builder: ir.IRBuilder,
                         terms: dict[str, Any], rows: Any, vectors: int,
                         store: Any) -> None:
        """``store(adding)``'s stores of the tile built twice, with the residual's loads
        and without, one test per tile choosing: a tile adding none stores as it would
        with no residual in the kernel at all (loads masked off whole at a null pointer's
        page cost a microcode assist each: the float32 kernel ran 3× slower)."""
        with builder.if_else(terms["present"]) as (adding, plain):
            with adding:
                self._prefetch_residual(function, builder, terms, rows, vectors)
                store(True)
            with plain:
                store(False)

    def _row_shift(self, builder: ir.IRBuilder, terms: dict[str, Any], row: Any) -> Any:
        """Row ``row``'s bias, splat."""
        return self._splat(builder, builder.load(builder.gep(terms["rows"], [row]), align=4))

    def _finish(self, builder: ir.IRBuilder, terms: dict[str, Any], row: Any, row_shift: Any,
                value: Any, j: int, masks: list[Any] | None, adding: bool) -> None:
        """The epilogue of vector ``j`` of row ``row``'s sums: its biases, the residual
        where ``adding``, the clamp, the store."""
        value = builder.fadd(builder.fadd(value, row_shift), terms["shifts"][j])
        line = builder.mul(row, terms["ldc"])
        if adding:
            value, offset, mask = self._placed(builder, value, j, masks)
            value = self._clamp(builder, terms, self._plus_residual(
                builder, terms, line, offset, mask, value))
        else:
            value, offset, mask = self._placed(builder, self._clamp(builder, terms, value), j,
                                               masks)
        target = self._vector_at(builder, builder.gep(terms["c"], [line]), offset)
        if mask is None:
            builder.store(value, target, align=4)
        else:
            builder.call(self.masked_store, [value, target, I32(4), mask])

    @staticmethod
    def _clamp(builder: ir.IRBuilder, terms: dict[str, Any], value: Any) -> Any:
        """``value`` within the bounds (NaN kept: a comparison with NaN is false)."""
        value = builder.select(builder.fcmp_ordered("<", value, terms["low"]), terms["low"],
                               value)
        return builder.select(builder.fcmp_ordered(">", value, terms["high"]), terms["high"],
                              value)

    def _prefetch_residual(self, function: ir.Function, builder: ir.IRBuilder,
                           terms: dict[str, Any], rows: Any, vectors: int) -> None:
        """Each of the tile's ``rows`` rows of the residual asked for (the lines under each
        vector of the row), before the epilogue's first store. Read
        as each row is stored, its loads wait behind the stores before them: ResNet-18's
        64-filter direct convolution at 56² took longer than with the add a pass of its
        own."""
        count = rows if isinstance(rows, ir.Value) else I64(rows)
        start = builder.block
        body = function.append_basic_block("ask_residual")
        asked = function.append_basic_block("asked_residual")
        builder.cbranch(builder.icmp_signed(">", count, I64(0)), body, asked)
        builder.position_at_end(body)
        row = builder.phi(I64)
        line = builder.gep(terms["residual"], [builder.mul(row, terms["ldc"])])
        for j in range(vectors):
            first = builder.gep(line, [self._offset(builder, j)])
            for floats in (0, self.shape.width - 1):
                self._prefetch(builder, builder.gep(first, [I64(floats)]))
        following = builder.add(row, I64(1))
        row.add_incoming(I64(0), start)
        row.add_incoming(following, builder.block)
        builder.cbranch(builder.icmp_signed("<", following, count), body, asked)
        builder.position_at_end(asked)

    def _ask_lines(self, builder: ir.IRBuilder, c: Any, ldc: Any, residual: Any, rows: int,
                   vectors: int) -> None:
        """The lines of ``rows`` rows of C from ``c`` (``ldc`` floats a row) under
        ``vectors`` vectors, asked for writing, and the residual's at ``residual`` (laid as
        C) for reading."""
        for i in range(rows):
            line = builder.mul(I64(i), ldc)
            for j in range(vectors):
                offset = self._offset(builder, j)
                for base, write in ((c, 1), (residual, 0)):
                    first = builder.gep(builder.gep(base, [line]), [offset])
                    for floats in (0, self.shape.width - 1):
                        builder.call(self.prefetch, [builder.gep(first, [I64(floats)]),
                                                     I32(write), I32(3), I32(1)])

    def _offset(self, builder: ir.IRBuilder, j: int) -> Any:
        """The row offset of vector ``j``'s first stored element (see `_placed`)."""
        return I64(j * self.shape.width)

    def _plus_residual(self, builder: ir.IRBuilder, terms: dict[str, Any], line: Any,
                       offset: Any, mask: Any, value: Any) -> Any:
        """``value`` plus the residual's vector at row offset ``line`` and column ``offset``
        (under ``mask`` where the tile's edge cuts it)."""
        residual_at = self._vector_at(builder, builder.gep(terms["residual"], [line]), offset)
        if mask is None:
            return builder.fadd(value, builder.load(residual_at, align=4))
        return builder.fadd(value, builder.call(
            self.masked_load, [residual_at, I32(4), mask, self.zero]))

    def _placed(self, builder: ir.IRBuilder, value: Any, j: int,
                masks: list[Any] | None) -> tuple[Any, Any, Any]:
        """Where vector ``j`` of a row's results goes: (the values, their first element's
        offset in the row, the lanes stored or None for all); here vector ``j`` of the row
        as it is (a subclass may move lanes: `conv_amx_ir`)."""
        return value, self._offset(builder, j), None if masks is None else masks[j]

    def _vector_at(self, builder: ir.IRBuilder, row: Any, offset: Any) -> Any:
        return builder.bitcast(builder.gep(row, [offset]), self.vector.as_pointer())

    def _prefetch_row(self, builder: ir.IRBuilder, row: Any, locality: int = 3) -> None:
        """Each line of a tile's row of B from ``row`` (A's column, MR floats of a packed
        block, is under a line: one prefetch)."""
        for line in range(-(-self.shape.columns * 4 // LINE_BYTES)):
            self._prefetch(builder, builder.gep(row, [I64(line * LINE_BYTES // 4)]), locality)

    def _prefetch(self, builder: ir.IRBuilder, address: Any, locality: int = 3) -> None:
        # A read (0), kept in every level of cache (3), of data (1): prefetcht0 on x86.
        builder.call(self.prefetch, [address, I32(0), I32(locality), I32(1)])

    def _multiply_add(self, builder: ir.IRBuilder, broadcast: Any, b_value: Any,
                      sum_: Any) -> Any:
        """``sum_ + broadcast * b_value``, one step of the K loop (a subclass may read the
        same registers as other types: `gemm_bf16_ir`)."""
        return builder.call(self.fmuladd, [broadcast, b_value, sum_])

    def _masks(self, builder: ir.IRBuilder, columns: Any, vectors: int) -> list[Any]:
        """Per vector of a row, the lanes below ``columns``."""
        width = self.shape.width
        lanes = ir.VectorType(I64, width)
        limit = builder.insert_element(ir.Constant(lanes, ir.Undefined), columns, I32(0))
        limit = builder.shuffle_vector(limit, ir.Constant(lanes, ir.Undefined),
                                       ir.Constant(ir.VectorType(I32, width), [0] * width))
        return [builder.icmp_signed("<", ir.Constant(lanes, list(range(j * width,
                                                                        (j + 1) * width))),
                                    limit)
                for j in range(vectors)]

    def _splat(self, builder: ir.IRBuilder, scalar: Any) -> Any:
        undefined = ir.Constant(self.vector, ir.Undefined)
        single = builder.insert_element(undefined, scalar, I32(0))
        return builder.shuffle_vector(single, undefined,
                                      ir.Constant(ir.VectorType(I32, self.shape.width),
                                                  [0] * self.shape.width))

    def _address(self, builder: ir.IRBuilder, row: Any, j: int) -> Any:
        element = builder.gep(row, [I64(j * self.shape.width)])
        return builder.bitcast(element, self.vector.as_pointer())

    def _load(self, builder: ir.IRBuilder, row: Any, j: int, masks: list[Any] | None) -> Any:
        address = self._address(builder, row, j)
        if masks is None:
            return builder.load(address, align=4)
        return builder.call(self.masked_load, [address, I32(4), masks[j], self.zero])



class NarrowEdgeTileKernel(TileKernel):
    """The float32 `TileKernel`, whose edge tiles of a few columns (up to half a vector,
    `_narrow_columns`) over an A with unit row step (a packed A, or a transposed product's
    activation) keep their sums a column to a vector, the tile's rows in its lanes: per
    step of K one load of A's column, one broadcast of B per column and one multiply-add
    per column. The row-wise edge reads a broadcast per row for one vector of mostly idle
    lanes: over N = 196 (6 panels of 32, then 4 columns) the last 4 columns took about as
    long as a full panel (384 × 64 × 4 alone 8.0 µs, now 5.1; 384 × 64 × 32 11.8)."""

    # A product adding a residual to a large C asks for its tiles' lines
    # (`ASKS_MIN_C_BYTES`). Every tile asking as it starts, whatever its product, read
    # (asking ÷ not, one Zen 4 core, float32 at batch 1) ResNet-18 0.989 (its stem and its
    # 56² Winograd products 0.91-0.97, its 28² and 14² ones 1.02-1.05), ResNet-50 v2 0.989
    # and MobileNet v2 1.028; every product with a C of 1 MB or more asking, ResNet-18 1.012,
    # ResNet-50 v2 1.006 and MobileNet v2 0.999.
    asks_large_c = True

    # One Zen 4 core, float32 at batch 1 (`bench/variants.py`), keeping every column in
    # whole vectors (the 1×1 layers at 7² then run transposed, `gemm_bind.worthwhile`)
    # against this: MobileNet v2's 1×1 layers at 7² 1.08-1.45×, its nodes summed 1.035×;
    # ResNet-50 v2's at 7² 1.10-1.40×; ResNet-18's 3×3 layers at 28² 1.11-1.17× and
    # into 7² 1.13×, its shortcut at 7² 1.31-1.34×, its nodes summed 1.015-1.035×.
    side_columns = 4

    def _narrow_columns(self) -> int:
        # The tile's rows must fit in one vector's lanes (not NEON's 6 rows by 4 lanes).
        return self.shape.width // 2 if self.shape.rows <= self.shape.width else 0

    def _column_tile(self, function: ir.Function, builder: ir.IRBuilder, columns: int,
                     rows: Any) -> None:
        """The K loop and stores of the first ``rows`` rows (an i64 up to the tile's) and
        ``columns`` columns of a tile, a vector per column; the builder ends after them."""
        k_count, a, _, acs, b, ldb = function.args[:6]
        a_ahead, b_ahead = function.args[RESIDUAL + 1:RESIDUAL + 3]
        lanes = self._masks(builder, rows, 1)[0]
        start = builder.block
        loop = function.append_basic_block("column_loop")
        done = function.append_basic_block("column_done")
        builder.cbranch(builder.icmp_signed(">", k_count, I64(0)), loop, done)

        builder.position_at_end(loop)
        k = builder.phi(I64)
        sums = [builder.phi(self.vector) for _ in range(columns)]
        a_column = builder.gep(a, [builder.mul(k, acs)])
        b_row = builder.gep(b, [builder.mul(k, ldb)])
        # Only the operand streamed has an offset (the other is 0: this step's own line).
        self._prefetch(builder, builder.gep(a_column, [a_ahead]))
        self._prefetch(builder, builder.gep(b_row, [b_ahead]))
        a_values = builder.call(self.masked_load, [self._vector_at(builder, a_column, I64(0)),
                                                   I32(4), lanes, self.zero])
        stepped = [self._multiply_add(
            builder, a_values, self._splat(builder, builder.load(
                builder.gep(b_row, [I64(j)]), align=4)), sums[j]) for j in range(columns)]
        k_next = builder.add(k, I64(1))
        latch = builder.block
        builder.cbranch(builder.icmp_signed("<", k_next, k_count), loop, done)
        k.add_incoming(I64(0), start)
        k.add_incoming(k_next, latch)
        for total, after in zip(sums, stepped):
            total.add_incoming(self.zero, start)
            total.add_incoming(after, latch)

        builder.position_at_end(done)
        results = []
        for after in stepped:
            value = builder.phi(self.vector)
            value.add_incoming(self.zero, start)
            value.add_incoming(after, latch)
            results.append(value)
        self._column_epilogue(function, builder, results, rows, lanes)

    def _column_epilogue(self, function: ir.Function, builder: ir.IRBuilder,
                         results: list[Any], rows: Any, lanes: Any) -> None:
        """`_finish`'s terms in its order for sums held a column to a vector: the biases
        as vectors, then element by element of each row the residual (where there is
        one), the clamp and the store."""
        c, ldc, bias_rows, bias_columns, low, high, residual = (
            function.args[index] for index in (6, 7, 8, 9, 10, 11, RESIDUAL))
        row_shift = builder.call(self.masked_load, [
            self._vector_at(builder, bias_rows, I64(0)), I32(4), lanes, self.zero])
        shifted = [builder.fadd(builder.fadd(value, row_shift), self._splat(
            builder, builder.load(builder.gep(bias_columns, [I64(j)]), align=4)))
            for j, value in enumerate(results)]
        present = builder.icmp_unsigned("!=", builder.ptrtoint(residual, I64),
                                        builder.ptrtoint(c, I64))
        start = builder.block
        body = function.append_basic_block("column_store")
        stored = function.append_basic_block("column_stored")
        builder.cbranch(builder.icmp_signed(">", rows, I64(0)), body, stored)
        builder.position_at_end(body)
        row = builder.phi(I64)
        line = builder.mul(row, ldc)
        for j, value in enumerate(shifted):
            at = builder.add(line, I64(j))
            element = builder.extract_element(value, row)
            # With no residual its pointer is C's own tile: a load there is in bounds, and
            # the select drops what it read.
            added = builder.fadd(element, builder.load(builder.gep(residual, [at]), align=4))
            element = builder.select(present, added, element)
            builder.store(self._scalar_clamp(builder, element, low, high),
                          builder.gep(c, [at]), align=4)
        following = builder.add(row, I64(1))
        row.add_incoming(I64(0), start)
        row.add_incoming(following, builder.block)
        builder.cbranch(builder.icmp_signed("<", following, rows), body, stored)
        builder.position_at_end(stored)

    @staticmethod
    def _scalar_clamp(builder: ir.IRBuilder, value: Any, low: Any, high: Any) -> Any:
        """`_clamp` of one float."""
        value = builder.select(builder.fcmp_ordered("<", value, low), low, value)
        return builder.select(builder.fcmp_ordered(">", value, high), high, value)
