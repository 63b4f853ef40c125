"""CoreShare: a served CPU batch on every core only where its compute outweighs the event loop's."""

from __future__ import annotations

import time

import pytest

from engine.cpu import blas_threads, parallel, spin_pool
from engine.cpu.spin_ir import STICKY
from engine.serving.cores import WIDE_CPU_SECONDS_PER_REQUEST, CoreShare


def blas_threads_inside(share: CoreShare, requests: int, seconds: float = 0.0) -> int:
    """BLAS's thread count inside a batch of ``requests`` that computes for ``seconds``."""
    with share.batch(requests):
        count = blas_threads.threads()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            pass
    return count


@pytest.mark.skipif(blas_threads.numpy_openblas() is None or parallel.cores() < 2
                    or not spin_pool.available(),
                    reason="needs numpy's OpenBLAS, two cores and the spin pool")
def test_cheap_batches_run_on_one_core_and_costly_ones_on_every_core() -> None:
    blas = blas_threads.numpy_openblas()
    saved = blas.count()
    blas.set(2)
    try:
        share = CoreShare()
        assert share.wide()  # nothing measured yet: the first batch runs wide
        # 1,000 requests computed in microseconds (a stall of a second would still leave it
        # cheap): the event loop's work dominates.
        assert blas_threads_inside(share, 1000) == 2
        assert not share.wide()
        # Workers a wide batch left spinning take no part of a narrow batch's jobs.
        spin_pool.available()  # compiled now, not inside the batch below
        spin_pool.stick(2)
        assert spin_pool._pool().state[STICKY]
        with share.batch(1):
            assert not spin_pool.spinning() and not spin_pool._pool().state[STICKY]
        # One request costing twice the threshold on one core: the compute dominates.
        assert blas_threads_inside(share, 1, seconds=2 * WIDE_CPU_SECONDS_PER_REQUEST) == 1
        assert blas.count() == 2  # given back after the batch
        assert share.wide()
        # 0.6 of the threshold's wall time on 2 cores is 1.2 of its CPU time: still wide.
        assert blas_threads_inside(share, 1, seconds=0.6 * WIDE_CPU_SECONDS_PER_REQUEST) == 2
        assert share.wide()
    finally:
        blas.set(saved)
