"""The LLVM IR of `spin_pool`'s two native functions, built with `llvmlite.ir`.

A job is ``task(context, part, parts)`` called once for each ``part`` in ``range(parts)``, on
whichever threads claim it. The pool's state is an array of int64 (`spin_pool` owns it; each
field on its own cache line, so that spinning readers do not slow the writers of the others):

* ``claims``: the job now posted, ``generation << 32 | parts << 22 | front << 11 | back``:
  parts [front, back) are unclaimed. The caller claims from the front, workers from the back,
  each by a compare-and-swap, so that with two threads each takes about the same half of
  every job: a step's half of the channels is then read back by the thread that wrote it in
  the step before, in its own cache (where the two vCPUs sit on different chiplets, a
  Winograd layer's transforms ran 2–3× slower with the parts handed out in turn). A thread
  reads the job's task and context after it reads ``claims``, and keeps its claim only where
  ``claims`` is unchanged, so a late reader can never run a part of a job with another job's
  task: ``claims`` has moved on before a job finishes and its task is replaced.
* ``task``, ``context``: the job's function and its argument.
* ``finished``: parts finished, counted up to ``parts``.
* ``busy``: 1 while a caller has a job posted (a second caller at once runs its job alone).
* ``armed``: callers that want the workers spinning (a plan run holds it while it runs).
* ``sticky``: 1 where a caller wants them spinning until they run out of patience, which
  clears it (a plan too short for arming and disarming around each run to pay).
* ``patience``: empty polls a worker spins through after ``armed`` drops to 0;
* ``dozes``: then polls each after a sleep of `DOZE_MICROSECONDS` (off the CPU, and a job
  posted meanwhile is found within that sleep, no Python thread to wake), before it returns
  (0 where the platform has no ``usleep``).

``pool_work(state)`` is a worker's loop: it claims and runs parts while there are any, spins
(a CPU pause per poll) while none, and once ``armed`` is 0 and ``patience`` polls went by
empty, dozes, then returns. ``pool_run(state, task, context, parts)`` posts a job, runs parts
itself until none is left, then waits for the parts the workers took: it never waits on a
worker that has not started a part, so a sleeping or late worker costs parallelism, never
progress. Where nothing is armed it runs the job itself as one part (part 0 of 1).
"""

from __future__ import annotations

import llvmlite.ir as ir

I64 = ir.IntType(64)
I32 = ir.IntType(32)
VOID = ir.VoidType()

# Fields of the state, in int64s: 16 apart (128 bytes, a cache-line pair on x86 prefetchers).
CLAIMS, TASK, CONTEXT, FINISHED, BUSY, ARMED, PATIENCE, DOZES, STICKY = (
    16 * i for i in range(9))
STATE_SIZE = 16 * 9
DOZE_MICROSECONDS = 100
TASK_TYPE = ir.FunctionType(VOID, [I64, I64, I64])


def module(triple: str) -> ir.Module:
    """The IR of ``pool_work`` and ``pool_run`` for a target ``triple`` (its CPU pause)."""
    built = ir.Module(name="hybridserve_spin_pool")
    built.triple = triple
    pause = _pause(built, triple)
    _define_work(built, pause, _doze(built, triple))
    _define_run(built, pause)
    return built


def _pause(built: ir.Module, triple: str):
    """A function emitting the CPU's spin-wait hint (x86 ``pause``, ARM ``yield``)."""
    if triple.startswith(("x86_64", "i686", "i386")):
        intrinsic = ir.Function(built, ir.FunctionType(VOID, []), name="llvm.x86.sse2.pause")
        return lambda builder: builder.call(intrinsic, [])
    if triple.startswith(("aarch64", "arm64")):
        hint = ir.Function(built, ir.FunctionType(VOID, [I32]), name="llvm.aarch64.hint")
        return lambda builder: builder.call(hint, [ir.Constant(I32, 1)])
    return lambda builder: None


def _doze(built: ir.Module, triple: str):
    """A function emitting one sleep of `DOZE_MICROSECONDS` (``usleep``), None on Windows."""
    if "windows" in triple or "msvc" in triple:
        return None
    usleep = ir.Function(built, ir.FunctionType(I32, [I32]), name="usleep")
    return lambda builder: builder.call(usleep, [ir.Constant(I32, DOZE_MICROSECONDS)])


