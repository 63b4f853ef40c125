"""The AVX2 form of `gemm_int8_ir`'s ``panels`` function, for hosts without AVX-512 VNNI: the
same arguments, the same packed weights and the same exact int32 sums, from ``vpmaddwd``.

``vpmaddwd`` multiplies sixteen pairs of int16 and adds each pair into one int32: with uint8
activations and int8 weights widened to int16 first, every product (at most 255 · 128 in
magnitude) and every pair sum is exact, and nothing saturates. (``vpmaddubsw``, which takes
the bytes as they are, sums its pairs into int16 with saturation: 255 · (-128) · 2 does not
fit, so it is exact only for narrower operands: `NarrowInt8Kernel` runs it on weights within
±63, where the engine quantizes them so.)

The packed weights (`gemm_int8.PackedWeights`) hold, per step of four K values, 64 bytes for
16 columns: each column's four K values together. Sign-extended to int16, 16 of those bytes
(four columns) fill a ymm register in that order, and ``vpmaddwd`` against the row's four
activations, zero-extended and repeated four times, sums K values 0-1 and 2-3 of each of the
four columns into two neighbouring int32 lanes. So the accumulators hold two partial sums a
column, added together once a tile's K loop ends (an even/odd shuffle), and a step of four K
values by 16 columns is four ``vpmaddwd`` and four ``vpaddd`` a row, the weights' widening
shared by the tile's rows.

A panel (16, 32 or 64 columns, as the weights were packed) is computed in strips of
`STRIP` columns, each its own K loop over the row block: a strip of 16 columns at 2 rows keeps
8 accumulators, 4 ymm of widened weights and the rows' activations in AVX2's sixteen ymm
registers (at 3 rows the tile spills), where VNNI's tiles span the panel in 32 zmm registers.
Where a panel has more than one strip, the row block's activations are widened once per
`CHUNK` groups into a buffer on the stack (32 bytes a row and group, in L1) that each strip
reads as it is, so that the strips do not each widen them again: on a Zen 3 core, 4–16% more
GOP/s for ResNet's products (`bench/int8_avx2.py`); a panel of one strip is faster without.
Each step prefetches its strip's weights `AHEAD_BYTES` on, as the VNNI kernel does.
"""

from __future__ import annotations

from collections.abc import Callable

import llvmlite.ir as ir

from engine.kernels.gemm_int8_ir import (
    AHEAD_BYTES,
    I8,
    I32,
    I64,
    LANES,
    PanelLoops,
    panels_function,
)
from engine.kernels.task_ir import loop

I16 = ir.IntType(16)
STRIP = 16  # columns a K loop computes: one 64-byte run of a step's weights
WORDS = ir.VectorType(I16, 16)  # one ymm of int16 operands
SUMS = ir.VectorType(I32, 8)  # one ymm of int32 accumulators
QUARTER = 16  # bytes of packed weights (4 columns × 4 K values) widened into one ymm
TAP_ENTRY = 4  # int64 of a row's entry in `NarrowInt8Kernel`'s taps mode
CHUNK = 128  # groups of four K values whose widened activations a row block buffers


