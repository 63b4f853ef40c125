"""The LLVM IR of `gemm_int8`'s micro-kernel: exact int32 sums of uint8 rows by int8 columns
with AVX-512 VNNI's ``vpdpbusd``, built with `llvmlite.ir`.

One function computes a run of column panels of ``C = A @ B + offsets``::

    panels(a, lda, b, groups, c, ldc, offsets, row_blocks, first_panel, last_panel)

``a`` is uint8, ``row_blocks · MR`` rows of ``lda`` bytes, each holding ``4 · groups`` values
(K padded to a multiple of 4); ``b`` is int8 packed by `gemm_int8.pack_weights`: panels of
``NR`` columns, each ``groups`` runs of ``NR × 4`` bytes (column-major within a run: the four K
values of one column together), so that one 64-byte load holds four K values of 16 columns,
as ``vpdpbusd`` reads them. ``c`` is int32 with rows of ``ldc`` values, written whole (its
row and column counts are the padded ones); ``offsets`` adds one int32 per column (the
compensation for signed activations, see `gemm_int8`).

Per step of four K values, a tile of ``MR × NV`` accumulator vectors (16 int32 each) takes
``NV`` vector loads of B and ``MR`` 4-byte loads of A broadcast to every lane (LLVM folds them
into ``vpdpbusd``'s ``{1to16}`` memory operand). Every product of a uint8 and an int8 value
and every sum of four fit int32, and ``vpdpbusd`` does not saturate, so the sums are exact
wherever the whole sum fits int32 (a layer's K up to 66 000 at the extreme values).

With ``table``, ``a`` holds each row's address instead (int64) and ``lda`` the address of each
group of four K values' byte offset from there (int64): a convolution's windows read where
they lie in its channels-last copy, no patch rows gathered (`gemm_int8.table_job`).

Each step also prefetches B `AHEAD_BYTES` on: a product of few rows (a classifier at batch 1)
reads its packed weights once, from memory, and its K loop asks for them faster than the
hardware prefetchers bring them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import llvmlite.ir as ir

I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
LANES = 16  # int32 accumulators in one zmm register
# How far ahead of its step the K loop prefetches B, in bytes (16 steps of a 64-column panel).
# ResNet-50 v2's classifier (K 2048, N 1000, 2 MB) from out of L2, one thread, 6-row tiles at
# one row: 0.36 ms without, 0.29 with (`bench/int8.py --fc`).
AHEAD_BYTES = 4096


def panels_function(module: ir.Module, name: str) -> ir.Function:
    """An empty ``panels(a, lda, b, groups, c, ldc, offsets, row_blocks, first, last)``, the
    signature every int8 micro-kernel here defines (VNNI's and AMX's)."""
    byte_pointer, word_pointer = I8.as_pointer(), I32.as_pointer()
    arguments = [byte_pointer, I64, byte_pointer, I64, word_pointer, I64, word_pointer,
                 I64, I64, I64]
    return ir.Function(module, ir.FunctionType(ir.VoidType(), arguments), name=name)


class PanelLoops:
    """The two loops of a ``panels`` function: column panels ``[first, last)``, within each
    the row blocks ``[0, row_blocks)``. Made at the end of the entry block, it leaves the
    builder in a row block's body (``panel``, ``block``, the panel's ``b_panel`` and first
    ``column``, the block's first ``row`` at hand); `close` ends both loops and returns.
    ``per_panel(builder, column)`` emits what each panel computes once, before its rows.
    ``weight_bytes``: the bytes of one packed weight (2 where they are stored as int16)."""

    def __init__(self, function: ir.Function, builder: ir.IRBuilder, columns: int, rows: int,
                 per_panel: Callable[[ir.IRBuilder, ir.Value], Any] = lambda *_: None,
                 weight_bytes: int = 1) -> None:
        _, _, b, groups, _, _, _, self.row_blocks, first, last = function.args
        self.builder, self.last = builder, last
        panel_bytes = builder.mul(groups, I64(columns * 4 * weight_bytes))
        entry = builder.block
        self.panel_loop = function.append_basic_block("panel")
        self.done = function.append_basic_block("done")
        builder.cbranch(builder.icmp_signed("<", first, last), self.panel_loop, self.done)

        builder.position_at_end(self.panel_loop)
        self.panel = builder.phi(I64)
        self.panel.add_incoming(first, entry)
        self.b_panel = builder.gep(b, [builder.mul(self.panel, panel_bytes)])
        self.column = builder.mul(self.panel, I64(columns))
        self.per_panel = per_panel(builder, self.column)
        panel_start = builder.block
        self.row_loop = function.append_basic_block("rows")
        self.panel_next = function.append_basic_block("panel_next")
        builder.branch(self.row_loop)

        builder.position_at_end(self.row_loop)
        self.block = builder.phi(I64)
        self.block.add_incoming(I64(0), panel_start)
        self.row = builder.mul(self.block, I64(rows))

    def close(self) -> None:
        builder = self.builder
        block_next = builder.add(self.block, I64(1))
        self.block.add_incoming(block_next, builder.block)
        builder.cbranch(builder.icmp_signed("<", block_next, self.row_blocks), self.row_loop,
                        self.panel_next)

        builder.position_at_end(self.panel_next)
        following = builder.add(self.panel, I64(1))
        self.panel.add_incoming(following, self.panel_next)
        builder.cbranch(builder.icmp_signed("<", following, self.last), self.panel_loop,
                        self.done)
        builder.position_at_end(self.done)
        builder.ret_void()


class Int8Kernel:
    """A module holding ``panels`` for a tile of ``rows`` rows by ``vectors`` zmm vectors;
    ``table``: its rows read where a table of addresses points (the module's docstring)."""

    def __init__(self, rows: int, vectors: int, table: bool = False) -> None:
        self.rows, self.vectors, self.table = rows, vectors, table
        self.module = ir.Module(name="hybridserve_gemm_int8")
        self.vector = ir.VectorType(I32, LANES)
        self.zero = ir.Constant(self.vector, [0] * LANES)
        self.dot = ir.Function(self.module, ir.FunctionType(self.vector, [self.vector] * 3),
                               name="llvm.x86.avx512.vpdpbusd.512")
        self.prefetch = ir.Function(self.module, ir.FunctionType(
            ir.VoidType(), [I8.as_pointer(), I32, I32, I32]), name="llvm.prefetch.p0")

    @property
    def columns(self) -> int:
        return self.vectors * LANES

    def define(self, name: str = "panels") -> ir.Function:
        function = panels_function(self.module, name)
        a, lda, _, groups, c, ldc, _, _, _, _ = function.args
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        loops = PanelLoops(function, builder, self.columns, self.rows, self._column_offsets)
        shifts, row, column = loops.per_panel, loops.row, loops.column
        sums = self._tile(function, builder, self.rows_at(builder, a, lda, row),
                          loops.b_panel, groups, self.group_offsets(builder, lda))
        for i in range(self.rows):
            c_row = builder.gep(c, [builder.add(builder.mul(builder.add(row, I64(i)), ldc),
                                                column)])
            for j in range(self.vectors):
                target = builder.bitcast(builder.gep(c_row, [I64(j * LANES)]),
                                         self.vector.as_pointer())
                builder.store(builder.add(sums[i][j], shifts[j]), target, align=4)
        loops.close()
        return function

    def rows_at(self, builder: ir.IRBuilder, a: ir.Value, lda: ir.Value,
                row: ir.Value) -> list[ir.Value]:
        """The tile's rows of A from ``row`` on: ``lda`` bytes apart from ``a``, or with
        ``table`` where the addresses at ``a`` point."""
        if self.table:
            addresses = builder.bitcast(a, I64.as_pointer())
            return [builder.inttoptr(builder.load(builder.gep(addresses, [
                builder.add(row, I64(i))])), I8.as_pointer()) for i in range(self.rows)]
        return [builder.gep(a, [builder.mul(builder.add(row, I64(i)), lda)])
                for i in range(self.rows)]

    def group_offsets(self, builder: ir.IRBuilder, lda: ir.Value) -> ir.Value | None:
        """With ``table``, each group's byte offset in a row (int64s at ``lda``), else None:
        4 a group."""
        return builder.inttoptr(lda, I64.as_pointer()) if self.table else None

    def _column_offsets(self, builder: ir.IRBuilder, column: ir.Value) -> list[ir.Value]:
        """The panel's ``offsets`` from ``column`` on, as vectors (loaded once a panel)."""
        offsets = builder.function.args[6]
        return [builder.load(builder.bitcast(
            builder.gep(offsets, [builder.add(column, I64(j * LANES))]),
            self.vector.as_pointer()), align=4) for j in range(self.vectors)]

    def _group_weights(self, builder: ir.IRBuilder, b_panel: ir.Value, group: ir.Value,
                       vectors: int) -> list[ir.Value]:
        """K group ``group``'s first ``vectors`` vectors of the panel at ``b_panel``, and
        the same vectors `AHEAD_BYTES` on asked for."""
        b_run = builder.gep(b_panel, [builder.mul(group, I64(self.columns * 4))])
        b_values = [builder.load(builder.bitcast(builder.gep(b_run, [I64(j * LANES * 4)]),
                                                 self.vector.as_pointer()), align=1)
                    for j in range(vectors)]
        ahead = builder.gep(b_run, [I64(AHEAD_BYTES)])
        for j in range(vectors):
            # a read (0), kept in every level of cache (3), of data (1): ``prefetcht0``; past
            # the last panel it touches nothing (a prefetch never faults)
            builder.call(self.prefetch, [builder.gep(ahead, [I64(j * LANES * 4)]), I32(0),
                                         I32(3), I32(1)])
        return b_values

    def _tile(self, function: ir.Function, builder: ir.IRBuilder, a_rows: list,
              b_panel: ir.Value, groups: ir.Value,
              group_offsets: ir.Value | None = None) -> list[list[ir.Value]]:
        """The K loop of one tile from the builder's block; the builder ends after it, the
        tile's sums returned as values there. ``group_offsets``: each group's byte offset in
        a row (int64), else 4 a group."""
        start = builder.block
        loop = function.append_basic_block("k")
        after = function.append_basic_block("k_done")
        builder.cbranch(builder.icmp_signed(">", groups, I64(0)), loop, after)

        builder.position_at_end(loop)
        group = builder.phi(I64)
        tile = [[builder.phi(self.vector) for _ in range(self.vectors)]
                for _ in range(self.rows)]
        b_values = self._group_weights(builder, b_panel, group, self.vectors)
        offset = builder.mul(group, I64(4)) if group_offsets is None else \
            builder.load(builder.gep(group_offsets, [group]))
        stepped = []
        for i in range(self.rows):
            word = builder.load(builder.bitcast(builder.gep(a_rows[i], [offset]),
                                                I32.as_pointer()), align=1)
            broadcast = self._splat(builder, word)
            stepped.append([builder.call(self.dot, [tile[i][j], broadcast, b_values[j]])
                            for j in range(self.vectors)])
        group_next = builder.add(group, I64(1))
        builder.cbranch(builder.icmp_signed("<", group_next, groups), loop, after)
        group.add_incoming(I64(0), start)
        group.add_incoming(group_next, loop)
        for i in range(self.rows):
            for j in range(self.vectors):
                tile[i][j].add_incoming(self.zero, start)
                tile[i][j].add_incoming(stepped[i][j], loop)

        builder.position_at_end(after)
        results = []
        for i in range(self.rows):
            row = []
            for j in range(self.vectors):
                value = builder.phi(self.vector)
                value.add_incoming(self.zero, start)
                value.add_incoming(stepped[i][j], loop)
                row.append(value)
            results.append(row)
        return results

    def _splat(self, builder: ir.IRBuilder, scalar: ir.Value) -> ir.Value:
        undefined = ir.Constant(self.vector, ir.Undefined)
        single = builder.insert_element(undefined, scalar, I32(0))
        return builder.shuffle_vector(single, undefined,
                                      ir.Constant(ir.VectorType(I32, LANES), [0] * LANES))


def define_task(module: ir.Module, panels: ir.Function, rows: int,
                name: str = "task", row_bytes: int | None = None,
                edge: bool = False, rows_placed: bool = False) -> ir.Function:
    """A `spin_pool` task over ``panels`` (either kernel's): ``task(context, part, parts)``
    with the context ``[a, lda, b, groups, c, ldc, offsets, row_blocks, panel_count]`` (the
    addresses as integers). The (panel, row block) tiles, panel by panel, are cut into
    ``parts`` contiguous runs; a part computes its run as at most one call per panel it
    touches, so a layer of few rows (batch 1's last stages) still spreads over the cores
    by its panels, and one of many rows by its row blocks. ``row_bytes``: the bytes of ``a``
    a row takes where that is fixed (a table of rows' addresses, 8), ``lda`` then passed as
    it is; by default ``lda``.

    ``edge``: the context goes on with ``[edge, last_rows]``: the address of a one-row
    ``panels`` of the same arguments and the rows of the last row block that hold data
    (1 to ``rows``). Where the last block is short, a run reaching it computes that block's
    rows on the one-row tile, not the whole tile: ResNet's 7² layers (49 rows) compute 49
    rows, not 52. ``rows_placed``: ``a``'s rows name the rows of ``c`` their sums go to (the
    narrow kernel's taps mode), so every call gets ``c`` as it is."""
    word_pointer = I64.as_pointer()
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [word_pointer, I64, I64]),
                           name=name)
    context, part, parts = function.args
    builder = ir.IRBuilder(function.append_basic_block("entry"))
    fields = [builder.load(builder.gep(context, [I64(index)]))
              for index in range(11 if edge else 9)]
    a, lda, b, groups, c, ldc, offsets, row_blocks, panel_count = fields[:9]
    byte_pointer = I8.as_pointer()
    a, b = builder.inttoptr(a, byte_pointer), builder.inttoptr(b, byte_pointer)
    c = builder.inttoptr(c, I32.as_pointer())
    offsets = builder.inttoptr(offsets, I32.as_pointer())
    row_bytes = builder.mul(lda, I64(rows)) if row_bytes is None else I64(row_bytes * rows)
    c_rows = I64(0) if rows_placed else builder.mul(ldc, I64(rows))

    def call(panel: ir.Value, block: ir.Value, count: ir.Value) -> None:
        builder.call(panels, [builder.gep(a, [builder.mul(block, row_bytes)]), lda, b, groups,
                              builder.gep(c, [builder.mul(block, c_rows)]), ldc, offsets,
                              count, panel, builder.add(panel, I64(1))])

    def call_with_edge(panel: ir.Value, block: ir.Value, count: ir.Value) -> None:
        edge_panels = builder.inttoptr(fields[9], panels.type)
        last_rows = fields[10]
        end = builder.add(block, count)
        short = builder.and_(builder.icmp_signed("==", end, row_blocks),
                             builder.icmp_signed("<", last_rows, I64(rows)))
        whole = builder.sub(count, builder.zext(short, I64))
        with builder.if_then(builder.icmp_signed(">", whole, I64(0))):
            call(panel, block, whole)
        with builder.if_then(short):  # the short block's rows one at a time
            last = builder.sub(end, I64(1))
            builder.call(edge_panels, [
                builder.gep(a, [builder.mul(last, row_bytes)]), lda, b, groups,
                builder.gep(c, [builder.mul(last, c_rows)]), ldc, offsets, last_rows, panel,
                builder.add(panel, I64(1))])

    for_each_run(builder, function, row_blocks, panel_count, part, parts,
                 call_with_edge if edge else call)
    builder.ret_void()
    return function


