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
* ``log``, ``log_count``, ``log_capacity``: while ``log`` holds an address (0: off), every
  job posted is also written there, `LOG_WORDS` int64s each, at the slot ``log_count`` gave
  (counted up atomically: callers on other threads log too, each entry names its thread);
  past ``log_capacity`` entries only the count goes on (`engine.cpu.steady_walk`).
* ``nap_polls``: on Linux, empty polls a worker spins through while armed or sticky, and a
  caller waiting on the workers' parts, before it naps on a futex (at most
  `NAP_NANOSECONDS`): ``sleepers`` and ``wake`` the workers' count and word (the poster of a
  job bumps and wakes it), ``caller_sleepers`` and ``caller_wake`` the caller's (a worker
  that finishes a part does). A spinning thread on a shared machine spends its own
  process's CPU share, and a caller spun for a scheduler's slice on a worker taken off its
  core mid-part.

``pool_work(state)`` is a worker's loop: it claims and runs parts while there are any, spins
(a CPU pause per poll) while none, naps past ``nap_polls`` (Linux), and once ``armed`` is 0
and ``patience`` polls went by empty (a nap that runs out counts as half of them), dozes,
then returns. ``pool_run(state, task, context, parts)`` posts a job, runs parts
itself until none is left, then waits for the parts the workers took: it never waits on a
worker that has not started a part, so a sleeping or late worker costs parallelism, never
progress. Where nothing is armed it runs the job itself as one part (part 0 of 1).
``copy_bytes(context, part, parts)`` is a task copying ``context[2]`` bytes from address
``context[1]`` to ``context[0]`` (a job writing a few bytes, as int8 layers write their
ranges, posted like any other). ``pool_sequence(state, table, count)`` runs ``count`` jobs
in order, each as ``pool_run`` would, from a table of (task, context, parts) triples: a
plan's steady run replayed in one native call (`engine.cpu.steady_walk`).
"""

from __future__ import annotations

import llvmlite.ir as ir

I64 = ir.IntType(64)
I32 = ir.IntType(32)
VOID = ir.VoidType()

# Fields of the state, in int64s: 16 apart (128 bytes, a cache-line pair on x86 prefetchers).
(CLAIMS, TASK, CONTEXT, FINISHED, BUSY, ARMED, PATIENCE, DOZES, STICKY, NAP_POLLS, SLEEPERS,
 WAKE, CALLER_SLEEPERS, CALLER_WAKE, LOG, LOG_COUNT, LOG_CAPACITY) = (16 * i for i in range(17))
STATE_SIZE = 16 * 17
LOG_WORDS = 4  # a logged job: the caller's thread (``pthread_self``), task, context, parts
DOZE_MICROSECONDS = 100
NAP_NANOSECONDS = 1_000_000  # a nap's longest: a wake missed costs no more than this
TASK_TYPE = ir.FunctionType(VOID, [I64, I64, I64])
# Linux's futex system call by architecture, and its private wait and wake operations.
FUTEX_CALLS = {"x86_64": 202, "aarch64": 98}
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129


def module(triple: str) -> ir.Module:
    """The IR of ``pool_work`` and ``pool_run`` for a target ``triple`` (its CPU pause, and
    on Linux its futex, for naps)."""
    built = ir.Module(name="hybridserve_spin_pool")
    built.triple = triple
    pause = _pause(built, triple)
    futex = _futex(built, triple)
    _define_work(built, pause, _doze(built, triple), futex)
    _define_sequence(built, _define_run(built, pause, futex))
    _define_copy_bytes(built)
    return built


class _Futex:
    """Emits Linux futex waits (a nap of at most `NAP_NANOSECONDS` while a word holds a
    value) and wakes, through libc's ``syscall``."""

    def __init__(self, built: ir.Module, number: int) -> None:
        self.number = number
        self.syscall = ir.Function(built, ir.FunctionType(I64, [I64], var_arg=True),
                                   name="syscall")
        self.timespec = ir.LiteralStructType([I64, I64])

    def limit(self, builder: ir.IRBuilder) -> ir.Value:
        """A nap's timeout, `NAP_NANOSECONDS` (made once, in a function's entry block)."""
        limit = builder.alloca(self.timespec)
        builder.store(ir.Constant(self.timespec, [ir.Constant(I64, 0),
                                                  ir.Constant(I64, NAP_NANOSECONDS)]), limit)
        return limit

    def wait(self, builder: ir.IRBuilder, word: ir.Value, value: ir.Value,
             limit: ir.Value) -> None:
        """Sleep while the low 32 bits of the int64 at ``word`` equal ``value``'s, at most
        ``limit`` (`limit`)."""
        builder.call(self.syscall, [
            ir.Constant(I64, self.number), builder.ptrtoint(word, I64),
            ir.Constant(I64, FUTEX_WAIT_PRIVATE), builder.and_(value, ir.Constant(I64, 0xFFFFFFFF)),
            builder.ptrtoint(limit, I64)])

    def wake(self, builder: ir.IRBuilder, word: ir.Value) -> None:
        """Wake every thread napping on ``word``."""
        builder.call(self.syscall, [
            ir.Constant(I64, self.number), builder.ptrtoint(word, I64),
            ir.Constant(I64, FUTEX_WAKE_PRIVATE), ir.Constant(I64, 0x7FFFFFFF)])