class Avx2Int8Kernel:
    """A module holding ``panels`` for tiles of ``rows`` rows by a panel of ``vectors`` × 16
    columns, computed a ``strip`` (`STRIP` by default) at a time. ``buffered``: each row
    block's activations are widened and repeated once per `CHUNK` groups into a buffer on
    the stack that every strip reads, else each strip widens them itself; by default where a
    panel has more than one strip. ``wide``: the packed weights are stored as int16 (the
    same order, two bytes a weight), read without widening (`bench/int8_avx2.py` measures
    it: slower, as each row block reads twice the weight bytes from L2).

    One row (a classifier at batch 1, whose weights stream from memory) takes a strip of
    the whole panel, unbuffered (`gemm_int8` binds it so): its 16 accumulators and the
    widened weights spill, but the K loop walks the weights in the order they lie, each
    step asking for all its lines ahead; on a Zen 3 core, one thread, after 64 MB evicted,
    ResNet-50 v2's 2048 × 1000 classifier 236 → 172 µs, ResNet-18's 512 × 1000 81 → 66
    (medians of 60 calls)."""

    def __init__(self, rows: int, vectors: int, buffered: bool | None = None,
                 wide: bool = False, strip: int = STRIP) -> None:
        self.rows, self.vectors = rows, vectors
        self.strip = min(strip, vectors * LANES)
        self.wide = wide
        self.weight_bytes = 2 if wide else 1
        self.buffered = vectors * LANES > self.strip if buffered is None else buffered
        self.module = ir.Module(name="hybridserve_gemm_int8_avx2")
        self.zero = ir.Constant(SUMS, [0] * 8)
        self.pairs = ir.Function(self.module, ir.FunctionType(SUMS, [WORDS, WORDS]),
                                 name="llvm.x86.avx2.pmadd.wd")
        self.prefetch = ir.Function(self.module, ir.FunctionType(
            ir.VoidType(), [I8.as_pointer(), I32, I32, I32]), name="llvm.prefetch.p0")

    @property
    def columns(self) -> int:
        return self.vectors * LANES

    def define(self, name: str = "panels") -> ir.Function:
        function = panels_function(self.module, name)
        a, lda, _, groups, c, ldc, offsets, _, _, _ = function.args
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        buffer = None
        if self.buffered:
            buffer = builder.alloca(ir.ArrayType(WORDS, self.rows * CHUNK))
            buffer.align = 32
            buffer = builder.bitcast(buffer, WORDS.as_pointer())
        loops = PanelLoops(function, builder, self.columns, self.rows,
                           weight_bytes=self.weight_bytes)
        row, column = loops.row, loops.column
        a_rows = [builder.gep(a, [builder.mul(builder.add(row, I64(i)), lda)])
                  for i in range(self.rows)]
        c_rows = [builder.gep(c, [builder.add(builder.mul(builder.add(row, I64(i)), ldc),
                                              column)]) for i in range(self.rows)]
        if buffer is None:
            self._strips(function, builder, loops, c_rows, I64(0), groups, lambda group: [
                self._four_repeated(builder, builder.gep(a_row, [builder.mul(group, I64(4))]))
                for a_row in a_rows], first_chunk=None)
        else:
            self._chunks(function, builder, loops, a_rows, c_rows, buffer, groups)
        loops.close()
        return function

    def _chunks(self, function: ir.Function, builder: ir.IRBuilder, loops: PanelLoops,
                a_rows: list, c_rows: list, buffer: ir.Value, groups: ir.Value) -> None:
        """The row block's strips over K a `CHUNK` of groups at a time (at least one, so
        that K 0 still writes the offsets): the chunk's activations widened into ``buffer``,
        then each strip's sums added to what the chunks before stored."""
        start = builder.block
        chunk_loop = function.append_basic_block("chunk")
        builder.branch(chunk_loop)
        builder.position_at_end(chunk_loop)
        first = builder.phi(I64)
        first.add_incoming(I64(0), start)
        count = builder.sub(groups, first)
        count = builder.select(builder.icmp_signed("<", count, I64(CHUNK)), count, I64(CHUNK))
        self._widen(function, builder, a_rows, buffer, first, count)
        self._strips(function, builder, loops, c_rows, first, count, lambda group: [
            builder.load(builder.gep(buffer, [builder.add(I64(i * CHUNK), group)]), align=32)
            for i in range(self.rows)], first_chunk=builder.icmp_signed("==", first, I64(0)))
        following = builder.add(first, I64(CHUNK))
        first.add_incoming(following, builder.block)
        chunk_done = function.append_basic_block("chunk_done")
        builder.cbranch(builder.icmp_signed("<", following, groups), chunk_loop, chunk_done)
        builder.position_at_end(chunk_done)

    def _widen(self, function: ir.Function, builder: ir.IRBuilder, a_rows: list,
               buffer: ir.Value, first: ir.Value, count: ir.Value) -> None:
        """``buffer[i · CHUNK + g]``: row i's activations of group ``first + g``, widened and
        repeated (`_four_repeated`), for g in [0, count)."""
        with loop(builder, function, I64(0), count, "widen") as group:
            offset = builder.mul(builder.add(first, group), I64(4))
            for i, a_row in enumerate(a_rows):
                builder.store(self._four_repeated(builder, builder.gep(a_row, [offset])),
                              builder.gep(buffer, [builder.add(I64(i * CHUNK), group)]),
                              align=32)

    def _strips(self, function: ir.Function, builder: ir.IRBuilder, loops: PanelLoops,
                c_rows: list, first: ir.Value, count: ir.Value,
                activations: Callable[[ir.Value], list], first_chunk: ir.Value | None
                ) -> None:
        """Each strip's K loop over groups ``first + [0, count)`` (``activations(g)``: the
        rows' widened activations of the g-th), its sums stored into C with the offsets
        added where ``first_chunk`` is None or true, else added to C."""
        offsets, column = function.args[6], loops.column
        for strip in range(self.columns // self.strip):
            b_strip = builder.gep(loops.b_panel, [builder.add(
                builder.mul(first, I64(self.columns * 4 * self.weight_bytes)),
                I64(strip * self.strip * 4 * self.weight_bytes))])
            partial = self._strip(function, builder, activations, b_strip, count)
            for j in range(self.strip // 8):
                at = strip * self.strip + j * 8
                base = builder.load(builder.bitcast(
                    builder.gep(offsets, [builder.add(column, I64(at))]),
                    SUMS.as_pointer()), align=4)
                for i in range(self.rows):
                    sums = _column_sums(builder, partial[i][2 * j], partial[i][2 * j + 1])
                    target = builder.bitcast(builder.gep(c_rows[i], [I64(at)]),
                                             SUMS.as_pointer())
                    earlier = base
                    if first_chunk is not None:
                        earlier = builder.select(first_chunk, base,
                                                 builder.load(target, align=4))
                    builder.store(builder.add(sums, earlier), target, align=4)

    def _strip(self, function: ir.Function, builder: ir.IRBuilder,
               activations: Callable[[ir.Value], list], b_strip: ir.Value,
               groups: ir.Value) -> list[list[ir.Value]]:
        """The K loop of one strip from the builder's block; the builder ends after it, the
        tile's accumulators (``rows`` × 4, each two partial sums of four columns) returned
        as values there."""
        quarters = self.strip * 4 // QUARTER
        (start, loop, after), group, tile = self._open_k_loop(function, builder, groups, quarters)
        b_run = builder.gep(b_strip, [builder.mul(group, I64(self.columns * 4
                                                             * self.weight_bytes))])
        # a read (0), kept in every level of cache (3), of data (1): ``prefetcht0``, one a
        # cache line of the step's weights
        for line in range(self.strip * 4 * self.weight_bytes // 64):
            builder.call(self.prefetch, [builder.gep(b_run, [I64(AHEAD_BYTES + 64 * line)]),
                                         I32(0), I32(3), I32(1)])
        if self.wide:  # stored as int16 already
            weights = [builder.load(builder.bitcast(
                builder.gep(b_run, [I64(q * QUARTER * 2)]), WORDS.as_pointer()), align=1)
                for q in range(quarters)]
        else:
            weights = [builder.sext(builder.load(builder.bitcast(
                builder.gep(b_run, [I64(q * QUARTER)]), ir.VectorType(I8, 16).as_pointer()),
                align=1), WORDS) for q in range(quarters)]
        stepped = [[builder.add(tile[i][q], builder.call(self.pairs, [row, weights[q]]))
                    for q in range(quarters)]
                   for i, row in enumerate(activations(group))]
        return self._close_k_loop(builder, (start, loop, after), group, groups, tile, stepped)

    def _open_k_loop(self, function: ir.Function, builder: ir.IRBuilder, groups: ir.Value,
                     vectors: int) -> tuple[tuple[ir.Block, ir.Block, ir.Block], ir.Value,
                                            list[list[ir.Value]]]:
        """Starts a strip's K loop over ``groups`` steps (skipped where there are none): its
        blocks (the one before, the body, the one after), the group counter and the rows'
        ``vectors`` accumulators a row, as phis, the builder in the body
        (`_close_k_loop` ends it)."""
        start = builder.block
        loop = function.append_basic_block("k")
        after = function.append_basic_block("k_done")
        builder.cbranch(builder.icmp_signed(">", groups, I64(0)), loop, after)
        builder.position_at_end(loop)
        group = builder.phi(I64)
        tile = [[builder.phi(SUMS) for _ in range(vectors)] for _ in range(self.rows)]
        return (start, loop, after), group, tile

    def _close_k_loop(self, builder: ir.IRBuilder, blocks: tuple[ir.Block, ir.Block, ir.Block],
                      group: ir.Value, groups: ir.Value, tile: list[list[ir.Value]],
                      stepped: list[list[ir.Value]]) -> list[list[ir.Value]]:
        """Ends a strip's K loop (``blocks``: the block before it, its body and the block
        after): the group counter steps to ``groups``, the accumulators' phis ``tile`` take
        zero on entry and ``stepped`` round the loop; the builder ends in the block after,
        where the sums are returned as values (zero where the loop never ran)."""
        start, loop, after = blocks
        group_next = builder.add(group, I64(1))
        builder.cbranch(builder.icmp_signed("<", group_next, groups), loop, after)
        group.add_incoming(I64(0), start)
        group.add_incoming(group_next, loop)
        for accumulators, sums in zip(tile, stepped, strict=True):
            for accumulator, summed in zip(accumulators, sums, strict=True):
                accumulator.add_incoming(self.zero, start)
                accumulator.add_incoming(summed, loop)
        builder.position_at_end(after)
        results = []
        for sums in stepped:
            row = []
            for summed in sums:
                value = builder.phi(SUMS)
                value.add_incoming(self.zero, start)
                value.add_incoming(summed, loop)
                row.append(value)
            results.append(row)
        return results

    def _four_repeated(self, builder: ir.IRBuilder, address: ir.Value) -> ir.Value:
        """The four uint8 activations at ``address`` as int16, repeated over 16 lanes
        (``vpbroadcastd`` and ``vpmovzxbw``)."""
        word = builder.load(builder.bitcast(address, I32.as_pointer()), align=1)
        words = ir.VectorType(I32, 4)
        undefined = ir.Constant(words, ir.Undefined)
        single = builder.insert_element(undefined, word, I32(0))
        repeated = builder.shuffle_vector(single, undefined,
                                          ir.Constant(ir.VectorType(I32, 4), [0] * 4))
        return builder.zext(builder.bitcast(repeated, ir.VectorType(I8, 16)), WORDS)


def _column_sums(builder: ir.IRBuilder, low: ir.Value, high: ir.Value) -> ir.Value:
    """Eight columns' sums from two accumulators of two partial sums a column each (columns
    0-3 in ``low``, 4-7 in ``high``, a column's two sums in neighbouring lanes)."""
    even = builder.shuffle_vector(low, high, ir.Constant(SUMS, list(range(0, 16, 2))))
    odd = builder.shuffle_vector(low, high, ir.Constant(SUMS, list(range(1, 16, 2))))
    return builder.add(even, odd)


BYTES = ir.VectorType(I8, 32)


class NarrowInt8Kernel(Avx2Int8Kernel):
    """``panels`` on ``vpmaddubsw`` for weights within ±63 (`gemm_int8.NARROW_LIMIT`): the
    bytes multiplied as they are, no widening of either operand. Per step of four K values,
    a row's four activations repeated over 32 bytes meet 32 bytes of the packed weights (8
    columns, each column's four K values together); ``vpmaddubsw`` sums K values 0-1 and 2-3 of each
    column into int16 (exact: no pair sum passes 2 · 255 · 63), and ``vpmaddwd`` by
    ones adds the two into the column's int32 lane, so each accumulator holds eight columns'
    sums as they are. The same packed weights and arguments as `Avx2Int8Kernel`; a strip of
    ``strip`` columns (16 by default, at most the panel's) keeps ``strip / 8`` accumulators a
    row: at `gemm_int8.NARROW_ROWS` (4) rows of 16 columns, 8 accumulators, 2 ymm of weights,
    the row's repeated activations and the ones fit AVX2's sixteen registers. ``table``: ``a``
    holds each row's address (int64, `gemm_int8.table_job`) and ``lda`` is the address of each
    group of four K values' byte offset from there (int64), so that a convolution's windows
    are read where they lie; its task steps 8 bytes of ``a`` a row. ``taps``: ``a`` holds an
    entry of `TAP_ENTRY` int64 a row (`gemm_int8.taps_job`): its window's address, the row of
    C its sums go to, and the address and count of its K steps, each step two int64: the
    group's byte offset in the window and its weights' byte offset in a panel. A block's
    rows share its first row's steps, so that a tile of windows at an image's border walks
    only the taps inside the image, where ``table`` multiplies the padding's zeros too
    (ResNet's 3×3 layers at 7²: 19² of 21² taps). ``lda`` goes unused; ``groups`` gives the
    panels' stride alone. Each step prefetches every cache line of the strip's weights
    ``ahead`` bytes on.

    One row (a classifier at batch 1) takes a strip of the whole panel (`gemm_int8` binds
    it so): 8 accumulators at 64 columns, and the K loop walks the panel's weights in the
    order they lie, 256 bytes a step, where 16-column strips each cross the panel once with
    a 256-byte stride. On a Zen 3 core, one thread, MobileNet v2's 1280 × 1000 classifier
    (1.3 MB of weights) takes about 0.8× the time, from L3 or from memory
    (`bench/int8_avx2.py --classifier`)."""

    def __init__(self, rows: int, vectors: int, strip: int = STRIP,
                 table: bool = False, ahead: int = AHEAD_BYTES, taps: bool = False) -> None:
        super().__init__(rows, vectors, buffered=False)
        self.strip = min(strip, self.columns)
        self.table = table
        self.taps = taps
        self.ahead = ahead
        self.bytes_product = ir.Function(self.module, ir.FunctionType(WORDS, [BYTES, BYTES]),
                                         name="llvm.x86.avx2.pmadd.ub.sw")

    def define(self, name: str = "panels") -> ir.Function:
        function = panels_function(self.module, name)
        a, lda, _, groups, c, ldc, offsets, _, _, _ = function.args
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        loops = PanelLoops(function, builder, self.columns, self.rows)
        self.steps = None
        if self.taps:
            entries = builder.bitcast(a, I64.as_pointer())

            def field(i: int, index: int) -> ir.Value:
                entry = builder.mul(builder.add(loops.row, I64(i)), I64(TAP_ENTRY))
                return builder.load(builder.gep(entries, [builder.add(entry, I64(index))]))
            a_rows = [builder.inttoptr(field(i, 0), I8.as_pointer()) for i in range(self.rows)]
            c_rows = [builder.gep(c, [builder.add(builder.mul(field(i, 1), ldc), loops.column)])
                      for i in range(self.rows)]
            self.steps = builder.inttoptr(field(0, 2), I64.as_pointer())
            groups = field(0, 3)  # the K loop's count (the argument gave the panels' stride)
        elif self.table:  # each row's address read from the table, the groups' offsets at lda
            addresses = builder.bitcast(a, I64.as_pointer())
            self.group_offsets = builder.inttoptr(lda, I64.as_pointer())
            a_rows = [builder.inttoptr(builder.load(builder.gep(addresses, [
                builder.add(loops.row, I64(i))])), I8.as_pointer()) for i in range(self.rows)]
        else:
            a_rows = [builder.gep(a, [builder.mul(builder.add(loops.row, I64(i)), lda)])
                      for i in range(self.rows)]
        if not self.taps:
            c_rows = [builder.gep(c, [builder.add(builder.mul(builder.add(loops.row, I64(i)),
                                                              ldc), loops.column)])
                      for i in range(self.rows)]
        for strip in range(self.columns // self.strip):
            sums = self._narrow_strip(function, builder, a_rows, builder.gep(
                loops.b_panel, [I64(strip * self.strip * 4)]), groups)
            for half in range(self.strip // 8):
                at = strip * self.strip + half * 8
                offset = builder.load(builder.bitcast(builder.gep(
                    offsets, [builder.add(loops.column, I64(at))]), SUMS.as_pointer()), align=4)
                for i in range(self.rows):
                    target = builder.bitcast(builder.gep(c_rows[i], [I64(at)]),
                                             SUMS.as_pointer())
                    builder.store(builder.add(sums[i][half], offset), target, align=4)
        loops.close()
        return function

    def _narrow_strip(self, function: ir.Function, builder: ir.IRBuilder, a_rows: list,
                      b_strip: ir.Value, groups: ir.Value) -> list[list[ir.Value]]:
        """One strip's K loop from the builder's block; the builder ends after it, the rows'
        accumulators (``rows`` × ``strip / 8``, eight columns each) returned as values
        there."""
        halves = self.strip // 8
        ones = ir.Constant(WORDS, [1] * 16)
        (start, loop, after), group, tile = self._open_k_loop(function, builder, groups, halves)
        if self.steps is not None:  # the step's group offset and weights where it says
            step = builder.gep(self.steps, [builder.mul(group, I64(2))])
            b_run = builder.gep(b_strip, [builder.load(builder.gep(step, [I64(1)]))])
        else:
            b_run = builder.gep(b_strip, [builder.mul(group, I64(self.columns * 4))])
        # ``prefetcht0`` of each cache line of the strip's step ``ahead`` bytes on
        for line in range(self.strip * 4 // 64):
            builder.call(self.prefetch, [builder.gep(b_run, [I64(self.ahead + 64 * line)]),
                                         I32(0), I32(3), I32(1)])
        weights = [builder.load(builder.bitcast(builder.gep(b_run, [I64(half * 32)]),
                                                BYTES.as_pointer()), align=1)
                   for half in range(halves)]
        # the group's first byte in each row: 4 a group on, or where the table says
        if self.steps is not None:
            at = builder.load(step)
        elif self.table:
            at = builder.load(builder.gep(self.group_offsets, [group]))
        else:
            at = builder.mul(group, I64(4))
        stepped = []
        for i, a_row in enumerate(a_rows):
            word = builder.load(builder.bitcast(builder.gep(a_row, [at]), I32.as_pointer()),
                                align=1)
            single = builder.insert_element(ir.Constant(SUMS, ir.Undefined), word, I32(0))
            repeated = builder.bitcast(builder.shuffle_vector(
                single, ir.Constant(SUMS, ir.Undefined), ir.Constant(SUMS, [0] * 8)), BYTES)
            stepped.append([builder.add(tile[i][half], builder.call(self.pairs, [
                builder.call(self.bytes_product, [repeated, weights[half]]), ones]))
                for half in range(halves)])
        return self._close_k_loop(builder, (start, loop, after), group, groups, tile, stepped)
