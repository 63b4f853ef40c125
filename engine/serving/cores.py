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
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from engine.cpu import blas_threads, parallel, spin_pool

# Five times what the event loop spends on a request (about 0.2 ms for a V2 binary tensor or
# a small JSON body on the 2-core VM): above it the compute is what limits the rate.
WIDE_CPU_SECONDS_PER_REQUEST = 0.001


class CoreShare:
    """Per CPU model: wrap each batch's compute in `batch`."""

    __slots__ = ("_cpu_per_request",)

    def __init__(self) -> None:
        self._cpu_per_request: float | None = None  # None: no batch yet, run the first wide

    def wide(self) -> bool:
        """Whether the next batch runs on every core."""
        cost = self._cpu_per_request
        return cost is None or cost >= WIDE_CPU_SECONDS_PER_REQUEST

    @contextmanager
    def batch(self, requests: int) -> Iterator[None]:
        """Around one batch of ``requests`` requests: on every core or on one thread, as
        `wide` says; its CPU time per request is kept for the next one."""
        wide = self.wide()
        cores = min(blas_threads.threads(), parallel.cores()) if wide else 1
        started = time.perf_counter()
        if wide:
            yield
        else:
            # Workers a wide batch left spinning (`spin_pool.stick`) would take this one's
            # jobs too, and spin on between batches on the event loop's core.
            spin_pool.unstick()
            with blas_threads.one_thread():
                yield
        self._cpu_per_request = (time.perf_counter() - started) * cores / max(1, requests)
