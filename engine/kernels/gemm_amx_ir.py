"""The AMX-BF16 tile kernels: `gemm_ir`'s tile functions with AMX's tile registers inside.

AMX holds eight tile registers of up to 16 rows × 64 bytes, and ``tdpbf16ps`` multiplies a
16 × 32 bf16 tile of A by a 32 × 16 bf16 tile of B (stored as 16 rows of 16 bf16 pairs, the
pairs down B's columns that `bf16.pair_columns` writes) into a 16 × 16 float32 tile: 8,192
multiply-adds in one instruction, where AVX-512 BF16's ``vdpbf16ps`` does 32. A tile of C
here is 32 × 32, four accumulator tiles (registers 0-3) fed by two tiles of A (4, 5: rows
0-15 and 16-31) and two of B (6, 7: columns 0-15 and 16-31) per step of 16 words of K.

The functions keep `gemm_ir`'s signature (so `TileKernel.define_part` walks them):
``a`` points at the tile's first row of A, pairs along rows (word (i, p) at ``a + i·lda +
p·acs``: ``acs`` 1 where A lies as a matrix; packed, `bf16.amx_pack_rows`, A's tiles lie one
after another, lda 16 and acs 32), ``b`` at its first column of B, pairs down columns (word
row p at ``b + p·ldb``), and K counts words. Operands must be readable a whole tile past their
edges: rows of A and columns of B padded to 32, K to 16 words, with zeros (`bf16.amx_rows`,
`bf16.amx_depth`). The accumulators go
through a 4 KiB buffer on the stack to `gemm_ir`'s epilogue (bias per row or column, residual,
clamp, masked stores at the edges).

A part (`AmxTileKernel.define_part`) keeps one tile's sums pending in a buffer on its own
stack and runs them through the epilogue a share of rows after each of the next tile's steps
of K (`define_interleaved_tile`), the last tile's after its loop: AMX multiplies while the
core stores, where a short K (ResNet-50 v2's 1×1 products: 4-32 steps) otherwise left AMX
waiting on a whole tile's epilogue. The direct convolution (`conv_amx_ir`) runs the same
interleaving (`_sums_meanwhile`) and rows' epilogue (`_rows_through_epilogue`) over its taps.

Each part of a product loads the tile configuration first (``ldtilecfg``: all eight tiles 16
rows × 64 bytes) and releases the tile state last (``tilerelease``, `release_tiles_at_returns`);
the process must hold Linux's permission for the tile state first
(`host_features.amx_permitted`), or its first tile instruction is killed with SIGILL.
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.gemm_bf16_ir import BFloatType
from engine.kernels.gemm_halves_ir import HalvesEpilogue
from engine.kernels.gemm_ir import F32, I32, I64, TileKernel
from engine.kernels.task_ir import loop, masked_store

I8 = ir.IntType(8)
I16 = ir.IntType(16)
ROWS, WORDS = 16, 16  # one tile register: 16 rows of 16 words (64 bytes)
TILES = 8
TILE_COLUMNS = 2 * WORDS  # a tile of C, and its buffer's row, is 32 floats wide
# Steps of K per tile at most where the tile before it goes through its epilogue between
# them (`AmxTileKernel._sums_meanwhile`); over a longer K a tile stores its own sums right
# after them. ResNet-18's direct convolutions, one thread, interleaved against each tile's
# epilogue after its own K loop: 64 filters at 56² (18 steps) 0.84× (0.69× with the
# residual), 128 at 28² (36) 0.88×; 256 at 14² (72) and 512 at 7² (144) no faster (1.0-1.1×
# in order, where their weights stream in and the epilogue is a small part of a tile's time).
INTERLEAVED_STEPS = 48
# Steps of K at most where a product walking row blocks outside (its output streams to
# memory, `gemm_bind`) stores each tile after its own sums: two steps leave half a tile's
# stores after each, and ResNet-50 v2's 256×64×3136 products took longer so (one thread in
# order: 1.04-1.19×, 1.03-1.4× with the residual), where its 512×128×784 ones (4 steps, with
# the residual) took 0.82-0.95× interleaved.
STREAMING_ALONE_STEPS = 2


def tile_configuration() -> list[int]:
    """The 64 bytes ``ldtilecfg`` reads: palette 1, then each tile's bytes per row (16-bit)
    and rows (8-bit)."""
    config = [0] * 64
    config[0] = 1
    for tile in range(TILES):
        config[16 + 2 * tile] = 4 * WORDS  # little-endian 16-bit count of bytes
        config[48 + tile] = ROWS
    return config


def declare_tile_intrinsics(kernel: Any, module: ir.Module, dot: str, config_name: str) -> None:
    """Give ``kernel`` AMX's intrinsics in ``module`` (``load_config``, ``zero_tile``,
    ``load_tile``, ``store_tile``, and ``dot``: the tile product ``dot`` names, such as
    ``llvm.x86.tdpbf16ps``) and ``config``, the tile configuration as a global."""
    void, pointer = ir.VoidType(), I8.as_pointer()
    kernel.load_config = ir.Function(module, ir.FunctionType(void, [pointer]),
                                     name="llvm.x86.ldtilecfg")
    kernel.zero_tile = ir.Function(module, ir.FunctionType(void, [I8]), name="llvm.x86.tilezero")
    kernel.load_tile = ir.Function(module, ir.FunctionType(void, [I8, pointer, I64]),
                                   name="llvm.x86.tileloadd64")
    kernel.store_tile = ir.Function(module, ir.FunctionType(void, [I8, pointer, I64]),
                                    name="llvm.x86.tilestored64")
    kernel.dot = ir.Function(module, ir.FunctionType(void, [I8, I8, I8]), name=dot)
    kernel.release_tiles = ir.Function(module, ir.FunctionType(void, []),
                                       name="llvm.x86.tilerelease")
    table = ir.ArrayType(I8, 64)
    kernel.config = ir.GlobalVariable(module, table, name=config_name)
    kernel.config.global_constant = True
    kernel.config.initializer = ir.Constant(table, tile_configuration())
    kernel.config.align = 64


def release_tiles_at_returns(kernel: Any, function: ir.Function) -> None:
    """Make ``function`` release the tile state (``tilerelease``, `declare_tile_intrinsics`'s
    ``release_tiles``) before each of its returns.

    A thread whose tiles are left loaded keeps the processor's tile data marked in use
    (XINUSE): each switch away from the thread saves and restores 8 KiB more, and Intel's
    manuals name tile state left in use as something that can keep a core out of its deeper
    idle states. The next part pays nothing more for it: it loads its configuration first.
    (On the development machine, a KVM guest, releasing changed neither the steady speed nor
    the slowdown after an idle pause: that comes from the caches, `docs/benchmarks.md`.)"""
    builder = ir.IRBuilder()
    for block in function.blocks:
        ending = block.terminator
        if isinstance(ending, ir.Ret):
            builder.position_before(ending)
            builder.call(kernel.release_tiles, [])


class AmxTileKernel(TileKernel):
    """`TileKernel` whose tile functions run on AMX (tile 32 × 32, K in steps of 16 words)."""

    def __init__(self, shape: Any) -> None:
        if (shape.rows, shape.width, shape.vectors) != (2 * ROWS, 16, 2):
            raise ValueError(f"the AMX tile is 32 rows by 2 vectors of 16; got {shape}")
        super().__init__(shape)
        declare_tile_intrinsics(self, self.module, "llvm.x86.tdpbf16ps", "amx_tile_configuration")

    def _part_prologue(self, builder: ir.IRBuilder) -> None:
        # Once per part, on the thread that runs it: the configuration is per thread and
        # outlives the part (a product's tiles run only inside parts). Per tile it cost
        # the products of a short K about half their time (256×64×3136: 389 → 202 µs).
        builder.call(self.load_config, [builder.bitcast(self.config, I8.as_pointer())])

    def define_part(self, name: str, full: ir.Function, edge: ir.Function,
                    fields: dict[str, int]) -> None:
        """`TileKernel.define_part` whose tiles run through `define_interleaved_tile`: each
        tile's sums wait on the part's stack and go through the epilogue between the next
        tile's steps of K, the last tile's after the loop (``full`` and ``edge`` stay whole
        tiles a caller may run alone)."""
        self._rows_epilogue = self.define_rows_epilogue(f"{name}_rows_epilogue")
        self._interleaved = self.define_interleaved_tile(f"{name}_tile", self._rows_epilogue)
        super().define_part(name, full, edge, fields)
        release_tiles_at_returns(self, self.module.get_global(name))

    def define_edge(self, name: str) -> ir.Function:
        """``name``: the first ``rows`` rows and ``columns`` columns of a tile, computed whole
        (the operands are padded) and stored through masks: one K loop, not one per row
        count as `TileKernel.define_edge` has."""
        function, builder = self._function(name, edge=True)
        rows, columns = function.args[-2:]
        self._tile(function, builder, rows, self.shape.vectors,
                   self._masks(builder, columns, self.shape.vectors))
        builder.ret_void()
        return function

    def define_rows_epilogue(self, name: str) -> ir.Function:
        """``name(floats, first, last, columns, ask_first, ask_last, c, ldc, bias_rows,
        bias_columns, low, high, residual)``: rows [first, last) of a finished tile's sums
        (32 × 32 floats at ``floats``, its first ``columns`` columns kept) through the
        epilogue into C, with `_rows_through_epilogue`'s asks ahead. C, its biases, bounds
        and residual sit at `gemm_ir`'s argument positions, which `_epilogue_terms` reads."""
        pointer = F32.as_pointer()
        arguments = [pointer, I64, I64, I64, I64, I64, pointer, I64, pointer, pointer, F32,
                     F32, pointer]
        function = ir.Function(self.module, ir.FunctionType(ir.VoidType(), arguments),
                               name=name)
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        floats, first, last, columns, ask_first, ask_last = function.args[:6]
        # A whole tile's stores and loads unmasked; an edge's through masks.
        whole = builder.icmp_signed("==", columns, I64(TILE_COLUMNS))
        with builder.if_else(whole) as (unmasked, masked):
            with unmasked:
                self._rows_through_epilogue(function, builder, floats, first, last, None,
                                            ask_first, ask_last)
            with masked:
                self._rows_through_epilogue(
                    function, builder, floats, first, last,
                    self._masks(builder, columns, self.shape.vectors), ask_first, ask_last)
        builder.ret_void()
        return function

    def define_interleaved_tile(self, name: str, epilogue: ir.Function) -> ir.Function:
        """``name(k, a, lda, acs, b, ldb, floats, pending, <the pending tile's arguments to
        ``epilogue``: columns, then C's from c on>)``: one tile's sums (operands as
        `_function`'s) into tiles 0-3 and then ``floats``, the tile before it (``pending``
        rows of sums at ``floats``) through ``epilogue`` between the steps of K
        (`_sums_meanwhile`)."""
        pointer = F32.as_pointer()
        arguments = [I64, pointer, I64, I64, pointer, I64, pointer, I64, I64,
                     *epilogue.function_type.args[6:]]
        function = ir.Function(self.module, ir.FunctionType(ir.VoidType(), arguments),
                               name=name)
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        floats, pending, columns = function.args[6:9]
        held = list(function.args[9:])

        def finish(first: Any, last: Any, ask_first: Any, ask_last: Any) -> None:
            builder.call(epilogue, [floats, first, last, columns, ask_first, ask_last, *held])

        steps = builder.sdiv(builder.add(function.args[0], I64(WORDS - 1)), I64(WORDS))
        self._sums_meanwhile(function, builder, steps, None, floats, pending, finish,
                             lambda prefetching, finish_rows: self._k_steps(
                                 function, builder, finish_rows))
        builder.ret_void()
        return function

    # The pending tile's epilogue arguments a part holds between tiles, in `define_rows_
    # epilogue`'s order after ``ask_last`` (``columns`` first), and its kept rows.
    _HELD = ("columns", "c", "ldc", "rows_bias", "columns_bias", "low", "high", "residual")

    def _run_tile(self, function: ir.Function, builder: ir.IRBuilder, full: ir.Function,
                  edge: ir.Function, arguments: list[Any], rows: Any, columns: Any,
                  columns_outside: Any) -> None:
        """The tile's sums while the one before it is stored (`define_interleaved_tile`),
        then it waits as the pending one. Over a long K (`INTERLEAVED_STEPS`), or none, the
        whole-tile functions run it, its epilogue after its own sums: every tile of a
        product has the same K, so none is pending then. Either walk (``columns_outside``
        or not) interleaves."""
        k_count = arguments[0]
        alone = builder.or_(builder.icmp_signed(">", k_count, I64(INTERLEAVED_STEPS * WORDS)),
                            builder.icmp_signed("<=", k_count, I64(0)))
        alone = builder.or_(alone, builder.and_(
            builder.not_(columns_outside),
            builder.icmp_signed("<=", k_count, I64(STREAMING_ALONE_STEPS * WORDS))))
        with builder.if_else(alone) as (by_itself, interleaved):
            with by_itself:
                super()._run_tile(function, builder, full, edge, arguments, rows, columns,
                                  columns_outside)
            with interleaved:
                floats, slots = self._part_state(function)
                held = [builder.load(slots[key]) for key in ("rows", *self._HELD)]
                builder.call(self._interleaved, [*arguments[:6], floats, *held])
                current = {"rows": rows, "columns": columns,
                           **dict(zip(self._HELD[1:], arguments[6:13], strict=True))}
                for key, value in current.items():
                    builder.store(value, slots[key])

    def _end_part(self, function: ir.Function, builder: ir.IRBuilder) -> None:
        """The last tile's sums, still pending, through the epilogue."""
        floats, slots = self._part_state(function)
        rows, columns, *held = (builder.load(slots[key]) for key in ("rows", *self._HELD))
        with builder.if_then(builder.icmp_signed(">", rows, I64(0))):
            builder.call(self._rows_epilogue, [floats, I64(0), rows, columns, I64(0), rows,
                                               *held])

    def _part_state(self, function: ir.Function) -> tuple[Any, dict[str, Any]]:
        """The part's buffer of pending sums and the slots holding that tile's rows and
        epilogue arguments (allocated once, at the start of its entry block; none pending)."""
        state = getattr(self, "_state", None)
        if state is not None and state[0] is function:
            return state[1], state[2]
        entry = ir.IRBuilder()
        entry.position_at_start(function.entry_basic_block)
        buffer = entry.alloca(ir.ArrayType(F32, 2 * ROWS * TILE_COLUMNS))
        buffer.align = 64
        floats = entry.bitcast(buffer, F32.as_pointer())
        kinds = {"rows": I64, "columns": I64, "c": F32.as_pointer(), "ldc": I64,
                 "rows_bias": F32.as_pointer(), "columns_bias": F32.as_pointer(), "low": F32,
                 "high": F32, "residual": F32.as_pointer()}
        slots = {key: entry.alloca(kind) for key, kind in kinds.items()}
        for key, kind in kinds.items():
            empty = ir.Constant(kind, None) if isinstance(kind, ir.PointerType) else kind(0)
            entry.store(empty, slots[key])
        self._state = (function, floats, slots)
        return floats, slots

    def _tile(self, function: ir.Function, builder: ir.IRBuilder, rows: Any, vectors: int,
              masks: list[Any] | None) -> None:
        """The K loop on the tile registers, the accumulators stored to a stack buffer, then
        `gemm_ir`'s epilogue for ``rows`` rows and ``vectors`` vectors from it."""
        buffer = builder.alloca(ir.ArrayType(F32, 4 * ROWS * WORDS))
        buffer.align = 64
        floats = builder.bitcast(buffer, F32.as_pointer())
        for accumulator in range(4):
            builder.call(self.zero_tile, [I8(accumulator)])
        self._k_steps(function, builder, None)
        self._store_sums(builder, floats)
        self._epilogue(function, builder, floats, rows, vectors, masks)

    def _k_steps(self, function: ir.Function, builder: ir.IRBuilder, finish_rows: Any) -> None:
        """The K loop of a product (``function``'s first six arguments as `_function`'s)
        into tiles 0-3; after step ``s``, ``finish_rows(s)`` where given."""
        k_count, a, lda, acs, b, ldb = function.args[:6]
        a_stride, b_stride = builder.mul(lda, I64(4)), builder.mul(ldb, I64(4))
        a_lower = builder.gep(a, [builder.mul(lda, I64(ROWS))])
        with loop(builder, function, I64(0), k_count, "pairs", WORDS) as k:
            a_step = builder.mul(k, acs)
            self._step(builder, builder.gep(a, [a_step]), builder.gep(a_lower, [a_step]),
                       a_stride, builder.gep(b, [builder.mul(k, ldb)]), b_stride)
            if finish_rows is not None:
                finish_rows(builder.sdiv(k, I64(WORDS)))

    def _sums_meanwhile(self, function: ir.Function, builder: ir.IRBuilder, steps: Any,
                        fresh: Any, floats: Any, pending: Any, finish: Any,
                        k_loop: Any, even_share: bool = False) -> None:
        """A tile's sums into tiles 0-3 and then ``floats``, while the tile before it
        (``pending`` rows of sums at ``floats``) goes through the epilogue,
        ``finish(first, last, ask_first, ask_last)``, as many rows after each of the
        ``steps`` steps of K: the core's stores run while AMX multiplies, where AMX waited
        on them with the epilogue after its own tile. ``k_loop(prefetching, finish_rows)``
        builds the K loop, calling ``finish_rows(step)`` after each step where given.
        Where ``fresh`` (an int64, not None) is not 0 the tile streams its weights in: the
        pending tile is stored whole first (the epilogue's loads and stores would compete
        with the stream) and the loop prefetches. ``even_share``: each share an even number
        of rows (an epilogue storing rows two at a time)."""
        steps = builder.select(builder.icmp_signed(">", steps, I64(1)), steps, I64(1))
        # The pending rows spread over the steps, as many after each: one division per
        # tile, none per step.
        share = builder.sdiv(builder.add(pending, builder.sub(steps, I64(1))), steps)
        if even_share:
            share = builder.mul(builder.sdiv(builder.add(share, I64(1)), I64(2)), I64(2))

        def within_pending(row: Any) -> Any:
            return builder.select(builder.icmp_signed("<", row, pending), row, pending)

        def finish_rows(step: Any) -> None:
            """The pending rows of step ``step``'s share, the next share's asked for."""
            first = builder.mul(step, share)
            last = within_pending(builder.add(first, share))
            with builder.if_then(builder.icmp_signed("<", first, last)):
                finish(first, last, last, within_pending(builder.add(last, share)))

        def ask_first_share() -> None:
            """The first share's residual and output lines asked for, none stored: its
            loads would otherwise wait behind the stores before them."""
            with builder.if_then(builder.icmp_signed(">", pending, I64(0))):
                finish(I64(0), I64(0), I64(0), within_pending(share))

        for accumulator in range(4):
            builder.call(self.zero_tile, [I8(accumulator)])
        if fresh is None:
            ask_first_share()
            k_loop(False, finish_rows)
        else:
            first, later = (function.append_basic_block(name) for name in ("first", "later"))
            summed = function.append_basic_block("summed")
            builder.cbranch(builder.icmp_signed("!=", fresh, I64(0)), first, later)
            builder.position_at_end(first)
            with builder.if_then(builder.icmp_signed(">", pending, I64(0))):
                finish(I64(0), pending, I64(0), pending)
            k_loop(True, None)
            builder.branch(summed)
            builder.position_at_end(later)
            k_loop(False, finish_rows)
            builder.branch(summed)
            builder.position_at_end(summed)
        self._store_sums(builder, floats)

    def _store_sums(self, builder: ir.IRBuilder, floats: Any) -> None:
        """Tiles 0-3 into the 32 × 32 floats at ``floats``."""
        row_bytes = I64(4 * TILE_COLUMNS)
        for accumulator, offset in enumerate((0, WORDS, ROWS * TILE_COLUMNS,
                                              ROWS * TILE_COLUMNS + WORDS)):
            target = builder.bitcast(builder.gep(floats, [I64(offset)]), I8.as_pointer())
            builder.call(self.store_tile, [I8(accumulator), target, row_bytes])

    def _rows_through_epilogue(self, function: ir.Function, builder: ir.IRBuilder,
                               floats: Any, first: Any, last: Any, masks: list[Any] | None,
                               ask_first: Any, ask_last: Any) -> None:
        """Rows [first, last) of the sums at ``floats`` through the epilogue (``function``'s
        arguments from 6 on at `gemm_ir`'s positions), the residual's rows [ask_first,
        ask_last) asked for first (those of the next call, or these), and the output's
        where they are the next call's."""
        terms = self._epilogue_terms(function, builder, self.shape.vectors, masks)

        def store(adding: bool) -> None:
            with loop(builder, function, first, last, "store") as row:
                source = builder.gep(floats, [builder.mul(row, I64(TILE_COLUMNS))])
                row_shift = self._row_shift(builder, terms, row)
                for j in range(self.shape.vectors):
                    value = builder.load(self._address(builder, source, j), align=64)
                    self._finish(builder, terms, row, row_shift, value, j, masks, adding)

        # The output's lines of the next call's rows owned before they are stored: in a run
        # of layers the output is rarely in cache (ResNet-18 in order, one thread: its 3×3
        # layers up to 256 channels 0.83-0.97× without it). Not for rows about to be stored
        # (a call storing a whole tile): there it is no earlier than the store itself.
        with builder.if_then(builder.icmp_signed(">=", ask_first, last)):
            self._ask_rows(builder, function, terms["c"], terms["ldc"], ask_first, ask_last,
                           True)
        with builder.if_else(terms["present"]) as (adding, plain):
            with adding:
                # Its loads wait behind the stores before them where not asked for ahead
                # (`gemm_ir.TileKernel._prefetch_residual`).
                self._ask_rows(builder, function, terms["residual"], terms["ldc"], ask_first,
                               ask_last, False)
                store(True)
            with plain:
                store(False)

    def _ask_rows(self, builder: ir.IRBuilder, function: ir.Function, base: Any, ldc: Any,
                  first: Any, last: Any, writing: bool) -> None:
        """A prefetch of the lines under each vector of rows [first, last) of ``base`` (laid
        out as the output), for writing (``prefetchw``) or reading."""
        targets = [self._offset(builder, j) for j in range(self.shape.vectors)]
        with loop(builder, function, first, last, "ask") as row:
            line = builder.gep(base, [builder.mul(row, ldc)])
            for target in targets:
                at = builder.gep(line, [target])
                for offset in (0, WORDS - 1):
                    builder.call(self.prefetch, [builder.gep(at, [I64(offset)]),
                                                 I32(int(writing)), I32(3), I32(1)])

    def _step(self, builder: ir.IRBuilder, a_upper: Any, a_lower: Any, a_stride: Any,
              b_row: Any, b_stride: Any) -> None:
        """One step of 16 words of K: A's two tiles (rows 0-15 at ``a_upper``, 16-31 at
        ``a_lower``) and B's two (columns 0-15 and 16-31 from ``b_row``) loaded, and their
        four products summed into the accumulators (strides in bytes)."""
        self._load_tile(builder, 4, a_upper, a_stride)
        self._load_tile(builder, 5, a_lower, a_stride)
        self._load_tile(builder, 6, b_row, b_stride)
        self._load_tile(builder, 7, builder.gep(b_row, [I64(WORDS)]), b_stride)
        for accumulator, (left, right) in enumerate(((4, 6), (4, 7), (5, 6), (5, 7))):
            builder.call(self.dot, [I8(accumulator), I8(left), I8(right)])

    def _load_tile(self, builder: ir.IRBuilder, register: int, address: Any,
                   stride: Any) -> None:
        builder.call(self.load_tile, [I8(register), builder.bitcast(address, I8.as_pointer()),
                                      stride])

    def _epilogue(self, function: ir.Function, builder: ir.IRBuilder, floats: Any, rows: Any,
                  vectors: int, masks: list[Any] | None) -> None:
        """Rows [0, rows) of the buffer through `gemm_ir`'s epilogue (biases, residual,
        clamp) into C, as a loop (32 rows unrolled would be 64 stores of code per row
        count)."""
        terms = self._epilogue_terms(function, builder, vectors, masks)
        count = rows if isinstance(rows, ir.Value) else I64(rows)

        def store(adding: bool) -> None:
            start = builder.block
            loop = function.append_basic_block("store")
            done = function.append_basic_block("stored")
            builder.cbranch(builder.icmp_signed(">", count, I64(0)), loop, done)
            builder.position_at_end(loop)
            row = builder.phi(I64)
            source = builder.gep(floats, [builder.mul(row, I64(2 * WORDS))])
            row_shift = self._row_shift(builder, terms, row)
            for j in range(vectors):
                value = builder.load(self._address(builder, source, j), align=64)
                self._finish(builder, terms, row, row_shift, value, j, masks, adding)
            following = builder.add(row, I64(1))
            row.add_incoming(I64(0), start)
            row.add_incoming(following, builder.block)
            builder.cbranch(builder.icmp_signed("<", following, count), loop, done)
            builder.position_at_end(done)

        self._either_epilogue(function, builder, terms, count, vectors, store)


