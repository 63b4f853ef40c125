"""Tile kernels storing C as bf16 halves (16-bit words, a float32's upper half) in place of
float32: `HalvesEpilogue` over AMX's tiles (`gemm_amx_ir.AmxHalvesKernel`) and over the
register tiles (`FloatHalvesKernel`, `PairHalvesKernel`).

Each value is the float32 epilogue's (biases, then the clamp), rounded as the pairing pass
rounds it (``fptrunc``: to nearest even), row ``i`` at ``c + i·ldc`` halves. A 1×1 product's
output so written is the bf16 planes its depthwise reader takes (`bf16_handoff.take_planes`):
half the bytes stored, and half read back. No residual is added.

The part works out a tile's corner of C at 4 bytes an element; the context holds twice the
halves' address as C's, so that half the part's corner is the tile's corner in halves
(`HalvesEpilogue._run_tile`).
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.gemm_bf16_ir import BFloatType, PairTileKernel
from engine.kernels.gemm_ir import F32, I32, I64, NarrowEdgeTileKernel
from engine.kernels.task_ir import masked_store

I16 = ir.IntType(16)


class HalvesEpilogue:
    """A `gemm_ir.TileKernel` mixin: C stored as bf16 halves (see the module)."""

    shape: Any
    module: ir.Module
    # No lines of C asked for as a tile starts (`TileKernel.asks_large_c`): MobileNet v2's
    # expanding products at 112² to 28², a K of 8 to 16 pairs, ran 1.03-1.05× as long asking
    # for their halves' lines (`bench/variants.py`, one Zen 4 core).
    asks_large_c = False

    def __init__(self, shape: Any) -> None:
        super().__init__(shape)  # type: ignore[call-arg]
        self.halves_type = ir.VectorType(BFloatType(), shape.width)
        self.bits_type = ir.VectorType(I16, shape.width)
        self.store_bits = masked_store(self.module, self.bits_type, "i16")

    def _run_tile(self, function: ir.Function, builder: ir.IRBuilder, full: ir.Function,
                  edge: ir.Function, arguments: list[Any], rows: Any, columns: Any,
                  columns_outside: Any) -> None:
        """The tile with its corner of C halved (see the module), which also stands for the
        residual: none is added."""
        corner = builder.inttoptr(builder.lshr(builder.ptrtoint(arguments[6], I64), I64(1)),
                                  F32.as_pointer())
        arguments = [*arguments[:6], corner, *arguments[7:12], corner, *arguments[13:]]
        super()._run_tile(function, builder, full, edge, arguments, rows,  # type: ignore[misc]
                          columns, columns_outside)

    def _finish(self, builder: ir.IRBuilder, terms: dict[str, Any], row: Any, row_shift: Any,
                value: Any, j: int, masks: list[Any] | None, adding: bool) -> None:
        """Vector ``j`` of row ``row``'s sums with its biases, clamped, rounded to bf16 and
        stored as halves (``adding`` never holds: the residual is C, `_run_tile`)."""
        value = builder.fadd(builder.fadd(value, row_shift), terms["shifts"][j])
        value, offset, mask = self._placed(  # type: ignore[attr-defined]
            builder, self._clamp(builder, terms, value), j, masks)  # type: ignore[attr-defined]
        bits = builder.bitcast(builder.fptrunc(value, self.halves_type), self.bits_type)
        target = builder.bitcast(self._halves_at(builder, terms["c"], terms["ldc"], row, offset),
                                 self.bits_type.as_pointer())
        if mask is None:
            builder.store(bits, target, align=2)
        else:
            builder.call(self.store_bits, [bits, target, I32(2), mask])

    @staticmethod
    def _halves_at(builder: ir.IRBuilder, c: Any, ldc: Any, row: Any, offset: Any) -> Any:
        """Half ``offset`` of row ``row`` of C (``ldc`` halves a row)."""
        halves = builder.bitcast(c, I16.as_pointer())
        return builder.gep(halves, [builder.add(builder.mul(row, ldc), offset)])


class FloatHalvesKernel(HalvesEpilogue, NarrowEdgeTileKernel):
    """The float32 register tile storing halves. Its edge tiles all take the row-wise loop
    (no tile of a column a vector, whose epilogue stores element by element)."""

    def _narrow_columns(self) -> int:
        return 0


class PairHalvesKernel(HalvesEpilogue, PairTileKernel):
    """The AVX-512 BF16 register tile storing halves."""
