"""One process-wide pool of threads that spin between the steps of a run and take parts of them.

Why: a batch-1 plan is a chain of steps each too short for an ordinary thread pool to pay (a
hand-off through Python's queues cost 25–55 µs, docs/threads.md), and BLAS's own threads reach
only the products BLAS runs. Here the workers poll a word of shared memory in native code
(`spin_ir`), so a step handed out costs well under a microsecond, and every step that is
written as a job of parts (our GEMM's tiles, the compiled kernels' channels) uses every core.

A job is a native ``task(context, part, parts)``: a numba ``cfunc`` or LLVM function whose
address, with its context's, is given to `run` (or bound once: `Job`). The caller runs parts
itself too, so a job finishes whether or not any worker is awake.

Workers spin only while a run is `armed` (a plan run holds it around its steps) and a few
milliseconds after (`GRACE_SECONDS`), napping on a futex (Linux) past `NAP_SECONDS` without a
part, as a caller does waiting on a worker's part; then they doze, polling between sleeps of
100 µs in native code (`DOZE_SECONDS`), and then park on a condition: an idle process costs
nothing, a run within the grace finds them spinning, and one while they doze finds them within
100 µs without waking a Python thread (which needs the GIL from the caller running the plan: a
first run after a park took 0.3–4 ms). The doze is short: each of its polls costs about 30 µs
of CPU on a VM, a third of a vCPU, taken from whatever else runs there (in
`bench/executor.py`'s turns the other runtimes ran MobileNet v2 1.5–2.1× as fast beside a
doze of 0.05 s as beside one of 0.5 s), while a run after a pause of 0.1 s or more found the
caches cold either way (`bench/idle_pool.py`). While armed, numpy's OpenBLAS is held to one
thread (`blas_threads.one_thread`), so that BLAS's spinning threads and ours never share the cores
(measured: 8 ms against 0.65 for a product after a switch). A plan whose steps leave BLAS
alone keeps the workers spinning instead (`stick`), and each plan keeps to one thread where
its armed runs measure slower (`Choice`).

The pool is compiled on first use; `available()` is False where llvmlite cannot JIT for the
host, and jobs then run every part on the calling thread.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import blas_threads, denormals, parts, thread_share, usable_cores
from engine.cpu.spin_ir import (
    ARMED,
    DOZE_MICROSECONDS,
    DOZES,
    LOG,
    LOG_CAPACITY,
    LOG_COUNT,
    LOG_WORDS,
    MAX_PARTS,
    NAP_POLLS,
    PATIENCE,
    STATE_SIZE,
    STICKY,
)

GRACE_SECONDS = 0.002  # workers keep spinning this long after the last run ends,
DOZE_SECONDS = 0.05  # then poll between short sleeps this long (shorter than a pause in
# `bench/executor.py`'s turns, so that a dozing worker never runs into another runtime's turn),
# then park on a condition
# Inside an armed run, a worker with no part, or a caller waiting on a worker's part, spins
# this long, then naps until woken (Linux: a futex): see `spin_ir`. On a 2-vCPU Zen 3 VM,
# against 50 µs, whole batch-1 runs in one process: 0.98–0.99× quiet and 0.94–0.98× in the
# host's slower spells (a futex wake costs the next job its worker), 0.92× beside two busy
# loops; two processes of ours sharing the cores ran as fast as with 50 µs, where 500 µs cost
# them 10–15% (docs/benchmarks.md, "The spin pool's naps").
NAP_SECONDS = 200e-6
# Parts of a job per core at most: a late worker leaves only a small part to wait for.
PARTS_PER_CORE = 4

_state: dict[str, Any] = {}
_lock = threading.Lock()


def available() -> bool:
    """Whether the pool's native code compiled for this machine (compiled on first call)."""
    return _pool() is not None


def cores() -> int:
    """Cores this process may keep busy (`usable_cores.count`)."""
    return usable_cores.count()


