"""The float32 tile functions for AVX2 hosts: `gemm_ir`'s tiles with A's strides as constants
where A is packed.

A 6 × 16 tile's step is 12 multiply-adds on 16 ymm registers, half an AVX-512 step's 24, so the
instructions around them weigh twice as much. Read with A's strides as arguments, each step's
six broadcasts of A need an address each, computed by a chain of adds from the row stride:
about 30 instructions a step, where Zen 3's two FMA pipes take 6 cycles over its 12 multiply-
adds. With A packed (row stride 1, column stride MR: `gemm_kernel.pack`, the layout every
weight product binds) the broadcasts read at fixed offsets from one pointer that moves MR
floats a step: about 25. So each tile tests the strides once and runs a loop compiled for the
packed layout where they match, the general loop elsewhere. One thread on the AMD EPYC (Zen 3)
of docs/benchmarks.md, the products of `bench/gemm.py`: 0.79–0.94× the general loop's time.
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.gemm_ir import I64, RESIDUAL, NarrowEdgeTileKernel


class Avx2TileKernel(NarrowEdgeTileKernel):
    """`NarrowEdgeTileKernel` whose K loops read a packed A at constant offsets."""

    def _tile(self, function: ir.Function, builder: ir.IRBuilder, rows: int, vectors: int,
              masks: list[Any] | None) -> None:
        """`TileKernel._tile` twice: for A packed (row stride 1, column stride MR), its
        strides constants, and for any other A."""
        lda, acs = function.args[2:4]
        b_ahead = function.args[RESIDUAL + 2]
        packed_strides = (I64(1), I64(self.shape.rows))
        packed = builder.and_(builder.icmp_signed("==", lda, packed_strides[0]),
                              builder.icmp_signed("==", acs, packed_strides[1]))
        reads_packed = function.append_basic_block("reads_packed")
        reads_strided = function.append_basic_block("reads_strided")
        after = function.append_basic_block("after")
        builder.cbranch(packed, reads_packed, reads_strided)
        for block, strides in ((reads_packed, packed_strides), (reads_strided, None)):
            builder.position_at_end(block)
            streams_b = function.append_basic_block("streams_b")
            streams_a = function.append_basic_block("streams_a")
            builder.cbranch(builder.icmp_signed("!=", b_ahead, I64(0)), streams_b, streams_a)
            for stream_block, stream in ((streams_b, "b"), (streams_a, "a")):
                builder.position_at_end(stream_block)
                self._tile_loop(function, builder, rows, vectors, masks, stream, strides)
                builder.branch(after)
        builder.position_at_end(after)
