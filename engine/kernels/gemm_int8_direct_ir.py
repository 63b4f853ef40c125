"""An AMX-INT8 convolution without a patch gather: `gemm_int8_amx_ir`'s tiles with their A
operand read straight from a padded channels-last image.

A tile of A is ``R`` consecutive output positions of one output row by 64 values of K. With
K ordered (kernel row, kernel column, channel) and the channels a multiple of 64, those 64
values are one channel block of one kernel tap, so the tile's rows are the same 64 bytes of
``R`` input pixels ``stride`` pixels apart: one ``tileloadd`` at the tap's address with a row
stride of ``stride · C`` bytes reads it where im2col would have copied it first. ``R``
divides the output's width (`gemm_int8.direct_tile_rows`), so a tile never crosses an output
row and the sums' rows are the output positions in order, as the gathered product's are.

``direct(image, row_stride, steps, b, groups, c, ldc, offsets, starts, row_blocks, first,
last, config, rows)``: column panels ``[first, last)`` of ``row_blocks`` blocks of ``2R`` rows;
``steps`` holds each K step's byte offset from a tile's first pixel (its tap and channel
block), ``starts`` each tile's first pixel's byte offset in ``image`` (two a block), and
``config`` the 64-byte tile configuration for ``R`` (`tile_configuration`); ``rows`` is
``R``. ``b``, ``c``, ``ldc`` and ``offsets`` are as in `gemm_int8_ir`'s ``panels``; ``c`` gets
``2R`` rows a block. Where the requantize is fused (``terms``), the sums go to two blocks' room
on the stack instead, never to ``c``, and each block is requantized while the next one's
products run.
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.gemm_amx_ir import declare_tile_intrinsics, release_tiles_at_returns
from engine.kernels.gemm_int8_ir import I8, I32, I64, LANES, for_each_run
from engine.kernels.int8_epilogue_ir import BlockRequantize, for_each_share
from engine.kernels.task_ir import loop

F32 = ir.FloatType()

COLUMNS, DEPTH = 32, 64  # a panel of C, and K per step
CONTEXT = 15  # int64 fields of a task's context
BUFFER_WORDS = 32 * COLUMNS  # a fused block's sums: up to 2 · 16 rows of a panel


def tile_configuration(rows: int) -> list[int]:
    """``ldtilecfg``'s 64 bytes for tiles of ``rows`` positions: C (0-3) and A (4, 5)
    ``rows`` × 64 bytes, B (6, 7) 16 × 64."""
    if not 1 <= rows <= 16:
        raise ValueError(f"an AMX tile holds 1 to 16 rows; got {rows}")
    config = [0] * 64
    config[0] = 1
    for tile in range(8):
        config[16 + 2 * tile] = 64
        config[48 + tile] = 16 if tile >= 6 else rows
    return config


class DirectInt8Kernel:
    """A module holding ``direct`` and its `spin_pool` task ``task``."""

    def __init__(self) -> None:
        self.module = ir.Module(name="hybridserve_conv_int8_direct")
        self.vector = ir.VectorType(I32, LANES)
        declare_tile_intrinsics(self, self.module, "llvm.x86.tdpbusd",
                                "amx_int8_direct_unused_configuration")
        self.requantize = BlockRequantize(self.module).function
        self.direct = self._define_direct()
        self.task = self._define_task()

    def _define_direct(self) -> ir.Function:
        byte, word, wide = I8.as_pointer(), I32.as_pointer(), I64.as_pointer()
        kind = ir.FunctionType(ir.VoidType(), [byte, I64, wide, byte, I64, word, I64, word,
                                               wide, I64, I64, I64, byte, I64, I64, wide,
                                               F32.as_pointer()])
        function = ir.Function(self.module, kind, name="direct")
        b, groups, ldc, offsets, row_blocks, first, last, config = (
            function.args[index] for index in (3, 4, 6, 7, 9, 10, 11, 12))
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        # two blocks' sums (2R ≤ 32 rows of a panel's 32 columns), alternately: the L1 lines
        # a fused block's tiles are stored to and requantized from
        buffer = builder.alloca(ir.ArrayType(I32, 2 * BUFFER_WORDS))
        buffer.align = 64
        buffer = builder.bitcast(buffer, I32.as_pointer())
        builder.call(self.load_config, [config])
        step_count = builder.sdiv(groups, I64(DEPTH // 4))
        panel_bytes = builder.mul(groups, I64(COLUMNS * 4))
        terms = function.args[15]
        fused = builder.icmp_unsigned("!=", builder.ptrtoint(terms, I64), I64(0))
        with builder.if_else(fused) as (requantized, summed):
            with requantized:
                self._fused_pairs(function, builder, step_count, panel_bytes, buffer)
            with summed, loop(builder, function, first, last, "panel") as panel:
                b_panel = builder.gep(b, [builder.mul(panel, panel_bytes)])
                column = builder.mul(panel, I64(COLUMNS))
                shifts = self._shifts(builder, offsets, column)
                with loop(builder, function, I64(0), row_blocks, "block") as block:
                    self._block(function, builder, block, column, b_panel, shifts,
                                step_count)
        builder.ret_void()
        return function

    def _shifts(self, builder: ir.IRBuilder, offsets: ir.Value, column: ir.Value) -> list[Any]:
        """The two vectors of column offsets of the panel from ``column``."""
        return [builder.load(builder.bitcast(
            builder.gep(offsets, [builder.add(column, I64(j * LANES))]),
            self.vector.as_pointer()), align=4) for j in range(2)]

    def _sum_tiles(self, function: ir.Function, builder: ir.IRBuilder, block: ir.Value,
                   b_panel: ir.Value, step_count: ir.Value) -> None:
        """Row block ``block``'s K steps on the tiles: its sums in tiles 0-3 (upper left,
        upper right, lower left, lower right)."""
        image, row_stride, steps, starts = (function.args[index] for index in (0, 1, 2, 8))
        upper = builder.gep(image, [builder.load(builder.gep(starts, [builder.mul(block,
                                                                                  I64(2))]))])
        lower = builder.gep(image, [builder.load(builder.gep(starts, [
            builder.add(builder.mul(block, I64(2)), I64(1))]))])
        for accumulator in range(4):
            builder.call(self.zero_tile, [I8(accumulator)])
        with loop(builder, function, I64(0), step_count, "k") as step:
            shift = builder.load(builder.gep(steps, [step]))
            b_run = builder.gep(b_panel, [builder.mul(step, I64(DEPTH * COLUMNS))])
            builder.call(self.load_tile, [I8(4), builder.gep(upper, [shift]), row_stride])
            builder.call(self.load_tile, [I8(5), builder.gep(lower, [shift]), row_stride])
            builder.call(self.load_tile, [I8(6), b_run, I64(COLUMNS * 4)])
            builder.call(self.load_tile, [I8(7), builder.gep(b_run, [I64(64)]),
                                          I64(COLUMNS * 4)])
            for accumulator, (left, right) in enumerate(((4, 6), (4, 7), (5, 6), (5, 7))):
                builder.call(self.dot, [I8(accumulator), I8(left), I8(right)])

    def _store_tiles(self, builder: ir.IRBuilder, corner: ir.Value, ldc: ir.Value) -> None:
        """Tiles 0-3 stored as the 2R × 32 sums at ``corner``, rows ``ldc`` int32 apart."""
        rows = builder.function.args[13]
        lower_corner = builder.gep(corner, [builder.mul(rows, ldc)])
        for accumulator, (base, across) in enumerate(((corner, 0), (corner, 16),
                                                      (lower_corner, 0), (lower_corner, 16))):
            target = builder.gep(base, [I64(across)])
            builder.call(self.store_tile, [I8(accumulator), builder.bitcast(
                target, I8.as_pointer()), builder.mul(ldc, I64(4))])

    def _fused_pairs(self, function: ir.Function, builder: ir.IRBuilder, step_count: ir.Value,
                     panel_bytes: ir.Value, buffer: ir.Value) -> None:
        """The (row block, panel) tiles of panels ``[first, last)``, each block's panels in
        turn, requantized one behind: a tile's products are issued, then the tile before's
        sums (in the buffer's other half) requantized while AMX multiplies, then the tile's
        sums stored to its half. The sums never reach C, two tiles' lines staying in L1
        (every tile stored to C took its lines from L2 first), and a block's output rows
        are whole before the next block's: panel by panel, each wrote half a line of every
        row of the output before the next panel wrote the other half."""
        b, offsets, row_blocks, first, last, rows, block_base, terms, factors = (
            function.args[index] for index in (3, 7, 9, 10, 11, 13, 14, 15, 16))
        panels = builder.sub(last, first)
        span = builder.mul(rows, I64(2))

        def place(pair: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
            """A tile's block, panel, and its half of the buffer."""
            block = builder.sdiv(pair, panels)
            panel = builder.add(first, builder.sub(pair, builder.mul(block, panels)))
            half = builder.gep(buffer, [builder.mul(builder.and_(pair, I64(1)),
                                                    I64(BUFFER_WORDS))])
            return block, panel, half

        def requantize(pair: ir.Value) -> None:
            block, panel, half = place(pair)
            column = builder.mul(panel, I64(COLUMNS))
            builder.call(self.requantize, [half, I64(COLUMNS), column, builder.mul(
                builder.add(block, block_base), span), span, terms, factors,
                *self._shifts(builder, offsets, column)])

        pairs = builder.mul(row_blocks, panels)
        with loop(builder, function, I64(0), pairs, "fused_tile") as pair:
            block, panel, half = place(pair)
            self._sum_tiles(function, builder, block,
                            builder.gep(b, [builder.mul(panel, panel_bytes)]), step_count)
            with builder.if_then(builder.icmp_signed(">", pair, I64(0))):
                requantize(builder.sub(pair, I64(1)))
            self._store_tiles(builder, half, I64(COLUMNS))
        with builder.if_then(builder.icmp_signed(">", pairs, I64(0))):
            requantize(builder.sub(pairs, I64(1)))

    def _block(self, function: ir.Function, builder: ir.IRBuilder, block: ir.Value,
               column: ir.Value, b_panel: ir.Value, shifts: list[ir.Value],
               step_count: ir.Value) -> None:
        """Row block ``block`` of ``direct``'s panel at ``column`` with no requantize: its K
        steps on the tiles, the sums stored to C with the column offsets added."""
        c, ldc, rows = (function.args[index] for index in (5, 6, 13))
        self._sum_tiles(function, builder, block, b_panel, step_count)
        first_row = builder.mul(block, builder.mul(rows, I64(2)))
        corner = builder.gep(c, [builder.add(builder.mul(first_row, ldc), column)])
        self._store_tiles(builder, corner, ldc)
        self._add_offsets(function, builder, corner, ldc, builder.mul(rows, I64(2)), shifts)

    def _add_offsets(self, function: ir.Function, builder: ir.IRBuilder, corner: ir.Value,
                     ldc: ir.Value, count: ir.Value, shifts: list[ir.Value]) -> None:
        """Each of the block's ``count`` rows of C gets the column offsets (signed data's
        compensation) added."""
        with loop(builder, function, I64(0), count, "offsets") as row:
            line = builder.gep(corner, [builder.mul(row, ldc)])
            for j in range(2):
                address = builder.bitcast(builder.gep(line, [I64(j * LANES)]),
                                          self.vector.as_pointer())
                builder.store(builder.add(builder.load(address, align=4), shifts[j]), address,
                              align=4)

    def _define_task(self) -> ir.Function:
        """``task(context, part, parts)``, context ``[image, row_stride, steps, b, groups, c,
        ldc, offsets, starts, row_blocks, panel_count, config, rows, terms, factors]``: the
        (panel, row block) tiles cut into ``parts`` runs as `gemm_int8_ir.define_task` cuts
        them; requantized (``terms`` set) where the terms ask for rows first, the row blocks
        cut into ``parts`` runs instead (a part may get none where there are fewer blocks than
        parts), each block's panels together."""
        wide = I64.as_pointer()
        function = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [wide, I64, I64]),
                               name="task")
        context, part, parts = function.args
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        fields = [builder.load(builder.gep(context, [I64(index)])) for index in range(CONTEXT)]
        (image, row_stride, steps, b, groups, c, ldc, offsets, starts, row_blocks, panels,
         config, rows, terms, factors) = fields
        byte = I8.as_pointer()
        image, b, config = (builder.inttoptr(value, byte) for value in (image, b, config))
        c = builder.inttoptr(c, I32.as_pointer())
        offsets = builder.inttoptr(offsets, I32.as_pointer())
        steps, starts, terms = (builder.inttoptr(value, wide)
                                for value in (steps, starts, terms))
        factors = builder.inttoptr(factors, F32.as_pointer())

        def call(panel: ir.Value, block: ir.Value, count: ir.Value,
                 panel_end: ir.Value | None = None) -> None:
            first_row = builder.mul(block, builder.mul(rows, I64(2)))
            builder.call(self.direct, [image, row_stride, steps, b, groups,
                                       builder.gep(c, [builder.mul(first_row, ldc)]), ldc,
                                       offsets, builder.gep(starts, [builder.mul(block, I64(2))]),
                                       count, panel, panel_end or builder.add(panel, I64(1)),
                                       config, rows, block, terms, factors])

        fused = builder.icmp_unsigned("!=", builder.ptrtoint(terms, I64), I64(0))
        with builder.if_else(fused) as (requantized, summed):
            with requantized:
                for_each_share(builder, function, terms, row_blocks, panels, part, parts, call)
            with summed:
                for_each_run(builder, function, row_blocks, panels, part, parts, call)
        builder.ret_void()
        release_tiles_at_returns(self, function)
        return function
