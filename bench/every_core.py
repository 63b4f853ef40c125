"""Benchmark: a plan on every core against one thread, per node, in one process.

Usage: ``python bench/every_core.py [--net resnet18_v1] [--precision fp32|bf16|int8]
[--batch 1] [--rounds 30] [--naps | --meetings]``.

One plan, its runs made in turn on every core (armed, or for a plan whose steps leave BLAS
alone, its workers stuck spinning: as `plan.run` makes them with BLAS at every core) and on one
thread (BLAS held to one thread, nothing armed or stuck), round after round, so that a busy
machine's load falls on both alike. Each round walks the plan's steps (`Plan.walk`) and times
a whole ``plan.run`` each way; the report gives the whole run's medians, the quartiles of the
per-round ratio (how noisy the machine was), and per node, in order, the median time each way
and their ratio: the layers that scale worse than the rest.

``--naps`` instead times whole runs on every core with the spin pool's naps (`spin_ir`) and with
them turned off (its workers and callers spinning however long they wait), and on one thread,
in turn, with each way's process CPU time.

``--meetings`` instead counts the jobs of several parts a run forced armed posts to the spin
pool (each one a meeting of the cores: posted, its parts claimed, waited for) and times each,
per node and in all: a count that holds however busy the machine is, where the times do not.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

import steps_in_order  # noqa: E402 - found through the path set just above

from engine.cpu import spin_pool  # noqa: E402


class Forced:
    """A `spin_pool.Choice` stand-in that always answers one way and keeps no samples."""

    def __init__(self, armed: bool) -> None:
        self.way = armed

    def armed(self) -> bool:
        return self.way

    def record(self, armed: bool, seconds: float) -> None:
        pass


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """BLAS at one thread (so nothing is armed or stuck), the workers' sticky flag cleared."""
    from threadpoolctl import threadpool_limits

    spin_pool.unstick()
    with threadpool_limits(1):
        yield


def in_turn(ways: dict[str, Callable[[], Any]], rounds: int,
            measure: Callable[[str], Any]) -> dict[str, list[Any]]:
    """``measure(way)`` under each way's context, the ways in turn, reversed every round."""
    names = list(ways)
    results: dict[str, list[Any]] = {name: [] for name in names}
    for round_number in range(rounds):
        for name in names if round_number % 2 == 0 else names[::-1]:
            with ways[name]():
                results[name].append(measure(name))
    return results


def quartiles(ratios: list[float]) -> str:
    ordered = sorted(ratios)
    return " ".join(f"{ordered[len(ordered) * q // 4]:.3f}" for q in (1, 2, 3))


def per_node(plan: Any, feed: dict[str, np.ndarray], rounds: int) -> None:
    plan._spin_choice = Forced(True)
    ways = {"every core": contextlib.nullcontext, "one thread": one_thread}

    def measure(way: str) -> tuple[list[float], float]:
        walk = plan.walk(feed)
        start = time.perf_counter()
        plan.run(feed, copy_outputs=False)
        return walk, time.perf_counter() - start

    in_turn(ways, 3, measure)  # warm-up: jobs made, caches filled, each way
    results = in_turn(ways, rounds, measure)
    wide, one = ([whole for _, whole in results[name]] for name in ways)
    print(f"whole run: every core {statistics.median(wide) * 1e3:.2f} ms, one thread "
          f"{statistics.median(one) * 1e3:.2f} ms, ratio "
          f"{statistics.median(wide) / statistics.median(one):.3f} (per-round quartiles "
          f"{quartiles([a / b for a, b in zip(wide, one, strict=True)])})")
    nodes: dict[int, list[int]] = defaultdict(list)
    for index, step in enumerate(plan.steps):
        nodes[id(step.node)].append(index)
    print("node, op: every core, one thread (ms), ratio; step kinds")
    for indices in nodes.values():
        node = plan.steps[indices[0]].node
        times = [statistics.median(sum(walk[i] for i in indices) for walk, _ in results[name])
                 for name in ways]
        if times[1] < 20e-6:
            continue
        kinds: dict[str, int] = defaultdict(int)
        for index in indices:
            kinds[steps_in_order.call_kind(plan.steps[index].call)] += 1
        listed = ", ".join(f"{kind} {count}" for kind, count in kinds.items())
        print(f"  {node.name:28s} {node.op:18s} {times[0] * 1e3:7.3f} {times[1] * 1e3:7.3f} "
              f"{times[0] / times[1]:5.2f}  {listed}")


