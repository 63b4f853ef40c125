"""VNNI's int8 tiles (`gemm_int8_ir`) with the requantize in their epilogue: each tile's int32
sums, made in registers, are stored to a buffer on the stack (in L1) and requantized from
there into the layer's channels-last bytes (`int8_epilogue_ir.BlockRequantize`) before the
next tile runs. No sums reach memory and no requantize pass reads them back: where a layer's
K is short (MobileNet v2's expansions, 16 and 24 channels in), that pass and the sums'
traffic were most of its time.

``fused(a, lda, b, groups, terms, factors, offsets, row_blocks, first, last, first_row)``:
column panels ``[first, last)`` of ``row_blocks`` blocks of the tile's rows, each block's
panels in turn, the block's sum rows numbered from ``first_row``; ``a``, ``lda`` as the tile
reads them (rows, or a table of rows' addresses with ``lda`` the groups' offsets), ``b``,
``groups`` and ``offsets`` as in ``panels``; ``terms`` and ``factors`` the requantize's
(`int8_conv.FusedConv._epilogue_terms`). The task's context is ``[a, lda, b, groups, terms,
factors, offsets, row_blocks, panel_count]``: where the terms ask for rows first
a part takes a run of row blocks, every panel of each, else a run of the (panel, row
block) tiles (`int8_epilogue_ir.for_each_share`).

`RunsFusedInt8Kernel` is the same over tiles of two runs of 7 output pixels, leaving out
the taps of windows in the padding (`run_taps_ir`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import llvmlite.ir as ir

from engine.kernels import run_taps_ir
from engine.kernels.gemm_int8_ir import I8, I32, I64, LANES, Int8Kernel
from engine.kernels.int8_epilogue_ir import F32, BlockRequantize, for_each_share
from engine.kernels.task_ir import loop

REQUANTIZED_COLUMNS = 32  # the columns one call of the requantize takes (two vectors)
CONTEXT = 9  # int64 fields of the task's context
RUNS_CONTEXT = CONTEXT + 6  # and `RunsFusedInt8Kernel`'s


class FusedInt8Kernel(Int8Kernel):
    """A module holding ``fused`` for tiles of ``rows`` by ``vectors`` zmm vectors, and its
    `spin_pool` task ``task``; ``table``: rows read where a table points (`Int8Kernel`)."""

    context_fields = CONTEXT  # the task's context words

    def __init__(self, rows: int, vectors: int, table: bool = False) -> None:
        super().__init__(rows, vectors, table)
        self.requantize = BlockRequantize(self.module).function
        self.fused = self._define_fused()
        self.task = self._define_task()

    def _define_fused(self) -> ir.Function:
        byte, word, wide = I8.as_pointer(), I32.as_pointer(), I64.as_pointer()
        kind = ir.FunctionType(ir.VoidType(), [byte, I64, byte, I64, wide, F32.as_pointer(),
                                               word, I64, I64, I64, I64])
        function = ir.Function(self.module, kind, name="fused")
        function.linkage = "internal"
        (a, lda, b, groups, terms, factors, offsets, row_blocks, first, last,
         first_row) = function.args
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        columns = self.columns
        buffer = builder.alloca(ir.ArrayType(I32, self.rows * columns))
        buffer.align = 64
        buffer = builder.bitcast(buffer, word)
        panel_bytes = builder.mul(groups, I64(columns * 4))
        group_offsets = self.group_offsets(builder, lda)
        with loop(builder, function, I64(0), row_blocks, "block") as block:
            row = builder.mul(block, I64(self.rows))
            a_rows = self.rows_at(builder, a, lda, row)
            with loop(builder, function, first, last, "panel") as panel:
                sums = self._tile(function, builder, a_rows,
                                  builder.gep(b, [builder.mul(panel, panel_bytes)]), groups,
                                  group_offsets)
                for i in range(self.rows):
                    for j in range(self.vectors):
                        target = builder.gep(buffer, [I64(i * columns + j * LANES)])
                        builder.store(sums[i][j], builder.bitcast(
                            target, self.vector.as_pointer()), align=64)
                column = builder.mul(panel, I64(columns))
                for part in range(max(1, columns // REQUANTIZED_COLUMNS)):
                    at = builder.add(column, I64(part * REQUANTIZED_COLUMNS))
                    # a 16-column panel's second vector lies past every filter: the
                    # requantize leaves it alone, so its offsets are the first's again
                    shifts = [builder.load(builder.bitcast(builder.gep(offsets, [
                        builder.add(at, I64(min(half, self.vectors - 1) * LANES))]),
                        self.vector.as_pointer()), align=4) for half in range(2)]
                    builder.call(self.requantize, [
                        builder.gep(buffer, [I64(part * REQUANTIZED_COLUMNS)]), I64(columns),
                        at, builder.add(first_row, row), I64(self.rows), terms, factors,
                        *shifts])
        builder.ret_void()
        return function

    def _define_task(self) -> ir.Function:
        wide = I64.as_pointer()
        function = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [wide, I64, I64]),
                               name="task")
        context, part, parts = function.args
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        words = [builder.load(builder.gep(context, [I64(index)]))
                 for index in range(self.context_fields)]
        (a, lda, b, groups, terms, factors, offsets, row_blocks, panels) = words[:CONTEXT]
        byte = I8.as_pointer()
        a, b = builder.inttoptr(a, byte), builder.inttoptr(b, byte)
        terms = builder.inttoptr(terms, wide)
        factors = builder.inttoptr(factors, F32.as_pointer())
        offsets = builder.inttoptr(offsets, I32.as_pointer())
        row_bytes = I64(8 * self.rows) if self.table else builder.mul(lda, I64(self.rows))
        more = self._more_arguments(builder, words[CONTEXT:])

        def call(panel: ir.Value, block: ir.Value, count: ir.Value,
                 panel_end: ir.Value | None = None) -> None:
            builder.call(self.fused, [
                builder.gep(a, [builder.mul(block, row_bytes)]), lda, b, groups, terms,
                factors, offsets, count, panel, panel_end or builder.add(panel, I64(1)),
                builder.mul(block, I64(self.rows)), *more])

        for_each_share(builder, function, terms, row_blocks, panels, part, parts, call)
        builder.ret_void()
        return function

    def _more_arguments(self, builder: ir.IRBuilder, words: list[Any]) -> list[Any]:
        """``fused``'s arguments past `FusedInt8Kernel`'s, from the context's words past
        `CONTEXT`: none."""
        return []


class RunsFusedInt8Kernel(FusedInt8Kernel):
    """`FusedInt8Kernel` over runs of output pixels, computing no tap of a pixel whose window
    reads the padding (`run_taps_ir`): a tile is two runs of `run_taps_ir.SEGMENT` output
    positions (each within an output row, the table's rows in order) by `HALF` vectors of a
    panel of ``vectors`` (2 or 4; a 4-vector panel in two halves), read where the table
    points, each tap's K groups over the pixels whose window reads inside the image at it.
    The padding's bytes are zeros (uint8 data), so the sums are the same.

    ``fused`` takes, after `FusedInt8Kernel`'s arguments, the tap table
    (`border_taps.tap_bounds`), the output's width, its positions an image, the K groups a
    tap, the rows in all (rows past them compute nothing) and the bytes from one window of a
    run to the next (the stride times the channels): a run's windows are read from its
    first's address in the table, not each from its own. The task's context goes on with
    those six."""

    HALF = 2  # vectors a tile: 28 accumulators, two weight vectors and a broadcast
    context_fields = RUNS_CONTEXT

    def __init__(self, vectors: int) -> None:
        if vectors % self.HALF:
            raise ValueError(f"run tiles take panels of 2 or 4 vectors; got {vectors}")
        super().__init__(2 * run_taps_ir.SEGMENT, vectors, table=True)

    def _define_fused(self) -> ir.Function:
        byte, word, wide = I8.as_pointer(), I32.as_pointer(), I64.as_pointer()
        kind = ir.FunctionType(ir.VoidType(), [byte, I64, byte, I64, wide, F32.as_pointer(),
                                               word, I64, I64, I64, I64, wide, I64, I64, I64,
                                               I64, I64])
        function = ir.Function(self.module, kind, name="fused")
        function.linkage = "internal"
        (a, lda, b, groups, terms, factors, offsets, row_blocks, first, last, first_row,
         bounds, width, positions, tap_groups, total, step) = function.args
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        half_columns = self.HALF * LANES
        buffer = builder.alloca(ir.ArrayType(I32, self.rows * half_columns))
        buffer.align = 64
        buffer = builder.bitcast(buffer, word)
        sums = builder.alloca(ir.ArrayType(self.vector, self.rows * self.HALF))
        cells = [builder.gep(sums, [I32(0), I32(index)])
                 for index in range(self.rows * self.HALF)]
        panel_bytes = builder.mul(groups, I64(self.columns * 4))
        group_offsets = self.group_offsets(builder, lda)
        taps = builder.sdiv(groups, tap_groups)
        with loop(builder, function, I64(0), row_blocks, "block") as block:
            row = builder.mul(block, I64(self.rows))
            # each run's first window (the table's), the others ``step`` bytes apart
            addresses = builder.bitcast(a, I64.as_pointer())
            starts = [builder.inttoptr(builder.load(builder.gep(addresses, [
                builder.add(row, I64(k * run_taps_ir.SEGMENT))])), I8.as_pointer())
                for k in range(2)]
            runs = []
            for k in range(2):
                position = builder.add(builder.add(first_row, row),
                                       I64(k * run_taps_ir.SEGMENT))
                within = builder.srem(position, positions)
                y = builder.sdiv(within, width)
                runs.append((builder.select(builder.icmp_signed("<", position, total), y,
                                            I64(-1)),
                             builder.sub(within, builder.mul(y, width))))
            with loop(builder, function, first, last, "panel") as panel:
                for half in range(self.vectors // self.HALF):
                    for cell in cells:
                        builder.store(self.zero, cell)
                    b_half = builder.gep(b, [builder.add(builder.mul(panel, panel_bytes),
                                                         I64(half * half_columns * 4))])
                    with loop(builder, function, I64(0), taps, "tap") as tap:
                        run_taps_ir.each_variant(
                            builder, function, run_taps_ir.variant(builder, bounds, tap, runs),
                            2, partial(self._tap_steps, builder, function,
                                       (b_half, group_offsets, starts, step, tap, tap_groups),
                                       cells=cells))
                    for index, cell in enumerate(cells):
                        builder.store(builder.load(cell), builder.bitcast(
                            builder.gep(buffer, [I64(index * LANES)]),
                            self.vector.as_pointer()), align=64)
                    at = builder.add(builder.mul(panel, I64(self.columns)),
                                     I64(half * half_columns))
                    shifts = [builder.load(builder.bitcast(builder.gep(offsets, [
                        builder.add(at, I64(j * LANES))]), self.vector.as_pointer()), align=4)
                        for j in range(self.HALF)]
                    builder.call(self.requantize, [
                        buffer, I64(half_columns), at, builder.add(first_row, row),
                        I64(self.rows), terms, factors, *shifts])
        builder.ret_void()
        return function

    def _tap_steps(self, builder: ir.IRBuilder, function: ir.Function,
                   operands: tuple[Any, ...], rows: list[int], *, cells: list[Any]) -> None:
        """A tap's K groups for the tile's ``rows`` (by their place in it): each group's
        two weight vectors of the half panel and each row's four bytes broadcast, one
        ``vpdpbusd`` a row and vector; a row's window lies its place in the run times
        ``step`` bytes on from the run's first."""
        b_half, group_offsets, starts, step, tap, tap_groups = operands
        start = builder.mul(tap, tap_groups)
        with loop(builder, function, start, builder.add(start, tap_groups), "group") as group:
            b_values = self._group_weights(builder, b_half, group, self.HALF)
            offset = builder.load(builder.gep(group_offsets, [group]))
            bases = [builder.gep(start, [offset]) for start in starts]
            for i in rows:
                run, place = divmod(i, run_taps_ir.SEGMENT)
                word = builder.load(builder.bitcast(builder.gep(bases[run], [
                    builder.mul(step, I64(place))]), I32.as_pointer()), align=1)
                broadcast = self._splat(builder, word)
                for j in range(self.HALF):
                    cell = cells[i * self.HALF + j]
                    builder.store(builder.call(self.dot, [builder.load(cell), broadcast,
                                                          b_values[j]]), cell)

    def _more_arguments(self, builder: ir.IRBuilder, words: list[Any]) -> list[Any]:
        """The tap table's pointer, then the output's width, its positions an image, the K
        groups a tap, the rows in all and the step from one window to the next."""
        bounds, *rest = words
        return [builder.inttoptr(bounds, I64.as_pointer()), *rest]