def _field(builder: ir.IRBuilder, state: ir.Value, index: int) -> ir.Value:
    return builder.gep(state, [ir.Constant(I64, index)])


def _load(builder: ir.IRBuilder, state: ir.Value, index: int) -> ir.Value:
    return builder.load_atomic(_field(builder, state, index), "acquire", 8)


def _claim_and_run(builder: ir.IRBuilder, state: ir.Value, claims: ir.Value,
                   claimed_claims: ir.Value, part: ir.Value, parts: ir.Value,
                   claimed: ir.Block, lost: ir.Block) -> None:
    """Read the job, try to claim ``part`` (``claims`` becoming ``claimed_claims``); in
    ``claimed`` run it and count it finished."""
    task = builder.load_atomic(_field(builder, state, TASK), "monotonic", 8)
    context = builder.load_atomic(_field(builder, state, CONTEXT), "monotonic", 8)
    swapped = builder.cmpxchg(_field(builder, state, CLAIMS), claims, claimed_claims,
                              "acq_rel", "acquire")
    builder.cbranch(builder.extract_value(swapped, 1), claimed, lost)
    builder.position_at_end(claimed)
    builder.call(builder.inttoptr(task, TASK_TYPE.as_pointer()), [context, part, parts])
    builder.atomic_rmw("add", _field(builder, state, FINISHED), ir.Constant(I64, 1), "release")


PART_BITS = 11  # front and back each; parts take the bits above them, below the generation
MAX_PARTS = (1 << (32 - 2 * PART_BITS)) - 1