def balanced(parts: int) -> int:
    """``parts`` rounded up to a multiple of the cores where it is more than they are: the
    threads claim parts as they come, so parts of equal work in a number the cores do not
    divide leave one thread a part more than the others. ResNet-50 v2's 3×3 products at 14²
    in bf16 (7 parts), two Zen 5 cores, warm: 253 µs in 7 parts, 223 in 8 (one thread: 419);
    in the plan's walk 0.26-0.27 → 0.235-0.24 ms, the whole walk 10.5-10.8 → 10.4-10.7 ms."""
    count = cores()
    return parts if parts <= count else -(-parts // count) * count


def threads() -> int:
    """Threads a run armed now would use, the caller's included: BLAS's thread count (the
    process's one setting for how many cores a call may use, see docs/threads.md), at most the
    cores; 1 where the pool is unavailable."""
    if _pool() is None:
        return 1
    share = thread_share.cores()  # a served instance's share, BLAS held to one meanwhile
    return max(1, min(blas_threads.threads() if share is None else share, cores()))


class Job(partial):
    """``task(context, part, parts)`` for each part, bound once: calling it runs the job
    through the pool (`run`). ``keep`` holds what the context's addresses point into."""

    keep: tuple[Any, ...]
    leaves_blas_alone = True  # native parts; see `parts.PartedCall`


def job(task: int, context: Any, parts: int, keep: tuple[Any, ...] = ()) -> Job:
    """A `Job` of ``parts`` parts (at most `MAX_PARTS`) of ``task`` (a native function's
    address) over ``context`` (an int64 array its parts read)."""
    pool = _pool()
    parts = max(1, min(int(parts), MAX_PARTS))
    if parts > 1:
        _note_split_job()
    if pool is None:
        bound = Job(_alone, task, context.ctypes.data, parts)
    else:
        bound = Job(pool.run, pool.address, task, context.ctypes.data, parts)
    bound.keep = (context, *keep)
    return bound


@contextmanager
def watching() -> Iterator[list[bool]]:
    """A list that holds True once a job of several parts is made on this thread inside (a
    plan compiling: worth arming for its runs, see `armed`)."""
    seen: list[bool] = []
    outer = getattr(_watchers, "seen", None)
    _watchers.seen = seen
    try:
        yield seen
    finally:
        _watchers.seen = outer
        if outer is not None and seen:
            outer.append(True)


_watchers = threading.local()


def expect_split_jobs() -> None:
    """Said at bind by a step that makes its jobs of parts at its first run rather than while
    the plan compiles (their buffers or weights known only then): the plan is worth arming,
    as though the jobs were made now."""
    _note_split_job()


def _note_split_job() -> None:
    seen = getattr(_watchers, "seen", None)
    if seen is not None and not seen:
        seen.append(True)


class WhenArmed:
    """A step with two ways to run: as a `Job` while the pool is armed (or its workers kept
    spinning, `stick`), else as ``alone``, where the job alone on one thread runs slower than
    the call it replaces (a strided copy: numba's loop 99 µs against NumPy's 72 on one core,
    51 on two). The job is made by
    ``make_job`` at the first armed run (None: ``alone`` always), so that plans never armed
    (a server's, on one thread) make none: a ResNet-18 plan at batch 32 has 3,900 such
    steps, and making their jobs up front stalled the process's other threads for up to 90 ms
    of garbage collection while it compiled."""

    __slots__ = ("make_job", "alone", "source", "_job", "_state")
    leaves_blas_alone = True

    def __init__(self, make_job: Any, alone: Any) -> None:
        self.make_job, self.alone = make_job, alone
        self._job: Any = None
        _note_split_job()  # a plan holding one is worth arming
        pool = _pool()
        self._state = None if pool is None else pool.state

    def __call__(self) -> None:
        state = self._state
        if state is None or not (state[ARMED] or state[STICKY]):
            self.alone()
            return
        if self._job is None:
            self._job = self.make_job() or self.alone
        self._job()

    def runs_now(self) -> Any:
        """The call it makes now: its job (None until made) where the workers are wanted,
        else ``alone`` (`steady_walk`)."""
        return self._job if wanted() else self.alone


def _alone(task: int, context: int, parts: int) -> None:
    """A job without the pool: all of it as one part, as `pool_run` runs it unarmed."""
    ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(task)(context, 0, 1)


def runs_jobs(func: Any) -> bool:
    """Whether ``func`` is the pool's own ``pool_run``: a `partial` of it (a `Job`, a
    `gemm_kernel.Product`, ...) is a job and nothing else."""
    pool = _state.get("pool")
    return pool is not None and func is pool.run


def wanted() -> bool:
    """Whether jobs posted now take the workers (a run armed, or the workers stuck)."""
    pool = _state.get("pool")
    return pool is not None and bool(pool.state[ARMED] or pool.state[STICKY])


# Jobs a log holds at most (4 int64s each): a ResNet-50 at batch 32 posts about 3,000 a run.
LOG_ENTRIES = 1 << 15


class JobLog:
    """``with JobLog() as log:`` every job posted inside, on any thread, is logged natively
    (`spin_ir`'s ``log``); ``log.position()`` marks a point, ``log.between(marks)`` gives
    the (task, context, parts) of this thread's jobs between each two marks, in order (None
    where the log ran out of room). Logs may nest and overlap across threads: logging stays
    on while any is open."""

    __slots__ = ("_pool", "_thread")

    def __enter__(self) -> JobLog:
        self._pool = _pool()
        self._thread = threading.get_ident()
        if self._pool is not None:
            self._pool.open_log()
        return self

    def __exit__(self, *exception: object) -> None:
        if self._pool is not None:
            self._pool.close_log()

    def position(self) -> int:
        return 0 if self._pool is None else int(self._pool.state[LOG_COUNT])

    def between(self, marks: list[int]) -> list[np.ndarray] | None:
        """This thread's jobs between each two positions of ``marks`` (ascending), each an
        int64 array of (task, context, parts) rows, from one pass over the log; None where
        some were not kept (the log full) or the pool is off."""
        pool = self._pool
        if pool is None or marks[-1] > LOG_ENTRIES:
            return None
        entries = pool.log[marks[0]:marks[-1]]
        mine = entries[:, 0] == np.int64(np.uint64(self._thread).astype(np.int64))
        kept = np.ascontiguousarray(entries[mine, 1:])
        # each mark's place among this thread's entries
        places = np.concatenate(([0], np.cumsum(mine)))[np.asarray(marks) - marks[0]]
        return [kept[first:last] for first, last in zip(places, places[1:])]


def byte_copy(target: np.ndarray, source: np.ndarray) -> Job | None:
    """A job copying ``source``'s bytes (read at each run) into ``target``, both
    C-contiguous and as large; None where the pool is unavailable."""
    pool = _pool()
    if pool is None:
        return None
    context = np.array([target.ctypes.data, source.ctypes.data, target.nbytes], np.int64)
    return job(pool.copy_bytes, context, 1, keep=(target, source))


def sequence(table: np.ndarray) -> Job | None:
    """The jobs of ``table`` (an int64 array of (task, context, parts) rows, as a `JobLog`
    gives) run in order in one native call, each as its own call would run it; None where
    the pool is unavailable. The caller keeps alive what the contexts point into."""
    pool = _pool()
    if pool is None:
        return None
    table = np.ascontiguousarray(table, np.int64)
    bound = Job(pool.sequence, pool.address, table.ctypes.data, len(table))
    bound.keep = (table,)
    return bound


def spinning() -> bool:
    """Whether a run is armed now (on any thread): jobs take the workers."""
    pool = _state.get("pool")
    return pool is not None and bool(pool.armed_count)


def quiet_for_blas(call: Any) -> bool:
    """Whether ``call`` never has BLAS spread work over its threads: a step that says so (a
    job, our GEMM's product: `parts.leaves_blas_alone`), a NumPy ufunc or copy, or a BLAS
    product too small for OpenBLAS to thread (under `QUIET_MACS` multiply-adds). A plan of
    such steps needs no BLAS held to one thread, and keeps the workers spinning across its
    runs (`stick`)."""
    if parts.leaves_blas_alone(call):
        return True
    func = getattr(call, "func", None)
    if func is np.copyto or isinstance(func, np.ufunc) and func is not np.matmul:
        return True
    if func in (np.dot, np.matmul) and len(call.args) == 3:
        left, right, out = call.args
        return (isinstance(left, np.ndarray) and isinstance(out, np.ndarray)
                and out.size * left.shape[-1] < QUIET_MACS)
    return False


QUIET_MACS = 1 << 16


def stick(threads: int) -> None:
    """Workers spinning from now until they go `GRACE_SECONDS` without a part to run: for a
    plan run too short for `armed` around it to pay (the seed MLP at batch 1 runs in 11 µs
    this way, 15 armed run by run), whose steps leave BLAS alone (`quiet_for_blas`).
    ``threads`` counts the caller: ``threads - 1`` workers are woken where parked."""
    pool = _state.get("pool")
    if pool is None or threads < 2:
        return
    state = pool.state
    if not state[STICKY]:
        state[STICKY] = 1
        if pool.parked or len(pool.workers) < threads - 1:
            pool.wake_for(threads - 1)


def unstick() -> None:
    """Jobs run on their caller alone from now on, unless a run is armed: `stick`'s flag is
    cleared, so that the workers spin out their patience and doze (while it is set, every job
    posted, armed or not, takes them, and keeps them spinning). For a caller that wants the
    next runs on one core (a served batch too cheap to spread, `engine.serving.cores`)."""
    pool = _state.get("pool")
    if pool is not None:
        pool.state[STICKY] = 0


class armed:  # noqa: N801 - used as a context manager, like a function's result
    """``with armed() as threads:``: workers spinning for the jobs run inside, with BLAS on one
    thread; ``threads`` is how many threads the jobs run on (1: nothing armed, jobs run
    alone). ``threads`` defaults to `threads()`. A class, not a generator: a plan run enters
    it every time (2 µs against 11). (A plan whose steps leave BLAS alone keeps the workers
    spinning with `stick` instead.)
    """

    __slots__ = ("_requested", "_pool")

    def __init__(self, threads: int | None = None) -> None:
        self._requested = threads
        self._pool: _Pool | None = None

    def __enter__(self) -> int:
        count = threads() if self._requested is None else min(self._requested, cores())
        pool = _pool()
        if pool is None or count < 2:
            return 1
        pool.arm(count - 1)
        self._pool = pool
        return count

    def __exit__(self, *exception: object) -> None:
        if self._pool is not None:
            self._pool.disarm()
            self._pool = None


class Choice:
    """Whether a plan's runs go faster armed or on one thread, measured as it runs.

    Armed should win wherever the cores are the process's own; but on a shared machine the
    second vCPU may help little (on the 2-core VM these numbers come from, for seconds at a
    time, ResNet-18 at batch 1 ran 30 ms armed against 29 on one thread, where it usually
    runs 17: the steps that read what the other thread wrote ran 2–3× slower), and then the
    spinning costs more than it brings. So each plan times its runs both ways (the first run
    each way left out: it makes the jobs of `WhenArmed` steps) and takes the faster, and
    every `EXPLORE` runs one goes the other way, to notice when the machine changes (on
    ResNet-18 where armed wins, that run costs 12 ms in 32 runs of 17: 2%).

    A way's time is the `RANK`-th fastest (the second) of its newest `KEPT` samples, once each
    way has `SAMPLES`: noise on a shared host only ever slows a run, and comes in bursts. In
    the executor benchmark's turns every run of ours ran about 1.5× slower than alone, armed
    runs spiking to 9–20 ms, and with the median of three samples a way, three armed runs of
    one turn at 14–20 ms (fp32 MobileNet v2, armed about 10 ms against 14 on one thread) sent
    the plan to one thread for its last two turns. Back to back, a way kept by eight samples
    is left only when seven of them are slower than the other way's: a burst of up to six
    slow runs leaves the choice as it was, and after a lasting change (armed at 30 ms against
    29) the eighth run goes the other way. Replayed over bursts of 3–6 runs at 1.5–3× in a
    stream where armed runs at 0.6× one thread (`bench/choice_replay.py`), the median of
    three put 9–17% of runs on the slower way, this rule 3–7%, against 3% (the explorations)
    without bursts. An exploring run that beats the way taken explores again at once (unless its
    sample has already made its way the one taken: a follow-up run the other way would then
    be a run on the losing way), so a burst that left the other way's samples slow is
    forgotten within `RANK` + 1 runs, not as many explorations
    (MobileNet v2 on two cores ran a bench round's median at its one-thread 10 ms where armed
    runs took 6). The first samples are the likeliest to mislead, taken while the process is
    still starting or its neighbours are (ResNet-18's first armed runs in the executor
    benchmark took 43-59 ms, against 17 once the machine settled, and the plan ran on one
    thread at 24 ms until its 32nd run), so before `EXPLORE` runs the other way is also tried
    at runs 4, 8 and 16.

    Runs that come in bursts after idle pauses (the executor benchmark's turns, a server's
    sporadic requests) need two more things. A run that starts `IDLE_SECONDS` or more after
    the plan's last one ended finds its weights gone from the caches and runs slower either
    way (ResNet-18 bf16 on one thread: the first run after 0.1 s idle 9.7 ms, the next ones
    6.9, back to back 5.9; docs/benchmarks.md), so such "cold" runs are compared only with
    cold runs: each kind keeps its own samples, and a run is decided by its own kind's where
    both ways have them. Cold runs keep three a way (`KEPT`'s second entry): a burst of noise
    within a turn slows one of them at most, and with eight a change of the machine took
    eight turns to show in them.
    And counting runs is no clock where they are sparse: two runs a turn, turns seconds
    apart, and a choice made among the neighbours' start-up held for the whole benchmark
    (MobileNet v2 on one thread throughout, its armed samples taken while seven other
    runtimes loaded). So the other way is also tried after `EXPLORE` / 4 runs of a kind where
    its newest sample of that kind is older than `EXPLORE` runs take (the taken way's time
    each, at least `MIN_STALE_SECONDS`): never in a steady stream, where `EXPLORE` runs come
    first, and one run of a kind in `EXPLORE` / 4 at most where runs are far apart. Each
    such exploration of a kind that loses doubles that wait, up to `EXPLORE` runs, and one
    that wins brings it back to `EXPLORE` / 4: in the executor benchmark's turns of four or
    five runs, 2.5 s apart, a one-thread run every other turn cost ResNet-18 fp32 at batch 1
    about a tenth of a turn (30-41 ms among armed runs of 19-24) where armed kept winning.

    Where the way not taken is `WIDE_MARGIN` times slower or more, both its scheduled and its
    stale explorations come `WIDE_SPACING` times as far apart: such an exploration is dear
    (ResNet-18 int8 at batch 1 on two vCPUs, 9.9 ms armed, 19.5 on one thread: the executor
    benchmark's turns of seven runs held an exploring run often enough to lift the median of
    their means from 9.9 to 11.4 ms, where OpenVINO's read 10.2), and it cannot be what
    notices the change: for the other way to win, the taken one must slow to near the other's
    sample, which its own samples show, and then the margin narrows and the spacing is back
    to `EXPLORE`. Only where armed is the way taken: armed runs far slower than one thread's
    are a spell of the other vCPU lent elsewhere, which ends without one thread slowing, so
    they are tried at the ordinary spacing (ResNet-50 v2 in the executor benchmark's turns on
    two Zen 5 vCPUs ran its every-core case on one thread throughout, 0.99 cores in its turns
    and 36.9 ms a call where armed runs took 21.8 in the run before: most likely held there by
    armed samples from such a spell)."""

    SAMPLES = 3  # each way has as many before its samples decide
    KEPT = (8, 3)  # newest samples kept a way: back to back, after an idle pause
    RANK = 1  # the sample that stands for a way: 0 the fastest, 1 the second
    EXPLORE = 32
    # Where the way not taken is this much slower, it is tried `WIDE_SPACING` times as far
    # apart (see the class).
    WIDE_MARGIN = 1.5
    WIDE_SPACING = 4
    IDLE_SECONDS = 0.02
    MIN_STALE_SECONDS = 0.25

    __slots__ = ("_times", "_tried", "_tried_run", "_runs", "_kind_runs", "_warm", "_again",
                 "_stale_after", "_stale_try", "_clock", "_ended", "_kind", "_basis")

    def __init__(self, clock: Any = time.perf_counter) -> None:
        # [kind][way]: kind 0 back to back, 1 after an idle pause; way 0 armed, 1 one thread
        self._times: list[list[list[float]]] = [[[], []], [[], []]]
        self._tried = [[0.0, 0.0], [0.0, 0.0]]  # when each kind's newest sample each way ended
        self._tried_run = [[0, 0], [0, 0]]  # and at which run of its kind
        self._kind_runs = [0, 0]  # runs of each kind
        self._runs = 0
        self._warm = [False, False]  # the first run each way makes jobs (`WhenArmed`): unkept
        # a kind's last exploring run won: the way (0 armed, 1 one thread) its next run tries
        self._again: list[int | None] = [None, None]
        # runs of a kind after which the untaken way's samples are stale (where runs are far
        # apart): doubled by each exploration that loses, reset by one that wins
        self._stale_after = [self.EXPLORE // 4, self.EXPLORE // 4]
        self._stale_try = False  # the run under way explores for staleness alone
        self._clock = clock
        self._ended: float | None = None  # when the last run ended
        self._kind = 0  # the run under way: back to back (0) or after an idle pause (1)
        self._basis: int | None = None  # whose samples decided it (a kind), None: none yet

    def armed(self) -> bool:
        """Whether the next run should be armed."""
        self._runs += 1
        now = self._clock()
        self._kind = int(self._ended is not None and now - self._ended >= self.IDLE_SECONDS)
        self._kind_runs[self._kind] += 1
        self._basis = self._decided_by(self._kind)
        if self._basis is None:  # each way in turn, within this kind
            armed, alone = self._times[self._kind]
            return len(armed) <= len(alone)
        faster = self._faster(self._basis)
        runs = self._runs
        early = runs < self.EXPLORE and runs & (runs - 1) == 0  # runs 4, 8 and 16
        taken = 0 if faster else 1
        other = 1 - taken
        spacing = self._spacing(self._basis, taken)
        explore = self.EXPLORE * spacing
        stale = (self._kind_runs[self._basis] - self._tried_run[self._basis][other]
                 >= min(self._stale_after[self._basis] * spacing, explore)
                 and now - self._tried[self._basis][other] > max(
                     self.MIN_STALE_SECONDS,
                     explore * self._typical(self._times[self._basis][taken])))
        again, self._again[self._kind] = self._again[self._kind], None
        self._stale_try = False
        if again is not None and again != taken:
            return again == 0
        scheduled = early or runs % explore == 0
        self._stale_try = stale and not scheduled
        return faster != (scheduled or stale)

    def record(self, armed: bool, seconds: float) -> None:
        """A run's wall time, armed or on one thread (the run `armed` was last asked about)."""
        self._ended = self._clock()
        way = 0 if armed else 1
        if not self._warm[way]:
            self._warm[way] = True
            return
        kind = self._kind
        if self._basis == kind and self._faster(kind) != armed:  # an exploring run
            won = seconds < self._typical(self._times[kind][1 - way])
            self._again[kind] = way if won else None
            if won:
                self._stale_after[kind] = self.EXPLORE // 4
            elif self._stale_try:
                self._stale_after[kind] = min(2 * self._stale_after[kind], self.EXPLORE)
        times = self._times[kind][way]
        times.append(seconds)
        if len(times) > self.KEPT[kind]:
            del times[0]
        self._tried[kind][way] = self._ended
        self._tried_run[kind][way] = self._kind_runs[kind]

    def _decided_by(self, kind: int) -> int | None:
        """The kind of runs whose samples decide a run of ``kind``: its own where both ways
        have `SAMPLES`, else the other kind's where they do, else None."""
        for basis in (kind, 1 - kind):
            if all(len(times) >= self.SAMPLES for times in self._times[basis]):
                return basis
        return None

    def _spacing(self, kind: int, taken: int) -> int:
        """How many `EXPLORE`s apart the other way is tried, decided by ``kind``'s samples
        with way ``taken`` (0 armed, 1 one thread) the faster: `WIDE_SPACING` where armed is
        taken and one thread's time is `WIDE_MARGIN` times armed's or more, else 1."""
        if taken != 0:
            return 1
        armed, alone = self._times[kind]
        wide = self._typical(alone) >= self.WIDE_MARGIN * self._typical(armed)
        return self.WIDE_SPACING if wide else 1

    def _faster(self, kind: int) -> bool:
        """Whether armed runs of ``kind`` are the faster way now."""
        armed, alone = self._times[kind]
        return self._typical(armed) <= self._typical(alone)

    def _typical(self, values: list[float]) -> float:
        """The time that stands for a way's kept samples: the `RANK`-th fastest (0 the
        fastest), or the slowest where fewer are kept."""
        return sorted(values)[min(self.RANK, len(values) - 1)]


class _Pool:
    """The native functions, the state they share and the worker threads."""

    def __init__(self, functions: dict[str, Any]) -> None:
        self.functions = functions
        self.work, self.run = functions["work"], functions["run"]
        self.sequence = functions["sequence"]
        self.copy_bytes = functions["copy_bytes"]
        self.state = np.zeros(STATE_SIZE, np.int64)
        self.address = self.state.ctypes.data
        self.log = np.zeros((LOG_ENTRIES, LOG_WORDS), np.int64)
        self.state[LOG_CAPACITY] = LOG_ENTRIES
        self.logs_open = 0
        self.state[PATIENCE] = self._polls(GRACE_SECONDS)
        self.state[NAP_POLLS] = max(1, self._polls(NAP_SECONDS, at_least=1))
        self.state[DOZES] = int(DOZE_SECONDS * 1e6 / DOZE_MICROSECONDS)
        self.wake = threading.Condition(threading.Lock())
        self.armed_count = 0  # runs armed now, on any thread
        self.wanted = 0  # workers those runs want spinning
        self.parked = 0  # workers waiting on `wake`
        self.workers: list[threading.Thread] = []
        self.native_ids: list[int | None] = []  # each worker's thread id, once it runs
        # the core each worker is held to (`_place`), and the caller's core they leave free
        self.placement: list[int] = []
        self.caller_cpu: int | None = None
        # the first armed caller's thread id and own mask, given back when the last disarms
        self.caller_held: tuple[int, set[int]] | None = None

    def open_log(self) -> None:
        with self.wake:
            if not self.logs_open:
                self.state[LOG_COUNT] = 0
                self.state[LOG] = self.log.ctypes.data
            self.logs_open += 1

    def close_log(self) -> None:
        with self.wake:
            self.logs_open -= 1
            if not self.logs_open:
                self.state[LOG] = 0

    def arm(self, workers: int) -> None:
        """A run wants ``workers`` workers spinning and BLAS held to one thread (while it is
        one thread, `threads()` is 1: later runs arm nothing, but their jobs still take the
        workers whenever no other job is posted)."""
        blas_threads.hold_one()
        with self.wake:
            self.armed_count += 1
            self.state[ARMED] = 1
            self._release(workers)
            if self.armed_count == 1:
                self._place(_current_cpu())

    def wake_for(self, workers: int) -> None:
        """``workers`` workers started and out of the condition (a sticky run's)."""
        with self.wake:
            self._release(workers)

    def disarm(self) -> None:
        with self.wake:
            self.armed_count -= 1
            if not self.armed_count:
                self.state[ARMED] = 0
                self.wanted = 0
                if self.caller_held is not None:  # the caller as free as it was
                    _hold(*self.caller_held)
                    self.caller_held = None
        blas_threads.release_one()

    def _release(self, workers: int) -> None:
        """At least ``workers`` wanted, started, and none left on the condition (under
        `wake`)."""
        if workers > self.wanted:
            self.wanted = workers
            while len(self.workers) < workers:
                worker = threading.Thread(target=self._serve, args=(len(self.workers),),
                                          name=f"engine-spin-{len(self.workers)}",
                                          daemon=True)
                self.workers.append(worker)
                self.native_ids.append(None)
                worker.start()
        if self.parked:
            self.wake.notify_all()

    def _place(self, caller: int | None) -> None:
        """The first armed caller held to its core (``caller``) until it disarms, each
        worker to a core of its own, none of them the caller's (under `wake`). Left free,
        after an idle pause of 0.5 s the kernel woke a worker on the caller's vCPU, or the
        caller on the worker's (a futex wake pulls its sleeper to the waker's core), and
        the two shared one core until its balancer parted them a run or two later:
        ResNet-18 int8 at batch 1 on two vCPUs ran the first two runs of a turn at 21–22 ms
        against 15 steady; held, 14.3–15.2 (OpenVINO holds its threads likewise). Nothing
        is held where the threads do not fill every core the mask names: with fewer, or
        under a container's CPU limit, processes would be held to the same cores."""
        allowed = usable_cores.cpus()
        if caller is None or caller not in allowed:
            return
        others = [cpu for cpu in allowed if cpu != caller]
        if len(others) != len(self.workers):  # a core each, every core the mask names
            return
        own = os.sched_getaffinity(0)
        if own != {caller}:
            self.caller_held = threading.get_native_id(), own
            _hold(0, {caller})
        if caller == self.caller_cpu and len(self.placement) == len(self.workers):
            return
        self.caller_cpu, self.placement = caller, others[:len(self.workers)]
        for thread_id, cpu in zip(self.native_ids, self.placement, strict=True):
            if thread_id is not None:
                _hold(thread_id, {cpu})

    def _serve(self, index: int) -> None:
        denormals.flush_here()  # a worker runs nothing but kernels' parts
        with self.wake:  # held where `_place` put this worker before it ran
            self.native_ids[index] = threading.get_native_id()
            if index < len(self.placement):
                _hold(0, {self.placement[index]})
        while True:
            with self.wake:
                while not ((self.armed_count or self.state[STICKY]) and index < self.wanted):
                    self.parked += 1
                    self.wake.wait()
                    self.parked -= 1
            self.work(self.address)  # spins without the GIL until disarmed and patient

    def _polls(self, seconds: float, at_least: int = 1000) -> int:
        """Empty polls that take about ``seconds`` on this CPU (timed once, unarmed)."""
        if "per_poll" not in self.__dict__:
            trial = np.zeros(STATE_SIZE, np.int64)
            trial[PATIENCE] = 20_000
            start = time.perf_counter()
            self.work(trial.ctypes.data)
            self.per_poll = max((time.perf_counter() - start) / 20_000, 1e-9)
        return max(at_least, int(seconds / self.per_poll))


def _current_cpu() -> int | None:
    """The core the calling thread runs on (glibc's ``sched_getcpu``), None where unknown."""
    if "sched_getcpu" not in _state:
        try:
            function = ctypes.CDLL(None, use_errno=True).sched_getcpu
            function.restype = ctypes.c_int
        except (AttributeError, OSError):
            function = None
        _state["sched_getcpu"] = function
    function = _state["sched_getcpu"]
    cpu = function() if function is not None else -1
    return cpu if cpu >= 0 else None


def _hold(thread_id: int, cpus: set[int]) -> None:
    """Thread ``thread_id`` (0: the calling one) runs on ``cpus`` alone from now on."""
    try:
        os.sched_setaffinity(thread_id, cpus)
    except (AttributeError, OSError):  # no such call here, or the thread has ended
        pass


def _pool() -> _Pool | None:
    if "pool" not in _state:
        with _lock:
            if "pool" not in _state:
                functions = _compile()
                _state["pool"] = None if functions is None else _Pool(functions)
    return _state["pool"]


def _compile() -> dict[str, Any] | None:
    try:
        import llvmlite.binding as llvm

        from engine.cpu.llvm_jit import compile_ir
        from engine.cpu.spin_ir import module
    except ImportError:
        return None
    try:
        engine = compile_ir(str(module(llvm.get_default_triple())))
    except (RuntimeError, OSError):
        return None
    int64 = ctypes.c_int64
    work = ctypes.CFUNCTYPE(None, int64)(engine.get_function_address("pool_work"))
    run = ctypes.CFUNCTYPE(None, int64, int64, int64, int64)(
        engine.get_function_address("pool_run"))
    sequence = ctypes.CFUNCTYPE(None, int64, int64, int64)(
        engine.get_function_address("pool_sequence"))
    # The execution engine owns the machine code: it lives as long as the functions.
    return {"work": work, "run": run, "sequence": sequence, "engine": engine,
            "copy_bytes": engine.get_function_address("copy_bytes")}