def _futex(built: ir.Module, triple: str) -> _Futex | None:
    """Naps where the target is Linux on an architecture whose futex call is known."""
    architecture = triple.split("-")[0]
    if "linux" not in triple or architecture not in FUTEX_CALLS:
        return None
    return _Futex(built, FUTEX_CALLS[architecture])


def _nap(builder: ir.IRBuilder, function: ir.Function, futex: _Futex, limit: ir.Value,
         state: ir.Value, sleepers: int, wake: int, still_waiting) -> None:
    """Nap on the ``wake`` word unless ``still_waiting(builder)`` (an i1, read after this
    thread counts itself in ``sleepers``) says the wait is over; the builder ends after the
    nap. The waker makes its change, then reads ``sleepers`` (`_wake_nappers`): one of the
    two sees the other's, so no nap misses its wake."""
    sequence = _load(builder, state, wake)
    builder.atomic_rmw("add", _field(builder, state, sleepers), ir.Constant(I64, 1), "seq_cst")
    sleep = function.append_basic_block("nap_sleep")
    after = function.append_basic_block("nap_after")
    builder.cbranch(still_waiting(builder), sleep, after)
    builder.position_at_end(sleep)
    futex.wait(builder, _field(builder, state, wake), sequence, limit)
    builder.branch(after)
    builder.position_at_end(after)
    builder.atomic_rmw("sub", _field(builder, state, sleepers), ir.Constant(I64, 1), "seq_cst")


def _wake_nappers(builder: ir.IRBuilder, function: ir.Function, futex: _Futex,
                  state: ir.Value, sleepers: int, wake: int) -> None:
    """After a change napping threads wait for: wake them where any naps (a fence, then a
    read, where none does)."""
    builder.fence("seq_cst")
    napping = builder.icmp_signed(">", builder.load_atomic(
        _field(builder, state, sleepers), "monotonic", 8), ir.Constant(I64, 0))
    wake_block = function.append_basic_block("wake_nappers")
    after = function.append_basic_block("woken")
    builder.cbranch(napping, wake_block, after)
    builder.position_at_end(wake_block)
    builder.atomic_rmw("add", _field(builder, state, wake), ir.Constant(I64, 1), "seq_cst")
    futex.wake(builder, _field(builder, state, wake))
    builder.branch(after)
    builder.position_at_end(after)


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
                   claimed: ir.Block, lost: ir.Block,
                   wake_caller: tuple[ir.Function, _Futex] | None = None) -> None:
    """Read the job, try to claim ``part`` (``claims`` becoming ``claimed_claims``); in
    ``claimed`` run it and count it finished (``wake_caller``: a worker's, then wake the
    caller where it naps waiting for the parts)."""
    task = builder.load_atomic(_field(builder, state, TASK), "monotonic", 8)
    context = builder.load_atomic(_field(builder, state, CONTEXT), "monotonic", 8)
    swapped = builder.cmpxchg(_field(builder, state, CLAIMS), claims, claimed_claims,
                              "acq_rel", "acquire")
    builder.cbranch(builder.extract_value(swapped, 1), claimed, lost)
    builder.position_at_end(claimed)
    builder.call(builder.inttoptr(task, TASK_TYPE.as_pointer()), [context, part, parts])
    builder.atomic_rmw("add", _field(builder, state, FINISHED), ir.Constant(I64, 1), "release")
    if wake_caller is not None:
        _wake_nappers(builder, *wake_caller, state, CALLER_SLEEPERS, CALLER_WAKE)