def _decode(builder: ir.IRBuilder, claims: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(front, back, parts) of a ``claims`` word."""
    mask = ir.Constant(I64, (1 << PART_BITS) - 1)
    return (builder.and_(builder.lshr(claims, ir.Constant(I64, PART_BITS)), mask),
            builder.and_(claims, mask),
            builder.and_(builder.lshr(claims, ir.Constant(I64, 2 * PART_BITS)),
                         ir.Constant(I64, MAX_PARTS)))


def _define_work(built: ir.Module, pause, doze) -> None:
    function = ir.Function(built, ir.FunctionType(VOID, [I64.as_pointer()]), name="pool_work")
    state, = function.args
    entry, poll, take, claimed, idle, patient, dozing, rest, done = (
        function.append_basic_block(name) for name in
        ("entry", "poll", "take", "claimed", "idle", "patient", "dozing", "rest", "done"))
    builder = ir.IRBuilder(entry)
    zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)
    empty_polls, dozes = builder.alloca(I64), builder.alloca(I64)
    builder.store(zero, empty_polls)
    builder.store(zero, dozes)
    builder.branch(poll)

    builder.position_at_end(poll)
    claims = _load(builder, state, CLAIMS)
    front, back, parts = _decode(builder, claims)
    builder.cbranch(builder.icmp_unsigned("<", front, back), take, idle)

    builder.position_at_end(take)  # a claim from the back (won or lost): work is about
    builder.store(zero, empty_polls)
    builder.store(zero, dozes)
    _claim_and_run(builder, state, claims, builder.sub(claims, one), builder.sub(back, one),
                   parts, claimed, poll)
    builder.branch(poll)

    builder.position_at_end(idle)
    waited = builder.add(builder.load(empty_polls), one)
    builder.store(waited, empty_polls)
    builder.cbranch(builder.icmp_unsigned(">", waited, _load(builder, state, PATIENCE)),
                    patient, rest)

    builder.position_at_end(patient)  # out of patience: doze unless a caller is armed
    armed = _load(builder, state, ARMED)
    spin_again = function.append_basic_block("spin_again")
    unstick = function.append_basic_block("unstick")
    builder.cbranch(builder.icmp_signed(">", armed, zero), spin_again, unstick)
    builder.position_at_end(unstick)  # a sticky arm lapses here: the next run sets it again
    builder.store_atomic(zero, _field(builder, state, STICKY), "release", 8)
    builder.branch(dozing)
    builder.position_at_end(spin_again)
    builder.store(zero, empty_polls)
    builder.store(zero, dozes)
    builder.branch(rest)

    builder.position_at_end(dozing)
    slept = builder.load(dozes)
    if doze is None:
        builder.branch(done)
    else:
        sleep = function.append_basic_block("sleep")
        builder.cbranch(builder.icmp_unsigned("<", slept, _load(builder, state, DOZES)),
                        sleep, done)
        builder.position_at_end(sleep)
        doze(builder)
        builder.store(builder.add(slept, one), dozes)
        builder.branch(poll)

    builder.position_at_end(rest)
    pause(builder)
    builder.branch(poll)

    builder.position_at_end(done)
    builder.ret_void()


def _define_run(built: ir.Module, pause) -> None:
    function = ir.Function(built, ir.FunctionType(VOID, [I64.as_pointer(), I64, I64, I64]),
                           name="pool_run")
    state, task, context, parts = function.args
    entry, alone, posted, poll, take, claimed, wait, done = (
        function.append_basic_block(name) for name in
        ("entry", "alone", "posted", "poll", "take", "claimed", "wait", "done"))
    builder = ir.IRBuilder(entry)
    zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)
    # Alone where no worker is meant to spin, for one part, or while another caller's job
    # is posted.
    armed = builder.or_(_load(builder, state, ARMED), _load(builder, state, STICKY))
    wanted = builder.and_(builder.icmp_signed(">", armed, zero),
                          builder.icmp_signed(">", parts, one))
    check_busy = function.append_basic_block("check_busy")
    builder.cbranch(wanted, check_busy, alone)

    builder.position_at_end(check_busy)
    taken = builder.cmpxchg(_field(builder, state, BUSY), zero, one, "acquire", "monotonic")
    builder.cbranch(builder.extract_value(taken, 1), posted, alone)

    # Alone, the whole job as one part: a task splits its range by ``parts``, so part 0 of 1
    # is all of it, without each part's setup (a batch-1 dense layer cut in 8 for two
    # threads: 6.5 µs run part by part on one, 5.9 as one).
    builder.position_at_end(alone)
    body = function.append_basic_block("alone_body")
    builder.cbranch(builder.icmp_signed(">", parts, zero), body, done)
    builder.position_at_end(body)
    builder.call(builder.inttoptr(task, TASK_TYPE.as_pointer()), [context, zero, one])
    builder.branch(done)

    builder.position_at_end(posted)  # the job out: next generation, parts, none claimed
    previous = _load(builder, state, CLAIMS)
    generation = builder.add(builder.lshr(previous, ir.Constant(I64, 32)), one)
    builder.store_atomic(task, _field(builder, state, TASK), "monotonic", 8)
    builder.store_atomic(context, _field(builder, state, CONTEXT), "monotonic", 8)
    builder.store_atomic(zero, _field(builder, state, FINISHED), "monotonic", 8)
    word = builder.or_(builder.or_(builder.shl(generation, ir.Constant(I64, 32)),
                                   builder.shl(parts, ir.Constant(I64, 2 * PART_BITS))),
                       parts)  # front 0, back parts
    builder.store_atomic(word, _field(builder, state, CLAIMS), "release", 8)
    builder.branch(poll)

    builder.position_at_end(poll)  # claim parts from the front while any is left
    claims = _load(builder, state, CLAIMS)
    front, back, _ = _decode(builder, claims)
    builder.cbranch(builder.icmp_unsigned("<", front, back), take, wait)
    builder.position_at_end(take)
    _claim_and_run(builder, state, claims,
                   builder.add(claims, ir.Constant(I64, 1 << PART_BITS)), front, parts,
                   claimed, poll)
    builder.branch(poll)

    builder.position_at_end(wait)  # every part claimed: wait for the workers' to finish
    finished = _load(builder, state, FINISHED)
    waiting = function.append_basic_block("waiting")
    release = function.append_basic_block("release")
    builder.cbranch(builder.icmp_unsigned("<", finished, parts), waiting, release)
    builder.position_at_end(waiting)
    pause(builder)
    builder.branch(wait)
    builder.position_at_end(release)
    builder.store_atomic(zero, _field(builder, state, BUSY), "release", 8)
    builder.branch(done)

    builder.position_at_end(done)
    builder.ret_void()
