"""CoreShare: a served CPU batch on every core only where its compute outweighs the event
loop's, on its share of them with several instances; CoreBudget: never more than the cores."""

from __future__ import annotations

import threading
import time

import pytest

from engine.cpu import blas_threads, parallel, spin_pool, thread_share
from engine.cpu.spin_ir import PATIENCE, STICKY
from engine.runtime import batch_split
from engine.serving.cores import WIDE_CPU_SECONDS_PER_REQUEST, CoreBudget, CoreShare


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
        state = spin_pool._pool().state
        patience = int(state[PATIENCE])
        # A worker out of patience (2 ms without a part) lets the sticky flag lapse itself;
        # on a busy machine that much can pass between two lines here, so while the test
        # looks the workers wait far longer.
        state[PATIENCE] = patience * 100_000
        try:
            spin_pool.stick(2)
            assert state[STICKY]
            with share.batch(1):
                assert not spin_pool.spinning() and not state[STICKY]
        finally:
            state[PATIENCE] = patience
        # One request costing twice the threshold on one core: the compute dominates.
        assert blas_threads_inside(share, 1, seconds=2 * WIDE_CPU_SECONDS_PER_REQUEST) == 1
        assert blas.count() == 2  # given back after the batch
        assert share.wide()
        # 0.6 of the threshold's wall time on 2 cores is 1.2 of its CPU time: still wide.
        assert blas_threads_inside(share, 1, seconds=0.6 * WIDE_CPU_SECONDS_PER_REQUEST) == 2
        assert share.wide()
    finally:
        blas.set(saved)


def test_a_batch_of_several_instances_runs_on_its_share_of_the_cores() -> None:
    """Two instances over four cores: each batch holds BLAS to one thread (its count is the
    process's) and spreads its own runs over two: rows split into at most two runs, at most
    two spin-pool threads armed; as instance 0, then 1 while 0 is busy. Outside, nothing."""
    blas = blas_threads.numpy_openblas()
    if blas is None:
        pytest.skip("needs numpy's OpenBLAS, whose thread count the share divides")
    saved = blas.count()
    blas.set(4)
    try:
        share = CoreShare(2, CoreBudget(4))
        assert share.share() == 2
        with share.batch(1):
            assert blas_threads.threads() == 1
            assert thread_share.cores() == 2 and thread_share.instance() == 0
            assert batch_split.threads() == 2
            if spin_pool.available():
                assert spin_pool.threads() == min(2, spin_pool.cores())
            assert not batch_split.fixed(8)  # the share, not a setting, decides the runs
            inside: dict[str, int | None] = {}

            def other_batch() -> None:
                with share.batch(1):
                    inside.update(cores=thread_share.cores(), instance=thread_share.instance())

            worker = threading.Thread(target=other_batch)
            worker.start()
            worker.join(30)
            assert inside == {"cores": 2, "instance": 1}
        assert blas.count() == 4 and thread_share.cores() is None
        assert batch_split.threads() == 4
        # Eight instances on four cores: one core each, never less.
        assert CoreShare(8, CoreBudget(4)).share() == 1
    finally:
        blas.set(saved)


def test_the_budget_holds_batches_to_the_cores_in_the_order_they_asked() -> None:
    budget = CoreBudget(2)
    order: list[str] = []
    started = {name: threading.Event() for name in ("wide", "narrow")}

    def take(name: str, cores: int) -> None:
        started[name].set()
        with budget.take(cores):
            order.append(name)

    with budget.take(1):
        assert budget.free == 1
        wide = threading.Thread(target=take, args=("wide", 2))
        wide.start()
        assert started["wide"].wait(30)
        # The wide batch waits for both cores; a narrow one asking later waits behind it
        # though one core is free.
        deadline = time.monotonic() + 30
        while not budget._waiting and time.monotonic() < deadline:
            time.sleep(0.01)
        narrow = threading.Thread(target=take, args=("narrow", 1))
        narrow.start()
        assert started["narrow"].wait(30)
        while len(budget._waiting) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert order == [] and len(budget._waiting) == 2
    wide.join(30)
    narrow.join(30)
    assert order == ["wide", "narrow"] and budget.free == 2
    with budget.take(5) as cores:  # more than there are: all of them
        assert cores == 2 and budget.free == 0


def test_instances_and_budgets_are_checked() -> None:
    with pytest.raises(ValueError, match="at least one instance"):
        CoreShare(0)
    with pytest.raises(ValueError, match="at least one core"):
        with thread_share.sharing(0):
            pass


def test_with_two_compute_threads_a_batch_takes_half_the_cores() -> None:
    """As the server divides BLAS's threads among its compute threads, whatever BLAS says
    here: two one-instance batches fit the budget at once."""
    budget = CoreBudget(4, batches=2)
    assert budget.batch_cores == 2
    blas = blas_threads.numpy_openblas()
    if blas is None:
        pytest.skip("needs numpy's OpenBLAS, whose thread count the share reads")
    saved = blas.count()
    blas.set(4)
    try:
        assert CoreShare(1, budget).share() == 2 and CoreShare(2, budget).share() == 1
    finally:
        blas.set(saved)
