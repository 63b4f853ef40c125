"""The LLVM IR of `bf16.patch_pairing`'s pass: float32 rounded to bf16 pairs, 16 words a step.

``patch_pairs(context, part, parts)`` is a `spin_pool` task over the word rows of its target;
``context`` holds int64s (`FIELDS`): the source's address, the addresses of the row offsets
(one per K index, in floats) and of the column-run offsets, K, the number of runs, a run's
length and the step between its floats, the target's address and its row stride in words,
the number of word rows, and the address of each run's first word in a target row. Word
(r, into[o] + i) pairs the floats at ``rows[2r] + outer[o] + i·step`` and ``rows[2r + 1] +
...`` (the second zero past an odd K's end). Runs lie end to end in an im2col matrix
(``into[o] = o·run``), or a row apart in a zero-bordered grid (`conv_amx`).

A step converts 16 floats of each of the two rows with ``fptrunc`` to ``bfloat`` (one
``vcvtneps2bf16`` each: round to nearest even, NaN kept), interleaves them into 32 bf16
(one shuffle) and stores 16 words. A run's tail goes through lane masks. A run whose floats
lie two apart (a stride-2 convolution) is read as 32 adjacent floats, every other one kept by
a shuffle: its gathers took twice the stride-2 product's time (ResNet-18's 7×7 stem at batch
1, one thread: pairing 0.43 ms, the product 0.22; read so, 0.30). Where a word's second K
index is the float after its first's (a stride-2 stem's taps (kx, kx + 1) of one kernel row:
three of ResNet's 7×7 stem's four words a kernel row), the 32 adjacent floats from a run's
first are both rows' floats side by side: rounded in order they are the words, with no
shuffle, whole vectors unmasked (ResNet-18's stem with its pooling in bf16 at batch 1, one Zen
4 core, in the plan's walk: 2.00 → 1.80 ms; 1.98 → 1.90 with each step masked as a run's
tail is). Other steps are gathered.
numba cannot name bf16, and its integer rounding ran at a quarter of this speed.

``batchnorm_pairs`` is the same pass reading a BatchNorm's input, K index k being channel k:
``context`` holds `BATCHNORM_FIELDS` past `FIELDS` (the addresses of each channel's scale
and shift, float32, worked out once as `batchnorm_kernel` works them; the clamp bounds as
float64 bits), and every float is ``clip(x * scale + shift, low, high)`` before it is
rounded (no fused multiply-add, the same NaN-keeping clamp), so that its words are that
pass's then paired. Worked out on every run, each pair of channels' ``sqrt`` and division
took a third of the pass at 7² (2048 channels).

``each_part`` runs other tasks in turn within one part: ``context`` holds the number of tasks
a group runs and the number of groups laid out for parts, then, group by group, each task's
(address, context address), each task run as the whole of a job of one part. The first group
is what the job runs where it runs whole (one part: unarmed); the others are cut among the
job's parts, a job of fewer parts than groups running several groups a part. `bf16.by_parts`
lays a product out so: each group pairs the whole activation into words of its own, then
multiplies its share of the weight's rows by them.

``phase_pairs`` is ``patch_pairs`` over runs whose floats lie two apart (a stride-2
convolution's phase planes, `conv_amx`) writing both column phases at once: ``context`` holds
`TWIN_FIELDS` past `FIELDS`, and each step reads 32 adjacent floats of each of its two rows
once, the even ones paired into run ``o``'s words as ``patch_pairs`` pairs them and the odd
ones into the words ``twin`` on (the next column phase's run, as long). Apart, each phase's
pass read every line of the rows it pairs: the input's lines were read twice.

``copy_words`` takes `FIELDS` too but reads words already paired (a hand-off's, `bf16_handoff`):
word (r, into[o] + i) is the word at ``rows[r] + outer[o] + i·step``, one K offset per word
row, its bits kept (the loads, shuffles and gathers move them, nothing rounds). A stride-2 1×1
convolution reads so the words its input's writer laid (ResNet v2's downsampling shortcut),
every other word of every other row, where it paired the float32 array again.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import llvmlite.ir as ir

from engine.kernels.gemm_bf16_ir import BFloatType
from engine.kernels.task_ir import (
    F32,
    I1,
    I32,
    I64,
    as_float,
    fields,
    loop,
    masked_load,
    masked_store,
    splat,
    task,
)

LANES = 16
ADJACENT, EVERY_OTHER, GATHER = "lane", "every_other", "gathered"  # how a run's floats are read
FIELDS = ("source", "rows", "outer", "depth", "runs", "run", "step", "target", "row_words",
          "word_rows", "into")
BATCHNORM_FIELDS = ("scale", "shift", "low", "high")
TWIN_FIELDS = ("twin",)


def module() -> ir.Module:
    """A module holding ``patch_pairs``, ``batchnorm_pairs``, ``phase_pairs``,
    ``copy_words`` and ``each_part``."""
    built = ir.Module(name="hybridserve_bf16_pairs")
    kernel = _PairKernel(built)
    kernel.define(normalised=False)
    kernel.define(normalised=True)
    kernel.define(normalised=False, twinned=True)
    kernel.define_copy()
    define_each_part(built)
    return built


def define_each_part(built: ir.Module) -> None:
    """``each_part(context, part, parts)``: where the job runs whole (one part: unarmed), the
    context's first group of tasks; else the groups after it that part ``part`` of ``parts``
    covers; each task called as ``task(its context, 0, 1)`` (the layout: the module
    docstring)."""
    function, builder, context, part, parts = task(built, "each_part")
    words = builder.inttoptr(context, I64.as_pointer())
    steps = builder.load(words, align=8)
    laid = builder.load(builder.gep(words, [I64(1)]), align=8)
    whole = builder.icmp_signed("==", parts, I64(1))
    first = builder.select(whole, I64(0), builder.add(I64(1), builder.sdiv(
        builder.mul(part, laid), parts)))
    last = builder.select(whole, I64(1), builder.add(I64(1), builder.sdiv(
        builder.mul(builder.add(part, I64(1)), laid), parts)))
    called = ir.FunctionType(ir.VoidType(), [I64] * 3)
    with loop(builder, function, first, last, "group") as group:
        with loop(builder, function, I64(0), steps, "step") as step:
            entry = builder.add(I64(2), builder.mul(I64(2), builder.add(
                builder.mul(group, steps), step)))
            address = builder.load(builder.gep(words, [entry]), align=8)
            argument = builder.load(builder.gep(words, [builder.add(entry, I64(1))]), align=8)
            builder.call(builder.inttoptr(address, called.as_pointer()),
                         [argument, I64(0), I64(1)])
    builder.ret_void()


class _PairKernel:
    def __init__(self, built: ir.Module) -> None:
        self.module = built
        self.floats = ir.VectorType(F32, LANES)
        self.words = ir.VectorType(I32, LANES)
        self.halves = ir.VectorType(BFloatType(), LANES)
        self.mask = ir.VectorType(I1, LANES)
        pointer = F32.as_pointer()
        self.pointers = ir.VectorType(pointer, LANES)
        self.masked_load = masked_load(built, self.floats, "f32")
        self.gather = ir.Function(built, ir.FunctionType(
            self.floats, [self.pointers, I32, self.mask, self.floats]),
            name=f"llvm.masked.gather.v{LANES}f32.v{LANES}p0")
        self.masked_store = masked_store(built, self.words, "i32")

    def define(self, normalised: bool, twinned: bool = False) -> None:
        """``batchnorm_pairs`` where ``normalised``, ``phase_pairs`` where ``twinned``, else
        ``patch_pairs``."""
        self.normalised, self.twinned = normalised, twinned
        name = "batchnorm_pairs" if normalised else "phase_pairs" if twinned else "patch_pairs"
        function, builder, context, part, parts = task(self.module, name)
        field = fields(builder, context, FIELDS + (
            BATCHNORM_FIELDS if normalised else TWIN_FIELDS if twinned else ()))
        first = builder.sdiv(builder.mul(part, field["word_rows"]), parts)
        last = builder.sdiv(builder.mul(builder.add(part, I64(1)), field["word_rows"]), parts)
        with loop(builder, function, first, last, "row") as row:
            self._row(builder, function, field, row)
        builder.ret_void()

    def define_copy(self) -> None:
        """``copy_words``: each word row's runs of words copied, bits kept."""
        function, builder, context, part, parts = task(self.module, "copy_words")
        field = fields(builder, context, FIELDS)
        first = builder.sdiv(builder.mul(part, field["word_rows"]), parts)
        last = builder.sdiv(builder.mul(builder.add(part, I64(1)), field["word_rows"]), parts)
        with loop(builder, function, first, last, "row") as row:
            rows = builder.inttoptr(field["rows"], I64.as_pointer())
            outer = builder.inttoptr(field["outer"], I64.as_pointer())
            into_offsets = builder.inttoptr(field["into"], I64.as_pointer())
            source = builder.inttoptr(field["source"], F32.as_pointer())
            target = builder.inttoptr(field["target"], I32.as_pointer())
            at = builder.load(builder.gep(rows, [row]), align=8)
            into_row = builder.gep(target, [builder.mul(row, field["row_words"])])
            with loop(builder, function, I64(0), field["runs"], "run") as run:
                base = builder.load(builder.gep(outer, [run]), align=8)
                into = builder.gep(into_row, [builder.load(builder.gep(into_offsets, [run]),
                                                           align=8)])
                start = builder.gep(source, [builder.add(at, base)])
                unit = builder.icmp_signed("==", field["step"], I64(1))
                halved = builder.icmp_signed("==", field["step"], I64(2))
                with builder.if_else(unit) as (adjacent, strided):
                    with adjacent, loop(builder, function, I64(0), field["run"], "lane",
                                         LANES) as lane:
                        self._copy_step(builder, field, start, into, lane, ADJACENT)
                    with strided, builder.if_else(halved) as (every_other, gathered):
                        for read, block in ((EVERY_OTHER, every_other), (GATHER, gathered)):
                            with block, loop(builder, function, I64(0), field["run"], read,
                                              LANES) as lane:
                                self._copy_step(builder, field, start, into, lane, read)
        builder.ret_void()

    def _copy_step(self, builder: ir.IRBuilder, field: dict[str, Any], start: Any, into: Any,
                   lane: Any, read: str) -> None:
        """16 words of a run read as ``read`` says and stored as they are."""
        indices = ir.VectorType(I64, LANES)
        left = builder.sub(field["run"], lane)
        mask = builder.icmp_signed("<", ir.Constant(indices, list(range(LANES))),
                                   splat(builder, left, indices))
        values = self._read(builder, start, lane, field["step"], left, mask, read)
        address = builder.bitcast(builder.gep(into, [lane]), self.words.as_pointer())
        builder.call(self.masked_store, [builder.bitcast(values, self.words), address, I32(4),
                                         mask])

    def _row(self, builder: ir.IRBuilder, function: ir.Function, field: dict[str, Any],
             row: Any) -> None:
        rows = builder.inttoptr(field["rows"], I64.as_pointer())
        outer = builder.inttoptr(field["outer"], I64.as_pointer())
        into_offsets = builder.inttoptr(field["into"], I64.as_pointer())
        source = builder.inttoptr(field["source"], F32.as_pointer())
        target = builder.inttoptr(field["target"], I32.as_pointer())
        low_index = builder.mul(row, I64(2))
        high_index = builder.add(low_index, I64(1))
        single = builder.icmp_signed(">=", high_index, field["depth"])
        low_at = builder.load(builder.gep(rows, [low_index]), align=8)
        # An odd K's last word: its second half reads the first's floats, then is zeroed.
        high_at = builder.load(builder.gep(rows, [builder.select(single, low_index,
                                                                 high_index)]), align=8)
        into_row = builder.gep(target, [builder.mul(row, field["row_words"])])
        # Each K index's scale and shift (the second's the first's where K ends: zeroed).
        affine = None if not self.normalised else tuple(
            self._scale_shift(builder, field, index)
            for index in (low_index, builder.select(single, low_index, high_index)))
        with loop(builder, function, I64(0), field["runs"], "run") as run:
            base = builder.load(builder.gep(outer, [run]), align=8)
            into = builder.gep(into_row, [builder.load(builder.gep(into_offsets, [run]),
                                                       align=8)])
            start = (builder.gep(source, [builder.add(low_at, base)]),
                     builder.gep(source, [builder.add(high_at, base)]))
            if self.twinned:  # floats two apart, both column phases from each read
                with loop(builder, function, I64(0), field["run"], "twins", LANES) as lane:
                    self._twin_step(builder, field, start, into, lane, single)
            else:
                self._run(builder, function, field, start, into, single, affine,
                          builder.icmp_signed("==", builder.sub(high_at, low_at), I64(1)))

    def _run(self, builder: ir.IRBuilder, function: ir.Function, field: dict[str, Any],
             start: tuple[Any, Any], into: Any, single: Any,
             affine: tuple[Any, Any] | None, side_by_side: Any) -> None:
        """One run of the two rows' floats, read as its step allows, into its words;
        ``side_by_side``: whether the second row's floats lie each one after the first's (a
        stride-2 stem's pair of taps of one kernel row: `_side_by_side_step`)."""
        unit = builder.icmp_signed("==", field["step"], I64(1))
        halved = builder.icmp_signed("==", field["step"], I64(2))
        with builder.if_else(unit) as (adjacent, strided):
            with adjacent:
                self._each_step(builder, function, field["run"], "lane", partial(
                    self._step, builder, field, start, into, single=single, read=ADJACENT,
                    affine=affine))
            with strided, builder.if_else(halved) as (every_other, gathered):
                with every_other:
                    self._every_other(builder, function, field, start, into, single, affine,
                                      side_by_side)
                with gathered, loop(builder, function, I64(0), field["run"], GATHER,
                                    LANES) as lane:
                    self._step(builder, field, start, into, lane, single, GATHER, affine)

    @staticmethod
    def _each_step(builder: ir.IRBuilder, function: ir.Function, run: Any, name: str,
                   step: Callable[..., None]) -> None:
        """``step(lane, masked)`` over a run of ``run`` columns, 16 a step: whole vectors with
        plain loads and stores, then the tail's lanes masked (a mask worked out every step
        cost the pass a third of its time)."""
        whole = builder.sub(run, builder.srem(run, I64(LANES)))
        with loop(builder, function, I64(0), whole, name, LANES) as lane:
            step(lane, masked=False)
        with builder.if_then(builder.icmp_signed("<", whole, run)):
            step(whole, masked=True)

    def _every_other(self, builder: ir.IRBuilder, function: ir.Function,
                     field: dict[str, Any], start: tuple[Any, Any], into: Any, single: Any,
                     affine: tuple[Any, Any] | None, side_by_side: Any) -> None:
        """A run of floats two apart in each row: where the second row's lie between the
        first's, both read at once (`_side_by_side_step`), else each row's every other
        float."""
        with builder.if_else(side_by_side if affine is None else ir.Constant(I1, 0)) as (
                paired, apart):
            with paired:
                self._each_step(builder, function, field["run"], "side_by_side", partial(
                    self._side_by_side_step, builder, field, start[0], into))
            with apart, loop(builder, function, I64(0), field["run"], EVERY_OTHER,
                             LANES) as lane:
                self._step(builder, field, start, into, lane, single, EVERY_OTHER, affine)

    def _side_by_side_step(self, builder: ir.IRBuilder, field: dict[str, Any], first: Any,
                           into: Any, lane: Any, masked: bool) -> None:
        """16 words of a run whose rows' floats alternate (the second row's each one after
        the first's, the run stepping two): the 32 adjacent floats from ``first + 2·lane``
        rounded in order are the words, each pair's first float its low half, with no
        shuffle (a stride-2 stem's taps (kx, kx + 1): ResNet's 7×7 pairs three of its four
        words a kernel row so). ``masked``: only the words before the run's end (else all 16
        lie inside it)."""
        indices = ir.VectorType(I64, LANES)
        left = builder.sub(field["run"], lane)
        # masked: the floats before the run's end, two a column
        halves = self._two_vectors(builder, first, lane, splat(builder, builder.mul(
            left, I64(2)), indices) if masked else None)
        rounded = [builder.fptrunc(half, self.halves) for half in halves]
        words = builder.bitcast(builder.shuffle_vector(*rounded, ir.Constant(
            ir.VectorType(I32, 2 * LANES), list(range(2 * LANES)))), self.words)
        address = builder.bitcast(builder.gep(into, [lane]), self.words.as_pointer())
        if not masked:
            builder.store(words, address, align=4)
            return
        mask = builder.icmp_signed("<", ir.Constant(indices, list(range(LANES))),
                                   splat(builder, left, indices))
        builder.call(self.masked_store, [words, address, I32(4), mask])

    @staticmethod
    def _scale_shift(builder: ir.IRBuilder, field: dict[str, Any],
                     channel: Any) -> tuple[Any, Any]:
        """Channel ``channel``'s BatchNorm scale and shift."""
        return tuple(builder.load(builder.gep(builder.inttoptr(field[name], F32.as_pointer()),
                                              [channel]), align=4)
                     for name in ("scale", "shift"))  # type: ignore[return-value]

    def _normalise(self, builder: ir.IRBuilder, field: dict[str, Any], values: Any,
                   scale_shift: tuple[Any, Any]) -> Any:
        """``clip(values * scale + shift, low, high)``, NaN kept (compares, not min/max)."""
        scale, shift = (splat(builder, value, self.floats) for value in scale_shift)
        values = builder.fadd(builder.fmul(values, scale), shift)
        low, high = (splat(builder, as_float(builder, field[name]), self.floats)
                     for name in ("low", "high"))
        values = builder.select(builder.fcmp_ordered("<", values, low), low, values)
        return builder.select(builder.fcmp_ordered(">", values, high), high, values)

    def _step(self, builder: ir.IRBuilder, field: dict[str, Any], start: tuple[Any, Any],
              into: Any, lane: Any, single: Any, read: str,
              affine: tuple[Any, Any] | None = None, masked: bool = True) -> None:
        """16 words of a run from ``lane`` on; ``masked``: only those before the run's end
        (else all 16 lie inside it)."""
        indices = ir.VectorType(I64, LANES)
        left = builder.sub(field["run"], lane)
        mask = None if not masked else builder.icmp_signed(
            "<", ir.Constant(indices, list(range(LANES))), splat(builder, left, indices))
        values = [self._read(builder, first, lane, field["step"], left, mask, read)
                  for first in start]
        if affine is not None:
            values = [self._normalise(builder, field, value, scale_shift)
                      for value, scale_shift in zip(values, affine, strict=True)]
        self._store_pairs(builder, values, into, lane, single, mask)

    def _twin_step(self, builder: ir.IRBuilder, field: dict[str, Any], start: tuple[Any, Any],
                   into: Any, lane: Any, single: Any) -> None:
        """16 words of a run and 16 of its twin (``twin`` words on): 32 adjacent floats of
        each row read once, the even ones this run's, the odd ones the twin's."""
        indices = ir.VectorType(I64, LANES)
        left = builder.sub(field["run"], lane)
        mask = builder.icmp_signed("<", ir.Constant(indices, list(range(LANES))),
                                   splat(builder, left, indices))
        # the masks stop at the twin run's last float, 2·left - 1 on
        wanted = splat(builder, builder.mul(left, I64(2)), indices)
        phases: list[list[Any]] = [[], []]
        for first in start:
            halves = self._two_vectors(builder, first, lane, wanted)
            for phase in range(2):
                phases[phase].append(builder.shuffle_vector(halves[0], halves[1], ir.Constant(
                    ir.VectorType(I32, LANES), list(range(phase, 2 * LANES, 2)))))
        self._store_pairs(builder, phases[0], into, lane, single, mask)
        self._store_pairs(builder, phases[1], builder.gep(into, [field["twin"]]), lane, single,
                          mask)

    def _store_pairs(self, builder: ir.IRBuilder, values: list[Any], into: Any, lane: Any,
                     single: Any, mask: Any) -> None:
        """The two rows' 16 floats each (``values``) rounded and paired into 16 words at
        ``into + lane`` (the second's half zero where K ended), the lanes of ``mask``."""
        halves = [builder.fptrunc(value, self.halves) for value in values]
        order = [lane_of for index in range(LANES) for lane_of in (index, index + LANES)]
        paired = builder.shuffle_vector(halves[0], halves[1],
                                        ir.Constant(ir.VectorType(I32, 2 * LANES), order))
        paired = builder.bitcast(paired, self.words)
        # Where K ended, the low half only: the high half's bits cleared.
        paired = builder.select(single, builder.and_(paired, ir.Constant(
            self.words, [0xFFFF] * LANES)), paired)
        address = builder.bitcast(builder.gep(into, [lane]), self.words.as_pointer())
        if mask is None:
            builder.store(paired, address, align=4)
        else:
            builder.call(self.masked_store, [paired, address, I32(4), mask])

    def _two_vectors(self, builder: ir.IRBuilder, first: Any, lane: Any,
                     wanted: Any) -> list[Any]:
        """The 32 floats from ``first + 2·lane`` as two vectors of 16, each float's load
        masked to those before float ``wanted`` (a splat of int64s) of the 32, zero past it;
        plain loads where ``wanted`` is None (all 32 lie inside)."""
        indices = ir.VectorType(I64, LANES)
        zero = ir.Constant(self.floats, [0.0] * LANES)
        halves = []
        for half in range(2):
            at = builder.gep(first, [builder.add(builder.mul(lane, I64(2)), I64(half * LANES))])
            if wanted is None:
                halves.append(builder.load(builder.bitcast(at, self.floats.as_pointer()),
                                           align=4))
                continue
            inside = builder.icmp_signed("<", ir.Constant(indices, [
                half * LANES + j for j in range(LANES)]), wanted)
            halves.append(builder.call(self.masked_load, [
                builder.bitcast(at, self.floats.as_pointer()), I32(4), inside, zero]))
        return halves

    def _read(self, builder: ir.IRBuilder, first: Any, lane: Any, step: Any, left: Any,
              mask: Any, read: str) -> Any:
        """16 floats from ``first + (lane + j)·step`` under the tail's mask (``left`` of them
        remain in the run): one masked load (step 1), two and a shuffle keeping every other
        float (step 2), or a gather."""
        zero = ir.Constant(self.floats, [0.0] * LANES)
        if read == ADJACENT:
            contiguous = builder.bitcast(builder.gep(first, [lane]), self.floats.as_pointer())
            if mask is None:
                return builder.load(contiguous, align=4)
            return builder.call(self.masked_load, [contiguous, I32(4), mask, zero])
        indices = ir.VectorType(I64, LANES)
        if read == EVERY_OTHER:
            # Floats 2j of the 32 from first + 2·lane; the masks stop at the run's last float
            # wanted, 2·(left - 1), so that no read passes the input's end.
            wanted = splat(builder, builder.sub(builder.mul(left, I64(2)), I64(1)), indices)
            halves = self._two_vectors(builder, first, lane, wanted)
            return builder.shuffle_vector(halves[0], halves[1], ir.Constant(
                ir.VectorType(I32, LANES), list(range(0, 2 * LANES, 2))))
        offsets = builder.mul(builder.add(splat(builder, lane, indices),
                                          ir.Constant(indices, list(range(LANES)))),
                              splat(builder, builder.mul(step, I64(4)), indices))
        addresses = builder.add(splat(builder, builder.ptrtoint(first, I64), indices), offsets)
        pointers = builder.inttoptr(addresses, self.pointers)
        return builder.call(self.gather, [pointers, I32(4), mask, zero])
