"""The LLVM IR of the 3×3, stride-2, pad-1 max pooling with each output row in 16-lane vectors.

``max_pool_3x3_s2`` is a `spin_pool` task ``(context, part, parts)`` over the planes (float32
``(planes, H, W)`` into ``(planes, OH, OW)``); ``context`` holds the int64 words `FIELDS`
names: the input's and output's addresses, the planes, H, W, OH and OW, the output rows
[first, last) it writes of each plane, and the floats from one input plane to the next (a
product writing the input in bands of rows pools each band's rows after it, its planes' rows
from the band's in a buffer of a few rows: `banded_pool`). It is ResNet's pooling after the
stem (64 × 112² → 56² an image).

A plane is walked one column of 16 outputs at a time, down its rows. An input row is read as
32 adjacent floats from column ``2x - 1`` and one more (three masked loads); shuffles keep
its even lanes (columns ``2x - 1``), its odd ones (``2x``) and the even ones one further on
(``2x + 1``), and their maximum is the row's share of the 16 windows. Output row ``y`` takes
the maximum of input rows ``2y - 1``, ``2y`` and ``2y + 1``'s shares: the last of them is
carried in a register into output row ``y + 1``, where it is the first, so each input row is
read and reduced across once; a range of rows from ``first`` > 0 reduces input row
``2·first - 1`` first to start its carry. The masks leave out the columns outside the plane
and the rows below it (the full convention's last windows), which read as -inf, so no padded
copy is made and no edge is handled apart; a window wholly outside is -inf, as in the other
bindings.

NaN wins, as in ``np.maximum``: each maximum of three is an ordered one (``select`` on ``>``,
a vector max instruction) beside one unordered test of the three, where the three's sum,
which is then NaN, is taken instead (the same rule as `pool_kernel`'s ``_max3``).
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.task_ir import (
    F32,
    I32,
    I64,
    FloatVectors,
    fields,
    loop,
    task,
)

LANES = FloatVectors.LANES
FIELDS = ("source", "target", "planes", "height", "width", "out_height", "out_width",
          "first_row", "last_row", "source_plane")
TASK = "max_pool_3x3_s2"
BLOCKS = (0, LANES, 2 * LANES)  # a read's three loads, in floats from column 2x - 1
I16 = ir.IntType(16)


def module() -> ir.Module:
    """A module holding `TASK`."""
    built = ir.Module(name="hybridserve_max_pool")
    _Kernel(built).define()
    return built


class _Kernel(FloatVectors):
    def __init__(self, built: ir.Module) -> None:
        super().__init__(built)
        self.lowest = ir.Constant(self.floats, [float("-inf")] * LANES)

    def define(self) -> None:
        function, builder, context, part, parts = task(self.module, TASK)
        field = fields(builder, context, FIELDS)
        first = builder.sdiv(builder.mul(part, field["planes"]), parts)
        last = builder.sdiv(builder.mul(builder.add(part, I64(1)), field["planes"]), parts)
        height, width, out_width = field["height"], field["width"], field["out_width"]
        vectors = builder.sdiv(builder.add(out_width, I64(LANES - 1)), I64(LANES))
        # each column of vectors' share of the input row the last output row read last
        carried = builder.alloca(self.floats, size=vectors, name="carried")
        masks = self._mask_table(builder, function, vectors, width, out_width)
        with loop(builder, function, first, last, "plane") as plane:
            source = builder.gep(builder.inttoptr(field["source"], F32.as_pointer()),
                                 [builder.mul(plane, field["source_plane"])])
            target = builder.gep(builder.inttoptr(field["target"], F32.as_pointer()),
                                 [builder.mul(plane, builder.mul(field["out_height"],
                                                                 out_width))])
            above = builder.sub(builder.mul(field["first_row"], I64(2)), I64(1))
            above_row = (builder.gep(source, [builder.sub(builder.mul(above, width), I64(1))]),
                         self._all_or_none(builder, builder.icmp_signed(">=", above, I64(0))))
            # the carry into the first row: input row 2·first - 1's share (-inf above row 0)
            with loop(builder, function, I64(0), vectors, "first_row") as vector:
                builder.store(self._across(builder, *above_row, self._lanes(
                    builder, masks, vector), builder.mul(vector, I64(LANES))),
                    builder.gep(carried, [vector]))
            with loop(builder, function, field["first_row"], field["last_row"], "row") as row:
                line = builder.mul(row, I64(2))
                rows = []
                for offset in (0, 1):  # input rows 2·row and 2·row + 1: their first read
                    at = builder.add(line, I64(offset))
                    rows.append((builder.gep(source, [builder.sub(builder.mul(at, width),
                                                                  I64(1))]),
                                 self._all_or_none(builder, builder.icmp_signed("<", at,
                                                                                height))))
                written = builder.gep(target, [builder.mul(row, out_width)])
                with loop(builder, function, I64(0), vectors, "vector") as vector:
                    self._vector(builder, rows, written, builder.gep(carried, [vector]),
                                 masks, vector)
        builder.ret_void()

    def _mask_table(self, builder: ir.IRBuilder, function: ir.Function, vectors: Any,
                    width: Any, out_width: Any) -> Any:
        """Per column of vectors, four 16-bit masks: the lanes of its three reads whose input
        columns lie in [0, W) and the outputs it stores. Made once per task: each as lane
        compares in the loop cost more than the pooling itself."""
        table = builder.alloca(I16, size=builder.mul(vectors, I64(4)), name="masks")
        with loop(builder, function, I64(0), vectors, "masks") as vector:
            column = builder.mul(vector, I64(LANES))
            start = builder.sub(builder.mul(column, I64(2)), I64(1))  # input column of lane 0
            made = [self._columns_inside(builder, builder.add(start, I64(block)), width)
                    for block in BLOCKS]
            made.append(builder.trunc(_lanes_before(builder, builder.sub(out_width, column)),
                                      I16))
            for index, bits in enumerate(made):
                builder.store(bits, builder.gep(table, [builder.add(
                    builder.mul(vector, I64(4)), I64(index))]))
        return table

    def _vector(self, builder: ir.IRBuilder, rows: list[tuple[Any, Any]], written: Any,
                slot: Any, masks: Any, vector: Any) -> None:
        """Outputs [16 · vector, 16 · vector + 16) of an output row: the share carried in
        ``slot`` of input row 2·row - 1 and those of ``rows`` (2·row and 2·row + 1: the
        address of column -1 and their mask, all lanes or none), the last one carried on."""
        column = builder.mul(vector, I64(LANES))
        lanes = self._lanes(builder, masks, vector)
        below = self._across(builder, *rows[1], lanes, column)
        largest = self._max3(builder, builder.load(slot),
                             self._across(builder, *rows[0], lanes, column), below)
        builder.store(below, slot)
        builder.call(self.masked_store, [largest, builder.bitcast(
            builder.gep(written, [column]), self.floats.as_pointer()), I32(4),
            builder.bitcast(lanes[3], self.mask)])

    @staticmethod
    def _lanes(builder: ir.IRBuilder, masks: Any, vector: Any) -> list[Any]:
        """Column of vectors ``vector``'s four masks (`_mask_table`)."""
        return [builder.load(builder.gep(masks, [builder.add(builder.mul(vector, I64(4)),
                                                             I64(index))]))
                for index in range(4)]

    def _across(self, builder: ir.IRBuilder, line: Any, inside: Any, lanes: list[Any],
                column: Any) -> Any:
        """An input row's maximum over the three columns of each of the 16 outputs from
        ``column`` (``line``: the row's column -1; -inf where ``inside`` is none: a row
        outside the plane)."""
        at = builder.gep(line, [builder.mul(column, I64(2))])
        first, second, third = [
            self._load(builder, at, I64(block), builder.bitcast(
                builder.and_(bits, inside), self.mask))
            for block, bits in zip(BLOCKS, lanes, strict=False)]
        even = builder.shuffle_vector(first, second, _order(range(0, 2 * LANES, 2)))
        odd = builder.shuffle_vector(first, second, _order(range(1, 2 * LANES, 2)))
        after = builder.shuffle_vector(even, third, _order(range(1, LANES + 1)))
        return self._max3(builder, even, odd, after)

    def _max3(self, builder: ir.IRBuilder, a: Any, b: Any, c: Any) -> Any:
        """The largest of ``a``, ``b`` and ``c`` lane by lane, NaN where any of them is."""
        larger = builder.select(builder.fcmp_ordered(">", b, a), b, a)
        larger = builder.select(builder.fcmp_ordered(">", c, larger), c, larger)
        unordered = builder.or_(builder.fcmp_unordered("uno", a, b),
                                builder.fcmp_unordered("uno", c, c))
        return builder.select(unordered, builder.fadd(builder.fadd(a, b), c), larger)

    def _columns_inside(self, builder: ir.IRBuilder, first: Any, width: Any) -> Any:
        """The 16 bits of lanes whose input column ``first + lane`` lies in [0, W)."""
        bits = builder.and_(_lanes_before(builder, builder.sub(width, first)),
                            builder.not_(_lanes_before(builder, builder.neg(first))))
        return builder.trunc(bits, I16)

    @staticmethod
    def _all_or_none(builder: ir.IRBuilder, condition: Any) -> Any:
        """16 bits all set where ``condition`` holds, none where not."""
        return builder.select(condition, I16(-1), I16(0))

    def _load(self, builder: ir.IRBuilder, source: Any, at: Any, mask: Any) -> Any:
        """16 floats from ``source[at]`` on, those outside ``mask`` read as -inf (and never
        touched: a masked lane may lie outside the plane)."""
        address = builder.bitcast(builder.gep(source, [at]), self.floats.as_pointer())
        return builder.call(self.masked_load, [address, I32(4), mask, self.lowest])


def _lanes_before(builder: ir.IRBuilder, count: Any) -> Any:
    """The 64-bit word with bits [0, count) set, ``count`` clamped to [0, 16]."""
    clamped = builder.select(builder.icmp_signed("<", count, I64(0)), I64(0), count)
    clamped = builder.select(builder.icmp_signed(">", clamped, I64(LANES)), I64(LANES),
                             clamped)
    return builder.sub(builder.shl(I64(1), clamped), I64(1))


def _order(lanes: Any) -> ir.Constant:
    return ir.Constant(ir.VectorType(I32, LANES), list(lanes))