def for_each_run(builder: ir.IRBuilder, function: ir.Function, row_blocks: ir.Value,
                 panel_count: ir.Value, part: ir.Value, parts: ir.Value,
                 call: Callable[[ir.Value, ir.Value, ir.Value], None]) -> None:
    """Cut the (panel, row block) tiles, panel by panel, into ``parts`` contiguous runs and
    emit ``call(panel, first row block, row blocks)`` for each panel part ``part``'s run
    touches; the builder is left after the loop."""
    total = builder.mul(row_blocks, panel_count)
    start = builder.sdiv(builder.mul(total, part), parts)
    end = builder.sdiv(builder.mul(total, builder.add(part, I64(1))), parts)
    entry = builder.block
    loop = function.append_basic_block("run")
    done = function.append_basic_block("done")
    builder.cbranch(builder.icmp_signed("<", start, end), loop, done)

    builder.position_at_end(loop)
    at = builder.phi(I64)
    at.add_incoming(start, entry)
    panel = builder.sdiv(at, row_blocks)
    block = builder.srem(at, row_blocks)
    left_in_panel = builder.sub(row_blocks, block)
    left_in_part = builder.sub(end, at)
    count = builder.select(builder.icmp_signed("<", left_in_panel, left_in_part),
                           left_in_panel, left_in_part)
    call(panel, block, count)
    following = builder.add(at, count)
    at.add_incoming(following, builder.block)
    builder.cbranch(builder.icmp_signed("<", following, end), loop, done)
    builder.position_at_end(done)
