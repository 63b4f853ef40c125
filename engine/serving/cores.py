"""`CoreShare`: whether a served CPU batch runs on every core or leaves one to the event loop.

A served batch runs as `Model.infer` does in process, on every core (its rows split, or its
steps on the spin pool). That pays where the batch's compute outweighs the event loop's work
for its requests (a ResNet-18 image: tens of ms against about 0.2 ms), but not where the event
loop is what limits the rate: the seed MLP at concurrency 64 computes a batch of 64 rows in
well under a millisecond, and with its batches on both cores the spin pool's workers, which
spin on for milliseconds after each run, took the event loop's core: 0.60× the requests/s of
one core per batch (docs/benchmarks.md, "Serving over HTTP"). So each CPU model keeps the CPU
time its last batch took per request (wall time × cores used), and runs its next batch on every
core only when that is at least `WIDE_CPU_SECONDS_PER_REQUEST`, else on one thread, BLAS's
included (`blas_threads.one_thread`, process-wide: the server computes one CPU batch at a time),
and the spin pool's workers not kept spinning (`spin_pool.unstick`).
CPU time, not wall time, so a batch run wide does not look cheap enough to run narrow next.

A model with several instances (``instance_group``) runs that many batches at once, each on
its share of the cores: those BLAS would use, divided among the instances (at least one).
BLAS's thread count is the process's, so each such batch holds BLAS to one thread and sets
its share for its own thread (`engine.cpu.thread_share`): its rows split into at most that
many runs, its steps armed over at most that many spin-pool threads. Every CPU batch, of any
model, takes the cores it will use from one `CoreBudget` first, so batches running at once
never ask for more threads than the process has cores.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from engine.cpu import blas_threads, parallel, spin_pool, thread_share

# Five times what the event loop spends on a request (about 0.2 ms for a V2 binary tensor or
# a small JSON body on the 2-core VM): above it the compute is what limits the rate.
WIDE_CPU_SECONDS_PER_REQUEST = 0.001


class CoreBudget:
    """The process's cores, taken by CPU batches for as long as they compute: a batch waits
    until the cores it needs are free, in the order batches asked (a wide batch waiting for
    every core is not overtaken by narrow ones). ``batches``: the server's compute threads,
    CPU batches of one-instance models computed at once; one such batch uses at most
    `batch_cores`, the cores divided among them (as the server divides BLAS's threads)."""

    def __init__(self, cores: int | None = None, batches: int = 1) -> None:
        self.cores = cores or parallel.cores()
        self.batch_cores = max(1, self.cores // batches)
        self._free = self.cores
        self._waiting: deque[object] = deque()
        self._changed = threading.Condition()

    @property
    def free(self) -> int:
        """Cores no batch holds now."""
        return self._free

    @contextmanager
    def take(self, cores: int) -> Iterator[int]:
        """Hold ``cores`` cores (at most all of them) inside; yields how many."""
        cores = max(1, min(cores, self.cores))
        turn = object()
        with self._changed:
            self._waiting.append(turn)
            while self._waiting[0] is not turn or self._free < cores:
                self._changed.wait()
            self._waiting.popleft()
            self._free -= cores
            self._changed.notify_all()  # the next in line may fit in what is left
        try:
            yield cores
        finally:
            with self._changed:
                self._free += cores
                self._changed.notify_all()


class CoreShare:
    """Per CPU model: wrap each batch's compute in `batch`. ``instances``: batches of the model
    computed at once (each on its share of the cores); ``budget``: the cores all models' batches
    take from (None: a budget of this model's own)."""

    __slots__ = ("_cpu_per_request", "instances", "_budget", "_free_instances", "_lock")

    def __init__(self, instances: int = 1, budget: CoreBudget | None = None) -> None:
        if instances < 1:
            raise ValueError(f"a model has at least one instance; got {instances}")
        self._cpu_per_request: float | None = None  # None: no batch yet, run the first wide
        self.instances = instances
        self._budget = budget or CoreBudget()
        self._free_instances = list(range(instances - 1, -1, -1))  # popped from the end: 0 first
        self._lock = threading.Lock()

    def wide(self) -> bool:
        """Whether the next batch runs on every core (with several instances: on its share)."""
        cost = self._cpu_per_request
        return cost is None or cost >= WIDE_CPU_SECONDS_PER_REQUEST

    def share(self) -> int:
        """Cores one batch of this model uses when it runs wide: those BLAS uses, at most the
        cores divided among the server's compute threads, divided among the model's
        instances."""
        cores = min(blas_threads.unheld_threads(), self._budget.batch_cores)
        return max(1, cores // self.instances)

    @contextmanager
    def batch(self, requests: int) -> Iterator[None]:
        """Around one batch of ``requests`` requests: on its cores, or on one thread, as
        `wide` says; its CPU time per request is kept for the next one."""
        cores = self.share() if self.wide() else 1
        with self._budget.take(cores) as cores:
            started = time.perf_counter()
            if self.instances > 1:
                with self._instance() as instance:
                    with self._on_share(cores, instance):
                        yield
            elif cores > 1:
                yield
            else:
                with self._on_share(1, 0):
                    yield
            self._cpu_per_request = (time.perf_counter() - started) * cores / max(1, requests)

    @contextmanager
    def _instance(self) -> Iterator[int]:
        """A free instance number for one batch (at most `instances` batches run at once)."""
        with self._lock:
            instance = self._free_instances.pop()
        try:
            yield instance
        finally:
            with self._lock:
                self._free_instances.append(instance)

    @staticmethod
    @contextmanager
    def _on_share(cores: int, instance: int) -> Iterator[None]:
        """BLAS on one thread (its count is the process's), the batch's runs on ``cores``."""
        if cores == 1:
            # Workers a wide batch left spinning (`spin_pool.stick`) would take this one's
            # jobs too, and spin on between batches on the event loop's core.
            spin_pool.unstick()
        with blas_threads.one_thread(), thread_share.sharing(cores, instance):
            yield
