"""The AMX 1×1 product of a ResNet v2 block's end writing the next block's pre-activation too.

`AmxPreactKernel` is `gemm_amx_ir.AmxTileKernel` with `gemm_preact_ir.PreactEpilogue`: as it
stores each pair of rows of C (the float32 sum the next residual reads) out of the tile's
buffer, it also stores the next block's BatchNorm and ReLU of them as the bf16 words the
next 1×1 products read (`gemm_preact`).

Each tile goes through the epilogue right after its own sums, none left pending between
tiles (`AmxTileKernel`'s interleaving): interleaved, the stage-2 product writing the words
took 1.13× as long, alone and warm on one thread.
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.gemm_amx_ir import TILE_COLUMNS, AmxTileKernel, release_tiles_at_returns
from engine.kernels.gemm_ir import I64, TileKernel
from engine.kernels.gemm_preact_ir import PreactEpilogue
from engine.kernels.task_ir import loop


class AmxPreactKernel(PreactEpilogue, AmxTileKernel):
    """`AmxTileKernel` storing, beside C, the next BatchNorm+ReLU's bf16 words (see the
    module). Tiles hold an even number of C's rows (the product's M a multiple of 32)."""

    def define_part(self, name: str, full: ir.Function, edge: ir.Function,
                    fields: dict[str, int]) -> None:
        """`TileKernel.define_part` with no tile pending between tiles (`_run_tile`), the
        tile state released at its returns."""
        TileKernel.define_part(self, name, full, edge, fields)
        release_tiles_at_returns(self, self.module.get_global(name))

    def _run_tile(self, function: ir.Function, builder: ir.IRBuilder, full: ir.Function,
                  edge: ir.Function, arguments: list[Any], rows: Any, columns: Any,
                  columns_outside: Any) -> None:
        """Each tile stored after its own sums (`TileKernel._run_tile`), none pending (see
        the module)."""
        TileKernel._run_tile(self, function, builder, full, edge, arguments, rows, columns,
                             columns_outside)

    def _end_part(self, function: ir.Function, builder: ir.IRBuilder) -> None:
        """Nothing pending: every tile stored its own sums."""
        TileKernel._end_part(self, function, builder)

    def _epilogue(self, function: ir.Function, builder: ir.IRBuilder, floats: Any, rows: Any,
                  vectors: int, masks: list[Any] | None) -> None:
        """A whole tile's ``rows`` rows through both epilogues."""
        terms = self._epilogue_terms(function, builder, vectors, masks)
        count = rows if isinstance(rows, ir.Value) else I64(rows)
        self._either_epilogue(function, builder, terms, count, vectors,
                              lambda adding: self._pairs(function, builder, terms, floats,
                                                         count, masks, adding))

    def _pairs(self, function: ir.Function, builder: ir.IRBuilder, terms: dict[str, Any],
               floats: Any, count: Any, masks: list[Any] | None, adding: bool) -> None:
        """The tile's ``count`` rows, two at a time: each vector's float32 epilogue stored
        to C, then both rows' BatchNorm+ReLU paired into words."""
        with loop(builder, function, I64(0), builder.lshr(builder.add(count, I64(1)), I64(1)),
                  "pair") as pair:
            rows = (builder.mul(pair, I64(2)), builder.add(builder.mul(pair, I64(2)), I64(1)))
            row_shifts = [self._row_shift(builder, terms, row) for row in rows]
            statistics = [self._statistics(builder, terms, row) for row in rows]
            for j in range(self.shape.vectors):
                halves = []
                for row, row_shift, numbers in zip(rows, row_shifts, statistics, strict=True):
                    source = builder.gep(floats, [builder.mul(row, I64(TILE_COLUMNS))])
                    value = builder.load(self._address(builder, source, j), align=64)
                    value = self._stored(builder, terms, row, row_shift, value, j, masks,
                                         adding)
                    halves.append(self._normal(builder, terms, value, numbers))
                self._store_words(builder, terms, pair, j, (halves[0], halves[1]), masks)
