"""A CPU plan's steady runs replayed: the jobs its steps post, run by one native call.

Why: a batch-1 plan of a small network is dozens of steps of 10–50 µs, and each step's Python
(finding which job to post from its hand-offs' flags, an int8 layer checking its ranges and
thread, the calls through its objects) costs a few microseconds with its objects out of
cache. MobileNet v2 int8 on one thread spent about 15% of a run there (0.28 of 1.89 ms), bf16
about 5%. Once a plan's runs settle, every run posts the same jobs in the same order: the
steps' decisions depend on state that stops changing after the first runs (hand-offs taken
at bind, jobs made on first use, calibrated ranges).

How: a run records (`spin_pool.JobLog`): each step's jobs as the pool logs them natively, and
whether the step is *replayable*: all it does is post jobs, beyond bookkeeping of its own
(`replayable`). Two recorded runs in a row that post the same jobs make the record steady;
the runs after replay it: the replayable steps' jobs in one native call
(`spin_pool.sequence`) per stretch of them, the other steps called as they are. Every
`CHECK_EVERY` replays a run records again and must match, and a record is kept per way of
running (armed or not, the thread, switches such as int8's compiled paths: `switch`): a
run whose way has no steady record records, and drops every other thread's records: its
steps may replace what those name (MobileNet v2 int8 run by two threads in turn, each
replaying its own record, crashed in one test run of six, the other thread's run having
rebound the jobs it named). Threads that take turns on a plan so record and replay nothing;
one thread's stream of runs replays as before. Anything that runs the steps outside `run`
(`Plan.walk`) calls `disturbed`, and every way records anew; so does a recorded run that
posts other jobs than its way's record (objects another record names may be gone).
Counters a step adds to as it runs (int8's `integer.PATHS`, `counters`) get the recorded
run's increments at each replay.

A step is replayable where `replayable` can tell from its call: a `partial` of the pool's
``pool_run`` (a job: `spin_pool.Job`, `gemm_kernel.Product`, ...), a `partial` of a function
marked `in_turn` (it calls its arguments in order, nothing else) over replayable calls, an
object whose ``replayable()`` says so (each such class answers for the calls it may make),
or one whose ``runs_now()`` names the one call it makes now (`spin_pool.WhenArmed`).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import spin_pool

CHECK_EVERY = 64  # replays between two recorded runs that must match the record
# Records a plan keeps (ways of running of one thread: armed or not, the switches), the
# oldest dropped first.
MAX_RECORDS = 8

_settings = {"on": True}
_IN_TURN: set[Any] = set()
_SWITCHES: list[Callable[[], Any]] = []
_COUNTERS: list[Counter] = []


def use(enabled: bool) -> None:
    """Replay steady runs (the default), or call every step at every run (a benchmark's
    comparison, or to rule the replay out)."""
    _settings["on"] = enabled


def in_turn(function: Callable[..., Any]) -> Callable[..., Any]:
    """Marks ``function`` as calling each of its arguments in order and doing nothing else:
    a `partial` of it over replayable calls is replayable."""
    _IN_TURN.add(function)
    return function


def switch(read: Callable[[], Any]) -> None:
    """A process-wide setting the steps' choices depend on (``read()`` gives its value):
    records are kept per value."""
    _SWITCHES.append(read)


def counters(counts: Counter) -> None:
    """A `Counter` steps add to as they run: a replay adds the recorded run's increments."""
    _COUNTERS.append(counts)


def replayable(call: Any) -> bool:
    """Whether ``call``'s work, as it ran last, is the jobs it posted and nothing else."""
    answer = getattr(call, "replayable", None)
    if answer is not None:
        return bool(answer())
    now = getattr(call, "runs_now", None)  # a step that makes one of several calls
    if now is not None:
        made = now()
        return made is not None and replayable(made)
    if isinstance(call, partial) and type(call).__call__ is partial.__call__:
        if spin_pool.runs_jobs(call.func):
            return True
        if call.func in _IN_TURN:
            return not call.keywords and all(replayable(arg) for arg in call.args)
    return False


def all_replayable(*calls: Any) -> bool:
    """Whether each of ``calls`` that is not None is `replayable`: for a step's
    ``replayable()`` naming the calls it may make."""
    return all(call is None or replayable(call) for call in calls)


class _Record:
    """One way of running's record: the steps it was made from, the segments a replay runs (a
    `spin_pool.sequence` job, or a call of one step), the jobs the replayed steps posted, end
    to end, and how many each (-1 for a step called as it is), and the counters' increments
    from the replayed steps."""

    __slots__ = ("steps", "segments", "jobs", "counts_of_jobs", "counts", "steady", "replays")

    def __init__(self, steps: tuple[Any, ...], segments: list[Any], jobs: np.ndarray,
                 counts_of_jobs: tuple[int, ...], counts: list[Counter]) -> None:
        self.steps, self.segments, self.jobs = steps, segments, jobs
        self.counts_of_jobs, self.counts = counts_of_jobs, counts
        self.steady = False
        self.replays = 0

    def same_as(self, other: _Record) -> bool:
        return (self.counts_of_jobs == other.counts_of_jobs and self.steps == other.steps
                and np.array_equal(self.jobs, other.jobs))


