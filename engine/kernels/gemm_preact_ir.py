"""A 1×1 product's epilogue storing its rows of C also as the bf16 words a 1×1 reader takes,
each pair of rows through a per-row scale, shift and clamp first: `PreactEpilogue`, shared by
AMX's tiles (`gemm_amx_preact_ir.AmxPreactKernel`) and the AVX-512 BF16 register tile
(`PairPreactKernel`).

On AMX, as the epilogue stores each pair of rows of C (the float32 sum the next residual
reads), it also works the next ResNet v2 block's BatchNorm and ReLU out of those same values,
still in registers, and stores them as the bf16 words the next 1×1 products read
(`bf16_handoff`'s "words": filter rows ``2p`` and ``2p + 1`` into word row ``p``, the even
one's half low, pixel ``n`` at word ``n``), so that no pass reads the float32 sum back for
them (`gemm_preact`). The words are the BatchNorm pairing pass's (`bf16_pair_ir`'s
``batchnorm_pairs``) to the bit: ``clip(x · scale + shift, low, high)`` with no fused
multiply-add, rounded to nearest even. With a scale of 1 and a shift of -0, on either
kind of tile, they are the product's own output's words (`gemm_preact.words_job`).

The part's context has no room for the words' and statistics' addresses, so the column
bias's slot (a 1×1 product has none) points at a descriptor (`DESCRIPTOR_FIELDS`, int64s)
aligned to `DESCRIPTOR_ALIGNMENT`: a tile's pointer to its column bias is the descriptor's
address plus 4 bytes a column, which the epilogue splits back into both. The float32
epilogue then adds zeros for the column bias, as the plain kernel's does. With
``stores_sum`` off the kernel stores the words alone (no reader but the BatchNorm reads C).
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.gemm_bf16_ir import BFloatType, PairTileKernel
from engine.kernels.gemm_ir import F32, I32, I64
from engine.kernels.task_ir import masked_store

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


class PreactEpilogue:
    """A `gemm_ir.TileKernel` mixin: C's rows stored in pairs, each pair's BatchNorm+ReLU
    stored beside them as bf16 words (see the module). A tile's first row is even."""

    shape: Any
    module: ir.Module
    vector: Any
    masked_store: Any
    # No lines asked for as a tile starts (`TileKernel.asks_large_c`): the words go where
    # the descriptor says, not at C's rows.
    asks_large_c = False

    def __init__(self, shape: Any, stores_sum: bool = True) -> None:
        super().__init__(shape)  # type: ignore[call-arg]
        self.stores_sum = stores_sum  # whether C is stored too, or only the words
        self.words_type = ir.VectorType(I32, shape.width)
        self.halves_type = ir.VectorType(BFloatType(), shape.width)
        self.store_words = masked_store(self.module, self.words_type, "i32")

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

    def _statistics(self, builder: ir.IRBuilder, terms: dict[str, Any],
                    row: Any) -> tuple[Any, Any]:
        """Row ``row``'s BatchNorm scale and shift, splat."""
        return tuple(self._splat(builder, builder.load(builder.gep(terms[name], [row]),
                                                       align=4))
                     for name in ("scale", "shift"))  # type: ignore[return-value]

    def _normal(self, builder: ir.IRBuilder, terms: dict[str, Any], value: Any,
                statistics: tuple[Any, Any]) -> Any:
        """``value``'s BatchNorm and clamp (no fused multiply-add), rounded to bf16."""
        scale, shift = statistics
        normal = builder.fadd(builder.fmul(value, scale), shift)
        normal = builder.select(builder.fcmp_ordered("<", normal, terms["bn_low"]),
                                terms["bn_low"], normal)
        normal = builder.select(builder.fcmp_ordered(">", normal, terms["bn_high"]),
                                terms["bn_high"], normal)
        return builder.fptrunc(normal, self.halves_type)

    def _store_words(self, builder: ir.IRBuilder, terms: dict[str, Any], pair: Any, j: int,
                     halves: tuple[Any, Any], masks: list[Any] | None) -> None:
        """Vector ``j`` of word row ``pair`` (from the tile's first): the even row's
        ``halves`` low, the odd row's high."""
        width = self.shape.width
        order = ir.Constant(ir.VectorType(I32, 2 * width),
                            [lane for index in range(width) for lane in (index, index + width)])
        line = builder.gep(terms["words"], [builder.mul(pair, terms["word_row"])])
        paired = builder.bitcast(builder.shuffle_vector(*halves, order), self.words_type)
        target = builder.bitcast(builder.gep(line, [I64(j * width)]),
                                 self.words_type.as_pointer())
        if masks is None:
            builder.store(paired, target, align=4)
        else:
            builder.call(self.store_words, [paired, target, I32(4), masks[j]])

    def _stored(self, builder: ir.IRBuilder, terms: dict[str, Any], row: Any, row_shift: Any,
                value: Any, j: int, masks: list[Any] | None, adding: bool) -> Any:
        """`TileKernel._finish`'s float32 epilogue of vector ``j`` of row ``row`` (biases,
        the residual where ``adding``, the clamp), stored to C unless the words go alone;
        the values."""
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


class PairPreactKernel(PreactEpilogue, PairTileKernel):
    """The AVX-512 BF16 register tile with `PreactEpilogue`: its tile's rows (12, an even
    number, so every tile starts at an even row) stored two at a time from registers, an odd
    last row of an edge tile paired with zeros (the words' pad past M, which stays zero)."""

    def _store_tile(self, builder: ir.IRBuilder, terms: dict[str, Any],
                    results: list[list[Any]], masks: list[Any] | None, adding: bool) -> None:
        nothing = builder.fptrunc(self.zero, self.halves_type)
        for pair in range(-(-len(results) // 2)):
            rows = [row for row in (2 * pair, 2 * pair + 1) if row < len(results)]
            shifts = [self._row_shift(builder, terms, I64(row)) for row in rows]
            statistics = [self._statistics(builder, terms, I64(row)) for row in rows]
            for j in range(len(results[0])):
                halves = [self._normal(builder, terms, self._stored(
                    builder, terms, I64(row), shift, results[row][j], j, masks, adding),
                    numbers) for row, shift, numbers in zip(rows, shifts, statistics,
                                                            strict=True)]
                self._store_words(builder, terms, I64(pair), j,
                                  (halves[0], halves[1] if len(halves) > 1 else nothing),
                                  masks)