class AmxHalvesKernel(HalvesEpilogue, AmxTileKernel):
    """`AmxTileKernel` storing C as bf16 halves in place of float32 (`gemm_halves_ir`): the
    bf16 planes a 1×1 product's depthwise reader takes (`gemm_amx_handoff`)."""

    def _ask_rows(self, builder: ir.IRBuilder, function: ir.Function, base: Any, ldc: Any,
                  first: Any, last: Any, writing: bool) -> None:
        """`AmxTileKernel._ask_rows` over C's halves (each row's 64 bytes: one line or two);
        the residual's rows are never read."""
        if not writing:
            return
        with loop(builder, function, first, last, "ask") as row:
            for offset in (0, self.shape.columns - 1):
                at = self._halves_at(builder, base, ldc, row, I64(offset))
                builder.call(self.prefetch, [builder.bitcast(at, F32.as_pointer()), I32(1),
                                             I32(3), I32(1)])


# The rows of the reader's grid one vector of 16 output columns may fall on: from a grid row
# 8 pixels wide (`AmxGridKernel`), a vector starting on its last pixel spans three.
GRID_MIN_WIDTH = 8
GRID_ROWS_A_VECTOR = 3


class AmxGridKernel(AmxTileKernel):
    """`AmxTileKernel` writing C as a direct 3×3 convolution's zero-bordered grid of bf16
    pairs (`conv_amx`): filter rows ``2p`` and ``2p + 1`` into word row ``p`` (the even
    one's half low), output pixel ``n = y·W + x`` at word ``n + gap·y + shift`` of it (the
    grid's rows ``W + gap`` words wide, its border ``shift`` words before the first pixel),
    so that the border stays zero. The values are the float32 epilogue's (biases, then the
    clamp), rounded as the pairing pass rounds them (``fptrunc``: to nearest even). No
    residual is added.

    The part's arguments carry what it lacks (`gemm_amx_handoff`'s context): the column
    bias's address is 0, so the tile's pointer to it is 4 bytes a column of its first
    column; the residual's is C's plus ``W + gap·2¹⁶ + shift·2³²``, the difference the tile
    reads; ``ldc`` is half a word row, so that C's corner of the tile's row block (32 rows:
    16 word rows) lies where the part puts it."""

    def __init__(self, shape: Any) -> None:
        super().__init__(shape)
        self.words_type = ir.VectorType(I32, WORDS)
        self.halves_type = ir.VectorType(BFloatType(), WORDS)
        self.store_words = masked_store(self.module, self.words_type, "i32")

    def _sums_meanwhile(self, function: ir.Function, builder: ir.IRBuilder, steps: Any,
                        fresh: Any, floats: Any, pending: Any, finish: Any,
                        k_loop: Any, even_share: bool = False) -> None:
        """`AmxTileKernel._sums_meanwhile` with an even share of rows after each step: the
        epilogue stores them two at a time."""
        super()._sums_meanwhile(function, builder, steps, fresh, floats, pending, finish,
                                k_loop, even_share=True)

    def _rows_through_epilogue(self, function: ir.Function, builder: ir.IRBuilder,
                               floats: Any, first: Any, last: Any, masks: list[Any] | None,
                               ask_first: Any, ask_last: Any) -> None:
        """Rows [first, last) (``first`` even) of a pending tile's sums into the grid, the
        grid's lines of rows [ask_first, ask_last) asked for first where they are the next
        call's (in a run of layers the grid is rarely in cache: without it ResNet-50 v2's
        writers took 1.2–2× their float32 time in the plan's order)."""
        with builder.if_then(builder.icmp_signed(">=", ask_first, last)):
            self._grid_rows(function, builder, floats, ask_first, ask_last, masks, True)
        self._grid_rows(function, builder, floats, first, last, masks)

    def _epilogue(self, function: ir.Function, builder: ir.IRBuilder, floats: Any, rows: Any,
                  vectors: int, masks: list[Any] | None) -> None:
        """A whole tile's ``rows`` rows of sums into the grid."""
        count = rows if isinstance(rows, ir.Value) else I64(rows)
        self._grid_rows(function, builder, floats, I64(0), count, masks)

    def _grid_rows(self, function: ir.Function, builder: ir.IRBuilder, floats: Any,
                   first: Any, last: Any, masks: list[Any] | None,
                   asking: bool = False) -> None:
        """Rows [first, last) (``first`` even) of the sums at ``floats``, two at a time, into
        their word row of the grid (a lone last row's partner written as zeros); C and the
        rest at `gemm_ir`'s argument positions of ``function``. ``asking``: the lines those
        rows' words go to asked for, for writing, in place of the stores."""
        c, ldc, rows_bias, columns_at, low, high, residual = function.args[6:13]
        column = builder.lshr(builder.ptrtoint(columns_at, I64), I64(2))
        geometry = builder.sub(builder.ptrtoint(residual, I64), builder.ptrtoint(c, I64))
        width = builder.and_(geometry, I64(0xFFFF))
        gap = builder.and_(builder.lshr(geometry, I64(16)), I64(0xFFFF))
        shift = builder.lshr(geometry, I64(32))
        # word row 0 of the tile's row block: C's corner less its first column's 4 bytes
        words = builder.inttoptr(builder.sub(builder.ptrtoint(c, I64), builder.mul(column, I64(4))),
                                 I32.as_pointer())
        plane = builder.mul(ldc, I64(2))
        terms = {"low": self._splat(builder, low), "high": self._splat(builder, high)}
        zero = ir.Constant(self.vector, [0.0] * self.shape.width)
        lanes = ir.Constant(ir.VectorType(I32, WORDS), list(range(WORDS)))
        order = [lane for index in range(WORDS) for lane in (index, index + WORDS)]
        starts = []
        for j in range(self.shape.vectors):  # where each vector's columns start: grid rows
            start = builder.add(column, I64(j * WORDS))
            y = builder.sdiv(start, width)
            starts.append((start, y, builder.sub(start, builder.mul(y, width))))
        with loop(builder, function, builder.sdiv(first, I64(2)),
                  builder.sdiv(builder.add(last, I64(1)), I64(2)), "pair") as pair:
            upper = builder.mul(pair, I64(2))
            lower = builder.add(upper, I64(1))
            present = builder.icmp_signed("<", lower, last)
            # a lone last row's partner reads its own bias (the bias holds only C's rows)
            row_shifts = [self._splat(builder, builder.load(builder.gep(rows_bias, [row]),
                                                            align=4))
                          for row in (upper, builder.select(present, lower, upper))]
            line = builder.gep(words, [builder.mul(pair, plane)])
            if asking:
                for first_column, y, _ in starts:
                    at = builder.add(builder.add(first_column, shift), builder.mul(gap, y))
                    # a vector's 16 words and the border gaps it may span: two lines
                    for offset in (at, builder.add(at, builder.add(I64(WORDS - 1),
                                                                  builder.mul(gap, I64(2))))):
                        target = builder.bitcast(builder.gep(line, [offset]), F32.as_pointer())
                        builder.call(self.prefetch, [target, I32(1), I32(3), I32(1)])
            else:
                for j in range(self.shape.vectors):
                    halves = []
                    for row, row_shift in zip((upper, lower), row_shifts, strict=True):
                        source = builder.gep(floats, [builder.mul(row, I64(TILE_COLUMNS))])
                        value = builder.load(self._address(builder, source, j), align=64)
                        # + 0.0: the float32 epilogue's column bias (zeros), which turns -0.0
                        # to +0.0 there
                        value = builder.fadd(builder.fadd(value, row_shift), zero)
                        value = self._clamp(builder, terms, value)
                        halves.append(builder.fptrunc(value, self.halves_type))
                    halves[1] = builder.select(present, halves[1], builder.fptrunc(
                        zero, self.halves_type))
                    paired = builder.bitcast(builder.shuffle_vector(
                        halves[0], halves[1], ir.Constant(ir.VectorType(I32, 2 * WORDS), order)),
                        self.words_type)
                    self._store_on_grid_rows(builder, paired, line, starts[j], width, gap, shift,
                                             lanes, None if masks is None else masks[j])

    def _store_on_grid_rows(self, builder: ir.IRBuilder, paired: Any, line: Any,
                            start: tuple[Any, Any, Any], width: Any, gap: Any, shift: Any,
                            lanes: Any, kept: Any) -> None:
        """A vector of words for output columns ``start`` on (its first at pixel (y, x)) into
        the word row at ``line``: the lanes on each grid row they fall on stored apart, that
        row's border gap on (only ``kept`` lanes, where given)."""
        first, y, x = start
        for crossed in range(GRID_ROWS_A_VECTOR):
            low = builder.sub(builder.mul(width, I64(crossed)), x)
            if crossed == 0:
                self._store_on_grid_row(builder, paired, line, first, y, low, width, gap,
                                        shift, lanes, kept, crossed)
                continue
            # a later grid row only where the vector reaches it (a store masked off whole
            # still costs one)
            with builder.if_then(builder.icmp_signed("<", low, I64(WORDS))):
                self._store_on_grid_row(builder, paired, line, first, y, low, width, gap,
                                        shift, lanes, kept, crossed)

    def _store_on_grid_row(self, builder: ir.IRBuilder, paired: Any, line: Any, first: Any,
                           y: Any, low: Any, width: Any, gap: Any, shift: Any, lanes: Any,
                           kept: Any, crossed: int) -> None:
        """Lanes [low, low + width) of ``paired`` (and ``kept``) onto grid row ``crossed``
        after the vector's first."""
        # 32-bit lanes: one vector register, where 64-bit ones take two
        low, high = (builder.trunc(bound, I32) for bound in (low, builder.add(low, width)))
        on_row = builder.and_(builder.icmp_signed(">=", lanes, self._splat_i32(builder, low)),
                              builder.icmp_signed("<", lanes, self._splat_i32(builder, high)))
        if kept is not None:
            on_row = builder.and_(on_row, kept)
        at = builder.add(builder.add(first, shift), builder.mul(gap, builder.add(y, I64(crossed))))
        target = builder.bitcast(builder.gep(line, [at]), self.words_type.as_pointer())
        builder.call(self.store_words, [paired, target, I32(4), on_row])

    @staticmethod
    def _splat_i32(builder: ir.IRBuilder, scalar: Any) -> Any:
        vector = ir.VectorType(I32, WORDS)
        single = builder.insert_element(ir.Constant(vector, ir.Undefined), scalar, I32(0))
        return builder.shuffle_vector(single, ir.Constant(vector, ir.Undefined),
                                      ir.Constant(ir.VectorType(I32, WORDS), [0] * WORDS))