class SteadyWalk:
    """The steady-run replay of one plan's steps (each with ``call``): `run` runs them,
    replaying where a steady record of this way of running exists."""

    def __init__(self) -> None:
        self._records: dict[tuple[Any, ...], _Record] = {}

    def disturbed(self) -> None:
        """The steps ran outside `run` (their objects may have changed, and with them the
        jobs a record names): every way of running records anew."""
        self._records.clear()

    def run(self, steps: list[Any], call_steps: Callable[[Iterable[Any]], None]) -> None:
        """One run of ``steps``: replayed, or called (through ``call_steps``, which takes
        steps in order) and recorded."""
        if not _settings["on"]:
            self.disturbed()  # its steps' objects may change meanwhile
            call_steps(steps)
            return
        way = (spin_pool.wanted(), threading.get_ident(), *(read() for read in _SWITCHES))
        record = self._records.get(way)
        if record is not None and record.steady and record.replays < CHECK_EVERY \
                and record.steps == tuple(steps):
            record.replays += 1
            for segment in record.segments:
                segment()
            for counts, increments in zip(_COUNTERS, record.counts):
                if increments:
                    counts.update(increments)
            return
        self._records.pop(way, None)  # until this recorded run ends
        # A run that calls its steps may replace objects another thread's record names (an
        # int8 layer rebinds every thread's jobs for another epilogue; its jobs are each
        # thread's): those records go, so that a record replays only the objects its own
        # thread's runs left (kept, one thread's stream of runs replays unchanged).
        thread = way[1]
        for other in [key for key in self._records if key[1] != thread]:
            del self._records[other]
        made = _recorded(tuple(steps), call_steps)
        if made is None:
            return
        made.steady = record is not None and made.same_as(record)
        if record is not None and not made.steady:
            # what the steps post changed: objects another way's record names may be gone
            self._records.clear()
        if len(self._records) >= MAX_RECORDS:
            del self._records[next(iter(self._records))]
        self._records[way] = made


def _recorded(steps: tuple[Any, ...], call_steps: Callable[[Iterable[Any]], None]
              ) -> _Record | None:
    """``steps`` called with their jobs logged, made into a record; None where the log lost
    some."""
    marks: list[int] = []
    counted: list[list[dict]] = []  # the counters before each step, and after the last
    with spin_pool.JobLog() as log:

        def marked() -> Iterable[Any]:
            for step in steps:
                marks.append(log.position())
                counted.append([dict(counts) for counts in _COUNTERS])
                yield step

        call_steps(marked())
        marks.append(log.position())
        counted.append([dict(counts) for counts in _COUNTERS])
        logged = log.between(marks)
    if logged is None:
        return None
    return _made(steps, logged, counted, call_steps)


def _made(steps: tuple[Any, ...], logged: list[np.ndarray], counted: list[list[dict]],
          call_steps: Callable[[Iterable[Any]], None]) -> _Record:
    """The record of a run of ``steps`` that posted ``logged`` (each step's jobs), the
    counters ``counted`` before each step and after the last: each stretch of replayable
    steps one native sequence."""
    segments: list[Any] = []
    jobs: list[np.ndarray] = []
    counts_of_jobs: list[int] = []
    counts = [Counter() for _ in _COUNTERS]
    stretch: list[np.ndarray] = []

    def close_stretch() -> None:
        if stretch:
            table = np.concatenate(stretch)
            if len(table):
                segments.append(spin_pool.sequence(table))
            stretch.clear()

    for index, (step, step_jobs) in enumerate(zip(steps, logged, strict=True)):
        if replayable(step.call):
            # the contexts these address are kept by the step's objects, which a steady
            # record's comparison shows have not changed
            jobs.append(step_jobs)
            counts_of_jobs.append(len(step_jobs))
            stretch.append(step_jobs)
            for total, before, after in zip(counts, counted[index], counted[index + 1],
                                            strict=True):
                if after != before:
                    total.update({key: value - before.get(key, 0)
                                  for key, value in after.items()})
        else:
            close_stretch()
            counts_of_jobs.append(-1)
            segments.append(partial(call_steps, (step,)))
    close_stretch()
    return _Record(steps, segments, np.concatenate(jobs) if jobs else np.zeros((0, 3), np.int64),
                   tuple(counts_of_jobs), [+total for total in counts])
