"""The LLVM IR of the 3×3, pad-1 depthwise convolution with each output row in vectors of 16
lanes (8 on a host with AVX2 alone).

``depthwise_3x3_s1`` and ``depthwise_3x3_s2`` (stride 1 and 2 on both axes),
``depthwise_3x3_s1_stacked`` (stride 1 over planes 8 columns wide or less, `stacks`), and
their ``_paired`` forms, are `spin_pool` tasks ``(context, part, parts)`` over the planes
(sample-major ``(planes, H, W)`` float32, a plane's channel ``plane % channels``);
``context`` holds int64s (`FIELDS`): the input's, output's, weights' ((channels, 9)) and
bias's ((channels,)) addresses, the planes, channels, H, W, the output's H and W, the
clamp's bounds as float64 bits, and (paired) the row stride of the words in words.

A paired task writes no float32 plane: each output, clamped, is rounded to bf16 (``fptrunc``,
as `bf16_pair_ir`'s pairing pass rounds) into one half of a word of AMX's right operand,
paired down its columns (`bf16`): word ``(c // 2, y · OW + x)``, its low half for an even
channel ``c`` and its high half for an odd one, by a 16-bit masked store that leaves the other
half, another plane's, as it is (one sample: ``target`` is the words).

An output vector is 16 adjacent outputs of one row: the bias, plus nine fused multiply-adds of
a broadcast weight and 16 inputs read by masked loads. The masks leave out the columns outside
the plane (the left and right padding) and the rows below it, so padded cells read as zero, no
padded copy is made and no edge is handled apart. A plane is walked one column of vectors at a
time, down its rows: each input row's three reads stay in registers for every output row that
needs them (three at stride 1, two at stride 2), so an output vector costs three masked loads
at stride 1, and the column masks are made once per column. Only the last output row can read
a row below the plane: it is built apart, after the loop over the others, whose loads take the
column masks alone (no test of the row in each vector; 14² layers 0.84–0.86× in float32).
Stride 2 reads 32 adjacent floats per input row (and one more) and keeps the even and the odd
ones by shuffles. The walk prefetches the input rows `AHEAD_ROWS` ahead, which it reads 448
bytes apart at 112², a pattern the hardware prefetchers follow poorly (32 × 112² from out of
cache, one thread: 128 → 118 µs); a paired task asks for its words' lines as far ahead, for
writing. The sum is clamped as ``clip`` does (NaN stays NaN) and stored under the row's tail
mask.

A ``_from_bf16`` task reads its input planes as bf16 (16-bit halves, uint16 arrays: a
float32's upper half, as a writer rounding to bf16 lays them) in place of float32: the same
walk, each masked load of 16 halves widened to the floats they are, so that a wide layer whose
input streams from memory reads half its bytes. Its sums are the float32 task's over those
floats, to the bit. Only the column walk has it (the stacked task's narrow planes stay in
cache).

A plane 8 columns wide or less would leave most of a row's vector idle (9 lanes of 16 at 7²):
the stacked task puts two rows or more in a vector, ``16 // W`` whole rows, lane ``j`` in row
``j // W`` and column ``j % W``. In the plane's flat run, tap (ky, kx) of the output at ``s +
j`` reads the input at ``s + j + (ky - 1) · W + kx - 1``: nine masked loads a vector, their
masks leaving out the columns across a row's end, the rows outside the plane and the lanes
past the vector's rows, made once per task for the vectors between the first and the last
(whose rows are all inside). A 7 × 7 plane is four vectors, not seven: MobileNet v2's 960 ×
7² layers alone 0.81× (float32 and paired).

On a host with AVX2 and no AVX-512 the module is built with 8-lane vectors
(``module(8, plain_inside=True)``): there a masked store is ``vmaskmovps``, many µops on
AMD's Zen 3, so a column of vectors that its outputs fill stores them plainly, and one whose
reads all lie inside the plane's rows loads them plainly too; and each input row's three
taps are summed apart, the three sums added last (three dependent multiply-adds an output
vector, not nine; the sums round differently from the one chain's, within float32's
rounding). The stacked task stacks planes of 4 columns or fewer there: 7² planes take the
column walk, 7 lanes of 8 used. MobileNet v2 fp32 on Zen 3, one thread, the depthwise steps
timed in order in a run (best of 100, thread time): 2.65 ms under numba's kernels, 1.67 so
(docs/benchmarks.md).

numba's kernels (`depthwise_kernel`) vectorise a plane's flat runs, whose loops over a 7×7
or 14×14 plane are mostly remainders, and stride 2 fills a phase grid first; here every row is
one to seven vectors whatever its width. In the generated loop an output vector is 25
instructions: 3 loads, 9 FMAs, the clamp's max and min (in the order that keeps NaN), one
store, two prefetches and the masks' and loop's bookkeeping (about 3.5 ns on data in L2).
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.gemm_bf16_ir import BFloatType
from engine.kernels.task_ir import (
    F32,
    I32,
    I64,
    FloatVectors,
    as_float,
    carrying_loop,
    fields,
    loop,
    masked_load,
    masked_store,
    splat,
    task,
    when,
)

LANES = FloatVectors.LANES
TAPS = 9
FIELDS = ("source", "target", "weights", "bias", "planes", "channels", "height", "width",
          "out_height", "out_width", "low", "high", "word_stride")
STRIDES = (1, 2)
AHEAD_ROWS = 8  # how many input rows ahead a column's walk prefetches
# Whether a paired task asks for its words' lines `AHEAD_ROWS` rows on, for writing: a 16-bit
# store into half of each word must have its line first. MobileNet v2 bf16 at batch 1 on one
# Zen 4 core (`bench/variants.py`): its layers at 112², 56² and 28² 0.89-0.99×; float32 planes,
# stored whole, 0.93-1.09×, are not asked for. (A constant so that a benchmark can turn it off.)
ASKS_WORDS_AHEAD = True


I16 = ir.IntType(16)


def task_name(stride: int, paired: bool = False, stacked: bool = False,
              from_bf16: bool = False) -> str:
    """The task's function name for ``stride``, writing float32 planes or (``paired``) bf16
    pairs; ``stacked``: the stride-1 task for narrow planes (`stacks`); ``from_bf16``: reading
    bf16 planes (`module`)."""
    return (f"depthwise_3x3_s{stride}" + ("_stacked" if stacked else "")
            + ("_from_bf16" if from_bf16 else "") + ("_paired" if paired else ""))


def stacks(width: int, stride: int, lanes: int = LANES) -> bool:
    """Whether planes ``width`` wide take the stacked task of vectors of ``lanes``: stride 1,
    and two rows or more to a vector (a row to a vector would leave most lanes idle: 9 of 16
    at 7²)."""
    return stride == 1 and 0 < 2 * width <= lanes


def module(lanes: int = LANES, plain_inside: bool = False) -> ir.Module:
    """A module holding the tasks of every stride in `STRIDES` and the stacked stride-1 task,
    each writing float32 planes and bf16 pairs; and the tasks of every stride in `STRIDES`
    reading bf16 planes (16-bit halves, a float32's upper half, ``from_bf16``) in place of
    float32 ones, for the wide planes whose float32 input streams from memory (96 × 112² is
    4.8 MB in float32). Its vectors are ``lanes`` floats wide. ``plain_inside``: the float32
    tasks' column walk reads and writes the columns of vectors that lie wholly inside the
    plane by plain loads and stores, the masked ones kept for the edge columns (see
    `_Kernel._column`)."""
    built = ir.Module(name="hybridserve_depthwise")
    kernel = _Kernel(built, lanes, plain_inside)
    for stride, stacked in [*((stride, False) for stride in STRIDES), (1, True)]:
        for paired in (False, True):
            kernel.define(stride, paired, stacked)
    for stride in STRIDES:
        for paired in (False, True):
            kernel.define(stride, paired, from_bf16=True)
    return built


class _Kernel(FloatVectors):
    def __init__(self, built: ir.Module, lanes: int = LANES, plain_inside: bool = False) -> None:
        super().__init__(built, lanes)
        self.plain_inside = plain_inside
        self.bits = ir.VectorType(I16, self.lanes)
        self.load_halves = masked_load(built, self.bits, "i16")
        self.halves = ir.VectorType(BFloatType(), self.lanes)
        self.spread = ir.VectorType(I16, 2 * self.lanes)
        self.store_halves = masked_store(built, self.spread, "i16")
        self.fmuladd = ir.Function(built, ir.FunctionType(self.floats, [self.floats] * 3),
                                   name=f"llvm.fmuladd.v{self.lanes}f32")
        self.prefetch = ir.Function(built, ir.FunctionType(
            ir.VoidType(), [F32.as_pointer(), I32, I32, I32]), name="llvm.prefetch.p0")

    def define(self, stride: int, paired: bool, stacked: bool = False,
               from_bf16: bool = False) -> None:
        function, builder, context, part, parts = task(
            self.module, task_name(stride, paired, stacked, from_bf16))
        field = fields(builder, context, FIELDS)
        field["from_bf16"] = from_bf16
        field["bounds"] = [splat(builder, as_float(builder, field[name]), self.floats)
                           for name in ("low", "high")]
        field["stacked"] = self._lane_places(builder, field) if stacked else None
        first = builder.sdiv(builder.mul(part, field["planes"]), parts)
        last = builder.sdiv(builder.mul(builder.add(part, I64(1)), field["planes"]), parts)
        with loop(builder, function, first, last, "plane") as plane:
            self._plane(builder, function, field, plane, stride, paired)
        builder.ret_void()

    def _plane(self, builder: ir.IRBuilder, function: ir.Function, field: dict[str, Any],
               plane: Any, stride: int, paired: bool) -> None:
        channel = builder.srem(plane, field["channels"])
        weights = builder.gep(builder.inttoptr(field["weights"], F32.as_pointer()),
                              [builder.mul(channel, I64(TAPS))])
        taps = [splat(builder, builder.load(builder.gep(weights, [I64(tap)]), align=4),
                            self.floats) for tap in range(TAPS)]
        bias = builder.load(builder.gep(builder.inttoptr(field["bias"], F32.as_pointer()),
                                        [channel]), align=4)
        height, width = field["height"], field["width"]
        element = I16 if field["from_bf16"] else F32
        source = builder.gep(builder.inttoptr(field["source"], element.as_pointer()),
                             [builder.mul(plane, builder.mul(height, width))])
        if paired:
            # the plane's bf16 halves: word row ``channel // 2`` of the words, the low or the
            # high half of each word (as 16-bit units: two a word)
            halves = builder.add(builder.mul(builder.sdiv(channel, I64(2)),
                                             builder.mul(field["word_stride"], I64(2))),
                                 builder.srem(channel, I64(2)))
            target = builder.gep(builder.inttoptr(field["target"], I16.as_pointer()), [halves])
        else:
            target = builder.gep(builder.inttoptr(field["target"], F32.as_pointer()),
                                 [builder.mul(plane, builder.mul(field["out_height"],
                                                                 field["out_width"]))])
        plane_field = dict(field, source=source, target=target, taps=taps, paired=paired,
                           shift=splat(builder, bias, self.floats))
        if field["stacked"] is not None:
            self._stacked_plane(builder, function, plane_field)
            return
        # Down one column of vectors at a time: an input row's three reads serve each output
        # row that reads it (three at stride 1, two at stride 2) from registers, so a vector
        # of outputs costs three or six masked loads, not nine; and the column masks are made
        # once per column.
        with loop(builder, function, I64(0), field["out_width"], "column", self.lanes) as column:
            self._column(builder, function, plane_field, column, stride)

    def _column(self, builder: ir.IRBuilder, function: ir.Function, field: dict[str, Any],
                column: Any, stride: int) -> None:
        """One column of output vectors, down the plane's rows. With ``plain_inside`` (float32
        planes), a column whose reads all lie inside the plane's rows reads them by plain
        loads, and one whose outputs fill its vectors stores them by plain stores; the others
        take the masked ones. Why: without AVX-512, a masked store is ``vmaskmovps``, on AMD's
        Zen 3 many µops a store, where a plain one is one."""
        if not self.plain_inside or field["paired"] or field["from_bf16"]:
            self._walk(builder, function, field, column, stride, False, False)
            return
        start = builder.sub(builder.mul(column, I64(stride)), I64(1))
        reach = self.lanes + 2 if stride == 1 else 3 * self.lanes  # floats read from start
        full = builder.icmp_signed("<=", builder.add(column, I64(self.lanes)), field["out_width"])
        inside = builder.and_(full, builder.and_(
            builder.icmp_signed(">=", start, I64(0)),
            builder.icmp_signed("<=", builder.add(start, I64(reach)), field["width"])))
        with builder.if_else(inside) as (plain, edge):
            with plain:
                self._walk(builder, function, field, column, stride, True, True)
            with edge, builder.if_else(full) as (whole, part):
                with whole:
                    self._walk(builder, function, field, column, stride, False, True)
                with part:
                    self._walk(builder, function, field, column, stride, False, False)

    def _walk(self, builder: ir.IRBuilder, function: ir.Function, field: dict[str, Any],
              column: Any, stride: int, plain_loads: bool, plain_stores: bool) -> None:
        """`_column`'s walk down the rows; ``plain_loads``: the column's reads lie inside the
        plane's rows, made without masks (but for the last row's reads below the plane);
        ``plain_stores``: its outputs fill their vectors, stored without masks."""
        height, out_width = field["height"], field["out_width"]
        start = builder.sub(builder.mul(column, I64(stride)), I64(1))  # input column of lane 0
        blocks = (0, 1, 2) if stride == 1 else (0, self.lanes, 2 * self.lanes)
        masks = [None if plain_loads else self._columns_inside(
            builder, builder.add(start, I64(block)), field["width"]) for block in blocks]
        stored = None if plain_stores else self._lanes_below(builder,
                                                             builder.sub(out_width, column))
        paired = field["paired"]
        # an output's place: one float, or (paired) one 16-bit half every other unit
        spacing = 2 if paired else 1
        written = builder.gep(field["target"], [builder.mul(column, I64(spacing))])
        if paired:  # every other 16-bit unit of the 16 words: the lanes' mask spread once
            stored = builder.shuffle_vector(stored, ir.Constant(self.mask, [0] * self.lanes),
                                            self._spread_order())
        zero = ir.Constant(self.floats, [0.0] * self.lanes)

        def reads(line: Any, last: bool = False) -> list[Any]:
            """Input row ``line`` under the column masks (the last output row's: and only
            where the row lies inside the plane; every row before it reads one that does)."""
            at = builder.add(builder.mul(line, field["width"]), start)
            if AHEAD_ROWS and not last:
                ahead = builder.add(at, builder.mul(I64(AHEAD_ROWS), field["width"]))
                for block in range(0, stride * self.lanes + 2, self.lanes):  # each line read
                    self._prefetch(builder, builder.gep(field["source"], [
                        builder.add(ahead, I64(block))]))
            if last:
                inside = splat(builder, builder.icmp_signed("<", line, height), self.mask)
                lanes = [inside if mask is None else builder.and_(mask, inside)
                         for mask in masks]
            else:
                lanes = masks
            loaded = [self._load(builder, field["source"], builder.add(at, I64(block)), mask)
                      for block, mask in zip(blocks, lanes, strict=True)]
            if stride == 1:
                return loaded
            # Input columns 2x - 1 (even lanes of the 32 from `start`), 2x (odd lanes) and
            # 2x + 1 (even lanes from start + 2: the first's last 15 and one more float).
            first, second, third = loaded
            even = builder.shuffle_vector(first, second, self._order(range(0, 2 * self.lanes, 2)))
            odd = builder.shuffle_vector(first, second, self._order(range(1, 2 * self.lanes, 2)))
            after = builder.shuffle_vector(even, third, self._order(range(1, self.lanes + 1)))
            return [even, odd, after]

        def output_row(row: Any, carried: list[Any], last: bool) -> list[list[Any]]:
            """Output row ``row`` stored, from the ``carried`` input rows; the rows it read."""
            if stride == 1:
                rows = [carried[:3], carried[3:], reads(builder.add(row, I64(1)), last)]
            else:
                first = builder.mul(row, I64(2))
                rows = [carried, reads(first), reads(builder.add(first, I64(1)), last)]
            total = self._sum(builder, field, rows)
            low, high = field["bounds"]
            # ``clip``'s order, not min/max: a NaN compares false both ways and stays.
            total = builder.select(builder.fcmp_ordered("<", total, low), low, total)
            total = builder.select(builder.fcmp_ordered(">", total, high), high, total)
            at = builder.gep(written, [builder.mul(builder.mul(row, out_width), I64(spacing))])
            if paired and ASKS_WORDS_AHEAD and not last:
                # a write (1), kept in every level (3), of data (1)
                ahead = builder.gep(at, [builder.mul(I64(AHEAD_ROWS * spacing), out_width)])
                for unit in (0, (self.lanes - 1) * spacing):
                    builder.call(self.prefetch, [builder.bitcast(builder.gep(
                        ahead, [I64(unit)]), F32.as_pointer()), I32(1), I32(3), I32(1)])
            if paired:
                self._store_halves(builder, total, at, stored)
            elif stored is None:
                builder.store(total, builder.bitcast(at, self.floats.as_pointer()), align=4)
            else:
                builder.call(self.masked_store, [total, builder.bitcast(
                    at, self.floats.as_pointer()), I32(4), stored])
            return rows

        # Input row -1 is padding: zeros. Stride 1 carries rows y - 1 and y into output row y
        # and reads y + 1; stride 2 carries row 2y - 1 and reads 2y and 2y + 1. Only the last
        # output row may read a row below the plane (at stride 2, where H is odd): the rows
        # before it load under the column masks alone, no test of the row per vector.
        initial = [zero] * 3 + (reads(I64(0), True) if stride == 1 else [])
        final = builder.sub(field["out_height"], I64(1))
        with carrying_loop(builder, function, I64(0), final, "row",
                           carried=initial) as rows_loop:
            rows = output_row(rows_loop.index, rows_loop.carried, False)
            following = [*rows[1], *rows[2]] if stride == 1 else rows[2]
            rows_loop.carry(following)
            latch = builder.block
        # the rows the loop carried out of its last turn, or the first ones where it made none
        carried = []
        for first, then in zip(initial, following, strict=True):
            value = builder.phi(first.type)
            value.add_incoming(first, rows_loop.before)
            value.add_incoming(then, latch)
            carried.append(value)
        with when(builder, function, builder.icmp_signed(">=", final, I64(0)), "last_row"):
            output_row(final, carried, True)

    def _sum(self, builder: ir.IRBuilder, field: dict[str, Any], rows: list[list[Any]]) -> Any:
        """The bias plus the nine taps' products of the three input ``rows``: one chain of
        fused multiply-adds, or (``plain_inside``'s build) a chain per input row, added at the
        end, so that an output vector waits on three dependent multiply-adds, not nine."""
        if not self.plain_inside:
            total = field["shift"]
            for above, values in enumerate(rows):
                for across, value in enumerate(values):
                    total = builder.call(self.fmuladd, [field["taps"][3 * above + across],
                                                        value, total])
            return total
        sums = []
        for above, values in enumerate(rows):
            total = field["shift"] if above == 0 else builder.fmul(field["taps"][3 * above],
                                                                   values[0])
            for across, value in enumerate(values[1:] if above else values, 1 if above else 0):
                total = builder.call(self.fmuladd, [field["taps"][3 * above + across],
                                                    value, total])
            sums.append(total)
        return builder.fadd(builder.fadd(sums[0], sums[1]), sums[2])

    def _lane_places(self, builder: ir.IRBuilder, field: dict[str, Any]) -> dict[str, Any]:
        """Where each lane of a stacked vector sits, made once per task (the lanes' division
        is 16 scalar ones): ``rows`` whole rows of W to a vector, lane ``j`` in row
        ``j // W`` and column ``j % W``; the lanes in those rows (``used``), those with a
        column on their left and on their right (the taps across a row's end), and the
        vectors a plane takes."""
        lanes = ir.VectorType(I32, self.lanes)
        width = builder.trunc(field["width"], I32)
        across = splat(builder, width, lanes)
        lane = ir.Constant(lanes, list(range(self.lanes)))
        row = builder.sdiv(lane, across)
        column = builder.sub(lane, builder.mul(row, across))
        rows = builder.sdiv(I32(self.lanes), width)
        wide = builder.sext(rows, I64)
        return {"rows": wide, "lane_row": row, "lanes": lanes,
                "vectors": builder.sdiv(builder.add(field["height"], builder.sub(wide, I64(1))),
                                        wide),
                "used": builder.icmp_signed("<", row, splat(builder, rows, lanes)),
                "left": builder.icmp_signed(">", column, ir.Constant(lanes, [0] * self.lanes)),
                "right": builder.icmp_signed("<", column, splat(
                    builder, builder.sub(width, I32(1)), lanes))}

    def _stacked_plane(self, builder: ir.IRBuilder, function: ir.Function,
                       field: dict[str, Any]) -> None:
        """A stride-1 plane as vectors of ``rows`` whole rows each. In a plane's flat run,
        tap (ky, kx) of the output at ``s + j`` reads the input at ``s + j + (ky - 1) · W +
        kx - 1``: nine masked loads a vector, whose masks leave out the columns across a
        row's end and the rows outside the plane (they read as zero), and the lanes past
        the vector's rows. Only the first and the last vector have rows outside (their taps
        may point outside the plane, but masked lanes are never touched): the vectors
        between share one set of masks, made once."""
        places = field["stacked"]
        vectors, used = places["vectors"], places["used"]
        self._stacked_vector(builder, field, I64(0), None)
        with loop(builder, function, I64(1), builder.sub(vectors, I64(1)), "stack") as stack:
            self._stacked_vector(builder, field, stack, [used] * 3)
        with when(builder, function, builder.icmp_signed(">", vectors, I64(1)), "last"):
            self._stacked_vector(builder, field, builder.sub(vectors, I64(1)), None)

    def _stacked_vector(self, builder: ir.IRBuilder, field: dict[str, Any], stack: Any,
                        inside: list[Any] | None) -> None:
        """Vector ``stack`` of a stacked plane; ``inside``: each input row's lanes (the
        rows above, at and below the outputs), or None to find them."""
        places = field["stacked"]
        width, lanes = field["width"], places["lanes"]
        first = builder.mul(stack, places["rows"])  # the vector's first row
        start = builder.mul(first, width)  # and its first cell in the flat run
        if inside is None:
            inside = []
            height = splat(builder, builder.trunc(field["height"], I32), lanes)
            for above in range(3):  # input row first - 1 + above + lane_row
                line = builder.add(places["lane_row"], splat(
                    builder, builder.trunc(builder.add(first, I64(above - 1)), I32), lanes))
                inside.append(builder.and_(places["used"], builder.and_(
                    builder.icmp_signed(">=", line, ir.Constant(lanes, [0] * self.lanes)),
                    builder.icmp_signed("<", line, height))))
        total = field["shift"]
        for above in range(3):
            for across, columns in enumerate((places["left"], None, places["right"])):
                mask = inside[above] if columns is None else builder.and_(inside[above],
                                                                        columns)
                at = builder.add(start, builder.add(builder.mul(I64(above - 1), width),
                                                    I64(across - 1)))
                total = builder.call(self.fmuladd, [
                    field["taps"][3 * above + across],
                    self._load(builder, field["source"], at, mask), total])
        low, high = field["bounds"]
        total = builder.select(builder.fcmp_ordered("<", total, low), low, total)
        total = builder.select(builder.fcmp_ordered(">", total, high), high, total)
        stored = inside[1]  # the outputs: the lanes of rows inside the plane
        if field["paired"]:
            at = builder.gep(field["target"], [builder.mul(start, I64(2))])
            self._store_halves(builder, total, at, builder.shuffle_vector(
                stored, ir.Constant(self.mask, [0] * self.lanes), self._spread_order()))
        else:
            builder.call(self.masked_store, [total, builder.bitcast(
                builder.gep(field["target"], [start]), self.floats.as_pointer()), I32(4),
                stored])

    def _store_halves(self, builder: ir.IRBuilder, total: Any, at: Any, lanes: Any) -> None:
        """``total`` rounded to bf16 (``fptrunc``: nearest even, NaN kept, as the pairing
        pass rounds) into every other 16-bit unit from ``at`` (``lanes``: `_spread_order`'s
        mask): one half of each of 16 words, the other half (the paired channel's) left as
        it is. Each half widened to a word (its upper half zero, never stored) puts it in
        place."""
        bits = builder.bitcast(builder.fptrunc(total, self.halves), ir.VectorType(I16, self.lanes))
        spread = builder.bitcast(builder.zext(bits, ir.VectorType(I32, self.lanes)), self.spread)
        builder.call(self.store_halves, [spread, builder.bitcast(
            at, self.spread.as_pointer()), I32(2), lanes])

    def _spread_order(self) -> ir.Constant:
        """Lane ``k`` of the first vector to lane ``2k``, the second's between."""
        lanes = self.lanes
        return ir.Constant(ir.VectorType(I32, 2 * lanes),
                           [lane for index in range(lanes) for lane in (index, index + lanes)])

    def _columns_inside(self, builder: ir.IRBuilder, first: Any, width: Any) -> Any:
        """The mask of lanes whose input column ``first + lane`` lies in [0, W)."""
        columns = builder.add(splat(builder, first, self.indices),
                              ir.Constant(self.indices, list(range(self.lanes))))
        return builder.and_(
            builder.icmp_signed(">=", columns, ir.Constant(self.indices, [0] * self.lanes)),
            builder.icmp_signed("<", columns, splat(builder, width, self.indices)))

    def _prefetch(self, builder: ir.IRBuilder, address: Any) -> None:
        # A read (0), kept in every level of cache (3), of data (1): prefetcht0 on x86.
        builder.call(self.prefetch, [builder.bitcast(address, F32.as_pointer()), I32(0),
                                     I32(3), I32(1)])

    def _load(self, builder: ir.IRBuilder, source: Any, at: Any, mask: Any) -> Any:
        """A vector of floats from ``source[at]`` on, those outside ``mask`` read as zero (and
        never touched: a masked lane may lie outside the plane); a plain load where ``mask``
        is None. From bf16 planes (``source`` of 16-bit halves), as many halves each widened
        to the float32 whose upper half it is: the value itself, as the pairing pass rounded
        it."""
        if source.type.pointee == I16:
            address = builder.bitcast(builder.gep(source, [at]), self.bits.as_pointer())
            halves = builder.call(self.load_halves, [address, I32(2), mask,
                                                     ir.Constant(self.bits, [0] * self.lanes)])
            wide = builder.shl(builder.zext(halves, ir.VectorType(I32, self.lanes)),
                               ir.Constant(ir.VectorType(I32, self.lanes), [16] * self.lanes))
            return builder.bitcast(wide, self.floats)
        address = builder.bitcast(builder.gep(source, [at]), self.floats.as_pointer())
        if mask is None:
            return builder.load(address, align=4)
        zero = ir.Constant(self.floats, [0.0] * self.lanes)
        return builder.call(self.masked_load, [address, I32(4), mask, zero])

    def _lanes_below(self, builder: ir.IRBuilder, count: Any) -> Any:
        """The mask of lanes ``j < count``."""
        return builder.icmp_signed("<", ir.Constant(self.indices, list(range(self.lanes))),
                                   splat(builder, count, self.indices))

    def _order(self, lanes: Any) -> ir.Constant:
        return ir.Constant(ir.VectorType(I32, self.lanes), list(lanes))
