"""The AMX 1×1 product of a ResNet v2 block's end writing the next block's pre-activation too.

`AmxPreactKernel` is `gemm_amx_ir.AmxTileKernel` whose epilogue, as it stores each pair of
rows of C (the float32 sum the next residual reads), also works the next block's BatchNorm
and ReLU out of those same values, still in registers, and stores them as the bf16 words the
next 1×1 products read (`bf16_handoff`'s "words": filter rows ``2p`` and ``2p + 1`` into word
row ``p``, the even one's half low, pixel ``n`` at word ``n``), so that no pass reads the
float32 sum back for them (`gemm_amx_preact`). The words are the BatchNorm pairing pass's
(`bf16_pair_ir`'s ``batchnorm_pairs``) to the bit: ``clip(x · scale + shift, low, high)``
with no fused multiply-add, rounded to nearest even.

The part's context has no room for the words' and statistics' addresses, so the column
bias's slot (a 1×1 product has none) points at a descriptor (`DESCRIPTOR_FIELDS`, int64s)
aligned to `DESCRIPTOR_ALIGNMENT`: a tile's pointer to its column bias is the descriptor's
address plus 4 bytes a column, which the epilogue splits back into both. The float32
epilogue then adds zeros for the column bias, as the plain kernel's does.

Each tile goes through the epilogue right after its own sums, none left pending between
tiles (`AmxTileKernel`'s interleaving): interleaved, the stage-2 product writing the words
took 1.13× as long, alone and warm on one thread. With ``stores_sum`` off the kernel stores
the words alone (no reader but the BatchNorm reads C).
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.gemm_amx_ir import (
    TILE_COLUMNS,
    WORDS,
    AmxTileKernel,
    release_tiles_at_returns,
)
from engine.kernels.gemm_bf16_ir import BFloatType
from engine.kernels.gemm_ir import F32, I32, I64, TileKernel
from engine.kernels.task_ir import loop, masked_store

# The descriptor's int64 fields: the words' address and word-row length, the per-channel
# scale and shift (float32 arrays of C's rows), the rows bias's address (a tile's row is
# its pointer's distance from it), the clamp after the BatchNorm (float32 bits), and the
# address of C's first element (a tile's row and pixel are its C pointer's distance from it
# in rows of ``ldc``: a batch of products writing one output's rows in turn, such as a
# stem's output rows, writes each its own pixels' words).
DESCRIPTOR_FIELDS = {name: index for index, name in enumerate(
    ("words", "word_row", "scale", "shift", "rows_bias", "low", "high", "c_base"))}
# A descriptor's address has its low 16 bits clear, so C's columns up to 2¹⁴ fit below.
DESCRIPTOR_ALIGNMENT = 1 << 16


class AmxPreactKernel(AmxTileKernel):
    """`AmxTileKernel` storing, beside C, the next BatchNorm+ReLU's bf16 words (see the
    module). Tiles hold an even number of C's rows (the product's M a multiple of 32)."""

    def __init__(self, shape: Any, stores_sum: bool = True) -> None:
        super().__init__(shape)
        self.stores_sum = stores_sum  # whether C is stored too, or only the words
        self.words_type = ir.VectorType(I32, WORDS)
        self.halves_type = ir.VectorType(BFloatType(), WORDS)
        self.store_words = masked_store(self.module, self.words_type, "i32")

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

    def _epilogue_terms(self, function: ir.Function, builder: ir.IRBuilder, vectors: int,
                        masks: list[Any] | None) -> dict[str, Any]:
        """`TileKernel._epilogue_terms` with the column bias zeros (its slot is the
        descriptor's) and the descriptor's fields: the tile's first word row and column,
        its rows' scale and shift, the BatchNorm's bounds."""
        c, ldc, rows_at, columns_at, low, high, residual = function.args[6:13]
        present = builder.icmp_unsigned("!=", builder.ptrtoint(residual, I64),
                                        builder.ptrtoint(c, I64))
        zero = ir.Constant(self.vector, [0.0] * self.shape.width)
        terms = {"c": c, "ldc": ldc, "rows": rows_at, "residual": residual,
                 "present": present, "shifts": [zero] * vectors,
                 "low": self._splat(builder, low), "high": self._splat(builder, high)}
        pointer = builder.ptrtoint(columns_at, I64)
        base = builder.and_(pointer, I64(-DESCRIPTOR_ALIGNMENT))
        fields = builder.inttoptr(base, I64.as_pointer())

        def field(name: str) -> Any:
            return builder.load(builder.gep(fields, [I64(DESCRIPTOR_FIELDS[name])]), align=8)

        # bytes from the rows bias's start to the tile's first row: as far into each table
        row_bytes = builder.sub(builder.ptrtoint(rows_at, I64), field("rows_bias"))
        # the tile's first row and pixel: its corner's floats from C's first element
        offset = builder.lshr(builder.sub(builder.ptrtoint(c, I64), field("c_base")), I64(2))
        first_row, pixel = builder.udiv(offset, ldc), builder.urem(offset, ldc)
        word_row = field("word_row")
        words = builder.add(field("words"), builder.mul(
            builder.add(builder.mul(builder.lshr(first_row, I64(1)), word_row), pixel), I64(4)))
        terms.update({
            "words": builder.inttoptr(words, I32.as_pointer()), "word_row": word_row,
            "scale": builder.inttoptr(builder.add(field("scale"), row_bytes), F32.as_pointer()),
            "shift": builder.inttoptr(builder.add(field("shift"), row_bytes), F32.as_pointer()),
            "bn_low": self._splat(builder, self._float_bits(builder, field("low"))),
            "bn_high": self._splat(builder, self._float_bits(builder, field("high")))})
        return terms

    @staticmethod
    def _float_bits(builder: ir.IRBuilder, word: Any) -> Any:
        return builder.bitcast(builder.trunc(word, I32), F32)

    def _epilogue(self, function: ir.Function, builder: ir.IRBuilder, floats: Any, rows: Any,
                  vectors: int, masks: list[Any] | None) -> None:
        """A whole tile's ``rows`` rows through both epilogues."""
        terms = self._epilogue_terms(function, builder, vectors, masks)
        count = rows if isinstance(rows, ir.Value) else I64(rows)
        self._either_epilogue(function, builder, terms, count, vectors,
                              lambda adding: self._pairs(function, builder, terms, floats,
                                                         I64(0), count, masks, adding))

    def _pairs(self, function: ir.Function, builder: ir.IRBuilder, terms: dict[str, Any],
               floats: Any, first: Any, last: Any, masks: list[Any] | None,
               adding: bool) -> None:
        """Rows [first, last), two at a time: each vector's float32 epilogue stored to C
        (`TileKernel._finish`'s values), then both rows' BatchNorm+ReLU paired into words."""
        order = ir.Constant(ir.VectorType(I32, 2 * WORDS),
                            [lane for index in range(WORDS) for lane in (index, index + WORDS)])
        with loop(builder, function, builder.lshr(first, I64(1)),
                  builder.lshr(builder.add(last, I64(1)), I64(1)), "pair") as pair:
            rows = (builder.mul(pair, I64(2)), builder.add(builder.mul(pair, I64(2)), I64(1)))
            row_shifts = [self._row_shift(builder, terms, row) for row in rows]
            statistics = [tuple(self._splat(builder, builder.load(
                builder.gep(terms[name], [row]), align=4)) for name in ("scale", "shift"))
                for row in rows]
            line = builder.gep(terms["words"], [builder.mul(pair, terms["word_row"])])
            for j in range(self.shape.vectors):
                halves = []
                for row, row_shift, (scale, shift) in zip(rows, row_shifts, statistics,
                                                          strict=True):
                    source = builder.gep(floats, [builder.mul(row, I64(TILE_COLUMNS))])
                    value = builder.load(self._address(builder, source, j), align=64)
                    value = self._stored(builder, terms, row, row_shift, value, j, masks,
                                         adding)
                    normal = builder.fadd(builder.fmul(value, scale), shift)
                    normal = builder.select(builder.fcmp_ordered("<", normal, terms["bn_low"]),
                                            terms["bn_low"], normal)
                    normal = builder.select(builder.fcmp_ordered(">", normal, terms["bn_high"]),
                                            terms["bn_high"], normal)
                    halves.append(builder.fptrunc(normal, self.halves_type))
                paired = builder.bitcast(builder.shuffle_vector(halves[0], halves[1], order),
                                         self.words_type)
                target = builder.bitcast(builder.gep(line, [I64(j * WORDS)]),
                                         self.words_type.as_pointer())
                if masks is None:
                    builder.store(paired, target, align=4)
                else:
                    builder.call(self.store_words, [paired, target, I32(4), masks[j]])

    def _stored(self, builder: ir.IRBuilder, terms: dict[str, Any], row: Any, row_shift: Any,
                value: Any, j: int, masks: list[Any] | None, adding: bool) -> Any:
        """`TileKernel._finish`'s float32 epilogue of vector ``j`` of row ``row`` (biases,
        the residual where ``adding``, the clamp), stored to C; the values stored."""
        value = builder.fadd(builder.fadd(value, row_shift), terms["shifts"][j])
        line = builder.mul(row, terms["ldc"])
        offset, mask = self._offset(builder, j), None if masks is None else masks[j]
        if adding:
            value = self._plus_residual(builder, terms, line, offset, mask, value)
        value = self._clamp(builder, terms, value)
        if not self.stores_sum:
            return value
        target = self._vector_at(builder, builder.gep(terms["c"], [line]), offset)
        if mask is None:
            builder.store(value, target, align=4)
        else:
            builder.call(self.masked_store, [value, target, I32(4), mask])
        return value
