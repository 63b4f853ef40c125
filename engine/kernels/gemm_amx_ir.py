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

Each part of a product loads the tile configuration first (``ldtilecfg``: all eight tiles 16
rows × 64 bytes) and releases the tile state last (``tilerelease``, `release_tiles_at_returns`);
the process must hold Linux's permission for the tile state first
(`host_features.amx_permitted`), or its first tile instruction is killed with SIGILL.
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.gemm_ir import F32, I64, TileKernel

I8 = ir.IntType(8)
ROWS, WORDS = 16, 16  # one tile register: 16 rows of 16 words (64 bytes)
TILES = 8


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

    def _tile(self, function: ir.Function, builder: ir.IRBuilder, rows: Any, vectors: int,
              masks: list[Any] | None) -> None:
        """The K loop on the tile registers, the accumulators stored to a stack buffer, then
        `gemm_ir`'s epilogue for ``rows`` rows and ``vectors`` vectors from it."""
        k_count, a, lda, acs, b, ldb = function.args[:6]
        buffer = builder.alloca(ir.ArrayType(F32, 4 * ROWS * WORDS))
        buffer.align = 64
        floats = builder.bitcast(buffer, F32.as_pointer())
        for accumulator in range(4):
            builder.call(self.zero_tile, [I8(accumulator)])
        a_stride, b_stride = builder.mul(lda, I64(4)), builder.mul(ldb, I64(4))
        a_lower = builder.gep(a, [builder.mul(lda, I64(ROWS))])
        start = builder.block
        loop = function.append_basic_block("loop")
        done = function.append_basic_block("done")
        builder.cbranch(builder.icmp_signed(">", k_count, I64(0)), loop, done)

        builder.position_at_end(loop)
        k = builder.phi(I64)
        b_row = builder.gep(b, [builder.mul(k, ldb)])
        a_step = builder.mul(k, acs)
        self._step(builder, builder.gep(a, [a_step]), builder.gep(a_lower, [a_step]), a_stride,
                   b_row, b_stride)
        k_next = builder.add(k, I64(WORDS))
        builder.cbranch(builder.icmp_signed("<", k_next, k_count), loop, done)
        k.add_incoming(I64(0), start)
        k.add_incoming(k_next, loop)

        builder.position_at_end(done)
        row_bytes = I64(4 * 2 * WORDS)  # the buffer is 32 × 32 floats
        for accumulator, offset in enumerate((0, WORDS, ROWS * 2 * WORDS,
                                              ROWS * 2 * WORDS + WORDS)):
            target = builder.bitcast(builder.gep(floats, [I64(offset)]), I8.as_pointer())
            builder.call(self.store_tile, [I8(accumulator), target, row_bytes])
        self._epilogue(function, builder, floats, rows, vectors, masks)

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