PART_BITS = 11  # front and back each; parts take the bits above them, below the generation
MAX_PARTS = (1 << (32 - 2 * PART_BITS)) - 1


def _decode(builder: ir.IRBuilder, claims: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(front, back, parts) of a ``claims`` word."""
    mask = ir.Constant(I64, (1 << PART_BITS) - 1)
    return (builder.and_(builder.lshr(claims, ir.Constant(I64, PART_BITS)), mask),
            builder.and_(claims, mask),
            builder.and_(builder.lshr(claims, ir.Constant(I64, 2 * PART_BITS)),
                         ir.Constant(I64, MAX_PARTS)))


def _define_work(built: ir.Module, pause, doze, futex: _Futex | None) -> None:
    function = ir.Function(built, ir.FunctionType(VOID, [I64.as_pointer()]), name="pool_work")
    state, = function.args
    entry, poll, take, claimed, idle, patient, dozing, rest, done = (
        function.append_basic_block(name) for name in
        ("entry", "poll", "take", "claimed", "idle", "patient", "dozing", "rest", "done"))
    builder = ir.IRBuilder(entry)
    zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)
    empty_polls, dozes = builder.alloca(I64), builder.alloca(I64)
    limit = None if futex is None else futex.limit(builder)
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
                   parts, claimed, poll, None if futex is None else (function, futex))
    builder.branch(poll)

    builder.position_at_end(idle)
    waited = builder.add(builder.load(empty_polls), one)
    builder.store(waited, empty_polls)
    if futex is not None:  # armed or stuck, no part for a while: nap until a job is posted
        nap = function.append_basic_block("nap")
        impatient = function.append_basic_block("impatient")
        patience = _load(builder, state, PATIENCE)
        wanted = builder.or_(_load(builder, state, ARMED), _load(builder, state, STICKY))
        builder.cbranch(builder.and_(builder.and_(
            builder.icmp_unsigned(">", waited, _load(builder, state, NAP_POLLS)),
            builder.icmp_unsigned("<=", waited, patience)),
            builder.icmp_signed(">", wanted, zero)), nap, impatient)
        builder.position_at_end(nap)

        def no_part(nap_builder: ir.IRBuilder) -> ir.Value:
            posted = nap_builder.load_atomic(_field(nap_builder, state, CLAIMS), "seq_cst", 8)
            front, back, _ = _decode(nap_builder, posted)
            return nap_builder.icmp_unsigned(">=", front, back)

        before = _load(builder, state, WAKE)
        _nap(builder, function, futex, limit, state, SLEEPERS, WAKE, no_part)
        # Woken by a job posted: patient anew. A nap that ran out counts as half the
        # patience, so that a sticky spin still lapses after about `PATIENCE` idle (and an
        # armed one, past it, naps on).
        woken = builder.icmp_unsigned("!=", _load(builder, state, WAKE), before)
        builder.store(builder.select(woken, zero, builder.add(
            waited, builder.lshr(patience, one))), empty_polls)
        builder.branch(poll)
        builder.position_at_end(impatient)
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


def _log_job(built: ir.Module, function: ir.Function, builder: ir.IRBuilder,
             state: ir.Value, job: tuple[ir.Value, ...]) -> None:
    """Where the state's ``log`` is set, the job written at the next slot (its thread
    first); the builder continues after."""
    log = builder.load(_field(builder, state, LOG))
    write, after = (function.append_basic_block(name) for name in ("log", "logged"))
    builder.cbranch(builder.icmp_unsigned("!=", log, ir.Constant(I64, 0)), write, after)
    builder.position_at_end(write)
    slot = builder.atomic_rmw("add", _field(builder, state, LOG_COUNT), ir.Constant(I64, 1),
                              "monotonic")
    store = function.append_basic_block("log_store")
    builder.cbranch(builder.icmp_unsigned("<", slot, builder.load(
        _field(builder, state, LOG_CAPACITY))), store, after)
    builder.position_at_end(store)
    thread = builder.call(ir.Function(built, ir.FunctionType(I64, []), name="pthread_self"),
                          [])
    entry = builder.gep(builder.inttoptr(log, I64.as_pointer()),
                        [builder.mul(slot, ir.Constant(I64, LOG_WORDS))])
    for index, value in enumerate((thread, *job)):
        builder.store(value, builder.gep(entry, [ir.Constant(I64, index)]))
    builder.branch(after)
    builder.position_at_end(after)


def _define_copy_bytes(built: ir.Module) -> None:
    function = ir.Function(built, TASK_TYPE, name="copy_bytes")
    context = function.args[0]
    builder = ir.IRBuilder(function.append_basic_block("entry"))
    words = builder.inttoptr(context, I64.as_pointer())
    target, source, count = (builder.load(builder.gep(words, [ir.Constant(I64, index)]))
                             for index in range(3))
    bytes_pointer = ir.IntType(8).as_pointer()
    memcpy = built.declare_intrinsic("llvm.memcpy", [bytes_pointer, bytes_pointer, I64])
    builder.call(memcpy, [builder.inttoptr(target, bytes_pointer),
                          builder.inttoptr(source, bytes_pointer), count,
                          ir.Constant(ir.IntType(1), 0)])
    builder.ret_void()


def _define_sequence(built: ir.Module, run: ir.Function) -> None:
    function = ir.Function(built, ir.FunctionType(VOID, [I64.as_pointer(), I64, I64]),
                           name="pool_sequence")
    state, table, count = function.args
    entry, loop, body, done = (function.append_basic_block(name)
                               for name in ("entry", "loop", "body", "done"))
    builder = ir.IRBuilder(entry)
    index = builder.alloca(I64)
    builder.store(ir.Constant(I64, 0), index)
    builder.branch(loop)
    builder.position_at_end(loop)
    at = builder.load(index)
    builder.cbranch(builder.icmp_signed("<", at, count), body, done)
    builder.position_at_end(body)
    triple = builder.gep(builder.inttoptr(table, I64.as_pointer()),
                         [builder.mul(at, ir.Constant(I64, 3))])
    builder.call(run, [state, *(builder.load(builder.gep(triple, [ir.Constant(I64, word)]))
                                for word in range(3))])
    builder.store(builder.add(at, ir.Constant(I64, 1)), index)
    builder.branch(loop)
    builder.position_at_end(done)
    builder.ret_void()


def _define_run(built: ir.Module, pause, futex: _Futex | None) -> ir.Function:
    function = ir.Function(built, ir.FunctionType(VOID, [I64.as_pointer(), I64, I64, I64]),
                           name="pool_run")
    state, task, context, parts = function.args
    entry, alone, posted, poll, take, claimed, wait, done = (
        function.append_basic_block(name) for name in
        ("entry", "alone", "posted", "poll", "take", "claimed", "wait", "done"))
    builder = ir.IRBuilder(entry)
    zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)
    waits = builder.alloca(I64)  # polls waiting on the workers' parts, since the last nap
    builder.store(zero, waits)
    limit = None if futex is None else futex.limit(builder)
    # after the stack slots, which stay in the entry block (where LLVM keeps them in registers)
    _log_job(built, function, builder, state, (task, context, parts))
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
    if futex is not None:
        _wake_nappers(builder, function, futex, state, SLEEPERS, WAKE)
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
    if futex is not None:  # a worker's part outlasts the nap's patience: nap until it ends
        # (a worker taken off its core meanwhile gets this one's share of the CPU)
        waited = builder.add(builder.load(waits), one)
        builder.store(waited, waits)
        nap, spin = (function.append_basic_block(name) for name in ("caller_nap", "spin"))
        builder.cbranch(builder.icmp_unsigned(">", waited, _load(builder, state, NAP_POLLS)),
                        nap, spin)
        builder.position_at_end(nap)

        def unfinished(nap_builder: ir.IRBuilder) -> ir.Value:
            count = nap_builder.load_atomic(_field(nap_builder, state, FINISHED), "seq_cst", 8)
            return nap_builder.icmp_unsigned("<", count, parts)

        _nap(builder, function, futex, limit, state, CALLER_SLEEPERS, CALLER_WAKE,
             unfinished)
        builder.store(zero, waits)
        builder.branch(wait)
        builder.position_at_end(spin)
    pause(builder)
    builder.branch(wait)
    builder.position_at_end(release)
    builder.store_atomic(zero, _field(builder, state, BUSY), "release", 8)
    builder.branch(done)

    builder.position_at_end(done)
    builder.ret_void()
    return function
