"""The AMX-INT8 form of `gemm_int8_ir`'s ``panels`` function: the same arguments and result,
its products on AMX's tile registers with ``tdpbusd``.

``tdpbusd`` multiplies a 16 × 64 uint8 tile of A by a 64 × 16 int8 tile of B, stored as 16
rows of 16 columns × 4 K values (the layout `gemm_int8.PackedWeights` writes for its
32-column panels: one K group's run of 128 bytes holds both column halves), into a 16 × 16
int32 tile: 16,384 multiply-adds in one instruction, where ``vpdpbusd`` does 64. A tile of C
here is 32 × 32: four accumulator tiles (registers 0-3) fed per step of 64 K values by two
tiles of A (4, 5: rows 0-15 and 16-31) and two of B (6, 7: columns 0-15 and 16-31). The
operands are padded for whole tiles: rows of A to 32, K to 64 (`PackedWeights` with ``amx``).
The accumulators are stored into C, then each row gets its column offsets added.

The tile configuration (`gemm_amx_ir.tile_configuration`: every tile 16 rows × 64 bytes) is
loaded at each call and the tile state released at its end; the process must hold Linux's
permission for the tile state (`host_features.amx_permitted`) before the first call.
"""

from __future__ import annotations

import llvmlite.ir as ir

from engine.kernels.gemm_amx_ir import declare_tile_intrinsics, release_tiles_at_returns
from engine.kernels.gemm_int8_ir import I8, I32, I64, LANES, PanelLoops, panels_function

ROWS, COLUMNS, DEPTH = 32, 32, 64  # a tile of C, and K per step


class AmxInt8Kernel:
    """A module holding ``panels`` on AMX-INT8."""

    rows, vectors = ROWS, COLUMNS // LANES

    def __init__(self) -> None:
        self.module = ir.Module(name="hybridserve_gemm_int8_amx")
        self.vector = ir.VectorType(I32, LANES)
        declare_tile_intrinsics(self, self.module, "llvm.x86.tdpbusd",
                                "amx_int8_tile_configuration")

    def define(self, name: str = "panels") -> ir.Function:
        function = panels_function(self.module, name)
        a, lda, _, groups, c, ldc, offsets, _, _, _ = function.args
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        byte_pointer = I8.as_pointer()
        builder.call(self.load_config, [builder.bitcast(self.config, byte_pointer)])
        c_stride = builder.mul(ldc, I64(4))
        depth = builder.mul(groups, I64(4))
        loops = PanelLoops(function, builder, COLUMNS, ROWS)
        b_panel, column, row = loops.b_panel, loops.column, loops.row
        a_upper = builder.gep(a, [builder.mul(row, lda)])
        a_lower = builder.gep(a_upper, [builder.mul(I64(16), lda)])
        for accumulator in range(4):
            builder.call(self.zero_tile, [I8(accumulator)])
        start = builder.block
        k_loop = function.append_basic_block("k")
        k_done = function.append_basic_block("k_done")
        builder.cbranch(builder.icmp_signed(">", depth, I64(0)), k_loop, k_done)

        builder.position_at_end(k_loop)
        k = builder.phi(I64)
        k.add_incoming(I64(0), start)
        b_run = builder.gep(b_panel, [builder.mul(k, I64(COLUMNS))])  # k / 4 groups of 128
        self._load(builder, 4, builder.gep(a_upper, [k]), lda)
        self._load(builder, 5, builder.gep(a_lower, [k]), lda)
        self._load(builder, 6, b_run, I64(COLUMNS * 4))
        self._load(builder, 7, builder.gep(b_run, [I64(64)]), I64(COLUMNS * 4))
        for accumulator, (left, right) in enumerate(((4, 6), (4, 7), (5, 6), (5, 7))):
            builder.call(self.dot, [I8(accumulator), I8(left), I8(right)])
        k_next = builder.add(k, I64(DEPTH))
        k.add_incoming(k_next, k_loop)
        builder.cbranch(builder.icmp_signed("<", k_next, depth), k_loop, k_done)

        builder.position_at_end(k_done)
        corner = builder.gep(c, [builder.add(builder.mul(row, ldc), column)])
        for accumulator, (down, across) in enumerate(((0, 0), (0, 16), (16, 0), (16, 16))):
            target = builder.gep(corner, [builder.add(builder.mul(I64(down), ldc), I64(across))])
            builder.call(self.store_tile, [I8(accumulator), builder.bitcast(target, byte_pointer),
                                           c_stride])
        shifts = [builder.load(builder.bitcast(
            builder.gep(offsets, [builder.add(column, I64(j * LANES))]),
            self.vector.as_pointer()), align=4) for j in range(self.vectors)]
        for i in range(ROWS):  # the column offsets (signed data's compensation) added
            c_row = builder.gep(corner, [builder.mul(I64(i), ldc)])
            for j in range(self.vectors):
                address = builder.bitcast(builder.gep(c_row, [I64(j * LANES)]),
                                          self.vector.as_pointer())
                builder.store(builder.add(builder.load(address, align=4), shifts[j]), address,
                              align=4)
        loops.close()
        release_tiles_at_returns(self, function)
        return function

    def _load(self, builder: ir.IRBuilder, register: int, address: ir.Value,
              stride: ir.Value) -> None:
        builder.call(self.load_tile, [I8(register), address, stride])
