"""`bench/neighbour_doze.py`: a neighbour whose worker polls runs on the CPU, one whose worker
naps does not, and every way is measured every round."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from bench import neighbour_doze
from engine.cpu import spin_pool

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not spin_pool.available() or spin_pool.cores() < 2,
    reason="the pool's futex doze and /proc are Linux's, among two cores or more")


@pytest.fixture(scope="module")
def neighbours():
    started = neighbour_doze.start_neighbours()
    yield started
    neighbour_doze.stop(started)


def test_a_polling_neighbour_takes_the_cpu_and_a_napping_one_sleeps(neighbours) -> None:
    used = {}
    for name, process in neighbours.items():
        os.kill(process.pid, signal.SIGCONT)
        before = neighbour_doze.cpu_seconds(process.pid)
        time.sleep(0.5)
        used[name] = neighbour_doze.cpu_seconds(process.pid) - before
        os.kill(process.pid, signal.SIGSTOP)
    # Polls: thousands a second at a microsecond or more each; naps: one a tenth of a second.
    assert used["polls"] > 2e-3, used
    assert used["naps"] < 1e-3, used


class BusyPlan:
    """A plan stand-in: each run spins on the CPU for a millisecond."""

    runs = 0

    def run(self, feed, copy_outputs=True) -> None:
        self.runs += 1
        end = time.perf_counter() + 1e-3
        while time.perf_counter() < end:
            pass


def test_every_way_is_measured_each_round(neighbours) -> None:
    plan = BusyPlan()
    results = neighbour_doze.measure(plan, {}, neighbours, rounds=2, calls=3)
    assert list(results) == ["stopped", "polls", "naps"]
    assert plan.runs == 2 * 3 * (3 + 3)  # rounds × ways × (warm-up + timed)
    for way, rows in results.items():
        assert all(len(values) == 2 for values in rows.values()), way
        assert all(seconds >= 1e-3 for seconds in rows["seconds"]), way
        assert all(count >= 0 for count in rows["preempted"]), way
    assert results["stopped"]["share"] == [0.0, 0.0]