def naps(plan: Any, feed: dict[str, np.ndarray], rounds: int) -> None:
    from engine.cpu.spin_ir import NAP_POLLS

    plan._spin_choice = Forced(True)
    state = spin_pool._pool().state
    napping = int(state[NAP_POLLS])

    @contextlib.contextmanager
    def nap_polls(polls: int) -> Iterator[None]:
        state[NAP_POLLS] = polls
        try:
            yield
        finally:
            state[NAP_POLLS] = napping

    ways = {"every core, naps": lambda: nap_polls(napping),
            "every core, spinning": lambda: nap_polls(1 << 62), "one thread": one_thread}

    def measure(way: str) -> tuple[float, float]:
        walls, cpus = [], []
        for _ in range(4):  # the first after a switch left out
            wall, cpu = time.perf_counter(), time.process_time()
            plan.run(feed, copy_outputs=False)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        return statistics.median(walls[1:]), statistics.median(cpus[1:])

    in_turn(ways, 2, measure)
    results = in_turn(ways, rounds, measure)
    spinning = [wall for wall, _ in results["every core, spinning"]]
    for name, values in results.items():
        walls = [wall for wall, _ in values]
        print(f"{name:22s} {statistics.median(walls) * 1e3:7.2f} ms, process CPU "
              f"{statistics.median(cpu for _, cpu in values) * 1e3:7.2f} ms; ÷ spinning "
              f"{statistics.median(walls) / statistics.median(spinning):.3f} (per-round "
              f"quartiles {quartiles([a / b for a, b in zip(walls, spinning, strict=True)])})")


class Posted:
    """The pool's ``run`` wrapped: each job of several parts posted through it is timed and
    put down under the step running it (``step``, set by `meetings`' walk)."""

    def __init__(self, run: Callable[..., Any]) -> None:
        self.run = run
        self.step = -1
        self.jobs: list[tuple[int, float]] = []

    def __call__(self, state: int, task: int, context: int, parts: int) -> None:
        if parts < 2:
            self.run(state, task, context, parts)
            return
        start = time.perf_counter()
        self.run(state, task, context, parts)
        self.jobs.append((self.step, time.perf_counter() - start))


def meetings(plan: Any, feed: dict[str, np.ndarray], rounds: int, posted: Posted) -> None:
    """Jobs of several parts per run forced armed, per node and in all, with their times."""
    plan._spin_choice = Forced(True)
    steps = plan.steps

    def walk_steps() -> None:
        for index, step in enumerate(steps):
            posted.step = index
            step.call()

    runs = []
    for round_number in range(rounds + 2):
        posted.jobs = []
        plan._run_on_cpu(walk_steps, record=False)
        if round_number >= 2:  # the first runs make jobs bound at first use
            runs.append(posted.jobs)
    counts = [len(jobs) for jobs in runs]
    lengths = sorted(seconds for jobs in runs for _, seconds in jobs)
    print(f"jobs of several parts a run: {statistics.median(counts)} (runs: {min(counts)}–"
          f"{max(counts)}); each one's µs: quartiles "
          f"{quartiles([seconds * 1e6 for seconds in lengths])}, "
          f"{sum(seconds < 100e-6 for seconds in lengths) / len(runs):.1f} a run under 100")
    by_node: dict[int, list[int]] = defaultdict(list)
    for index, step in enumerate(steps):
        by_node[id(step.node)].append(index)
    print("node, op: jobs a run, median µs each; step kinds")
    for indices in by_node.values():
        node = steps[indices[0]].node
        mine = [[seconds for step, seconds in jobs if step in indices] for jobs in runs]
        count = statistics.median(len(jobs) for jobs in mine)
        each = [seconds for jobs in mine for seconds in jobs]
        kinds = ", ".join(steps_in_order.call_kind(steps[index].call) for index in indices)
        median = f"{statistics.median(each) * 1e6:7.1f}" if each else "      -"
        print(f"  {node.name:28s} {node.op:18s} {count:4.1f} {median}  {kinds}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(steps_in_order.NETWORKS), default="resnet18_v1")
    parser.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="fp32")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=30)
    ways = parser.add_mutually_exclusive_group()
    ways.add_argument("--naps", action="store_true",
                      help="whole runs with the spin pool's naps, without, and on one thread")
    ways.add_argument("--meetings", action="store_true",
                      help="jobs of several parts a run armed posts, per node, and their times")
    options = parser.parse_args()
    if spin_pool.threads() < 2:
        parser.error("one core or one BLAS thread: nothing runs on every core")
    options.threads = spin_pool.threads()
    posted = None
    if options.meetings:  # before the plan binds: its jobs keep the pool's ``run`` they find
        pool = spin_pool._pool()
        pool.run = posted = Posted(pool.run)
    plan, feed = steps_in_order.build(options)  # BLAS at options.threads: every core
    print(f"{options.net} {options.precision} batch {options.batch}, {spin_pool.threads()} "
          f"threads, "
          f"{len(plan.steps)} steps, {options.rounds} rounds")
    if posted is not None:
        meetings(plan, feed, options.rounds, posted)
    else:
        (naps if options.naps else per_node)(plan, feed, options.rounds)


if __name__ == "__main__":
    main()
