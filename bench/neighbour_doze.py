"""Benchmark: what another process's idle spin-pool workers cost this process's armed runs.

Usage: ``python bench/neighbour_doze.py [--net resnet18_v1] [--precision bf16] [--rounds 12]
[--calls 10]``.

In `bench/executor.py`'s turns each of our runtimes (fp32, bf16, int8) is a process of its own,
and each starts its turn 0.1-0.5 s after another of ours ended: while that one's workers doze.
Here a plan runs armed, back to back, beside a neighbour process whose one worker dozes for
good, in turn: the neighbour stopped (SIGSTOP: nothing of it runs), dozing as `spin_pool` has
it (polls for `spin_pool.POLL_SECONDS`, then naps on the futex), and polling throughout (each
poll after a sleep of 100 µs, as the whole doze did before). Per way: the median call, its
ratio to the stopped neighbour's in the same round (quartiles over rounds), how many times a
call's threads were preempted (Linux's involuntary context switches of every thread of this
process, per call), and the neighbour's share of a core meanwhile.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

import every_core  # noqa: E402 - found through the path set just above
import steps_in_order  # noqa: E402

from engine.cpu import spin_pool  # noqa: E402

# The neighbour's ways: its workers' polling time (the rest of the doze naps).
NEIGHBOURS = {"polls": 1e6, "naps": spin_pool.POLL_SECONDS}
FOR_GOOD = 1e6  # seconds: a doze that outlasts the measurement


def neighbour(polling: float) -> None:
    """The neighbour process: its worker started, then dozing for good (``polling`` seconds of
    it polling); says "dozing" on stdout and waits to be killed."""
    spin_pool.DOZE_SECONDS, spin_pool.POLL_SECONDS = FOR_GOOD, min(polling, FOR_GOOD)
    with spin_pool.armed(2):
        time.sleep(0.2)  # the worker started and spinning: it dozes once this run ends
    time.sleep(0.3)  # past the spinning, and the polls of a doze that naps after them
    print("dozing", flush=True)
    signal.pause()


def preemptions() -> int:
    """Involuntary context switches of every thread of this process so far (Linux)."""
    total = 0
    for thread in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{thread}/status", encoding="ascii") as status:
            total += next(int(line.split()[1]) for line in status
                          if line.startswith("nonvoluntary_ctxt_switches"))
    return total


def cpu_seconds(pid: int) -> float:
    """CPU seconds every thread of process ``pid`` has run (Linux's schedstat)."""
    total = 0
    for thread in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{thread}/schedstat", encoding="ascii") as stat:
                total += int(stat.read().split()[0])
        except OSError:  # a thread that ended meanwhile
            pass
    return total / 1e9


def start_neighbours() -> dict[str, subprocess.Popen]:
    """One stopped neighbour process per way, its worker dozing."""
    started = {}
    for name, polling in NEIGHBOURS.items():
        process = subprocess.Popen([sys.executable, __file__, "--neighbour", str(polling)],
                                   stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None
        if process.stdout.readline().strip() != "dozing":
            raise RuntimeError(f"the {name} neighbour did not start")
        os.kill(process.pid, signal.SIGSTOP)
        started[name] = process
    return started


def measure(plan, feed, neighbours: dict[str, subprocess.Popen], rounds: int, calls: int
            ) -> dict[str, dict[str, list[float]]]:
    """Per way ("stopped" and each neighbour's), per round: median call seconds, preemptions
    per call, and the neighbour's share of a core."""
    ways = ["stopped", *neighbours]
    results = {way: {"seconds": [], "preempted": [], "share": []} for way in ways}
    for round_number in range(rounds):
        for way in ways if round_number % 2 == 0 else ways[::-1]:
            awake = neighbours.get(way)
            if awake is not None:
                os.kill(awake.pid, signal.SIGCONT)
            for _ in range(3):  # the neighbour back at its doze, our workers spinning
                plan.run(feed, copy_outputs=False)
            switches, start = preemptions(), time.perf_counter()
            cpu = 0.0 if awake is None else cpu_seconds(awake.pid)
            seconds = []
            for _ in range(calls):
                began = time.perf_counter()
                plan.run(feed, copy_outputs=False)
                seconds.append(time.perf_counter() - began)
            elapsed = time.perf_counter() - start
            results[way]["seconds"].append(statistics.median(seconds))
            results[way]["preempted"].append((preemptions() - switches) / calls)
            results[way]["share"].append(
                0.0 if awake is None else (cpu_seconds(awake.pid) - cpu) / elapsed)
            if awake is not None:
                os.kill(awake.pid, signal.SIGSTOP)
    return results


def report(results: dict[str, dict[str, list[float]]]) -> None:
    stopped = results["stopped"]["seconds"]
    print(f"{'neighbour':>10} {'call ms':>8} {'÷ stopped (quartiles)':>24} "
          f"{'preempted/call':>15} {'its core share':>15}")
    for way, rows in results.items():
        ratios = every_core.quartiles([a / b for a, b in zip(rows["seconds"], stopped,
                                                             strict=True)])
        print(f"{way:>10} {statistics.median(rows['seconds']) * 1e3:8.2f} {ratios:>24} "
              f"{statistics.median(rows['preempted']):15.1f} "
              f"{statistics.median(rows['share']):15.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(steps_in_order.NETWORKS), default="resnet18_v1")
    parser.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="bf16")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--neighbour", type=float, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.neighbour is not None:
        neighbour(options.neighbour)
        return
    if not sys.platform.startswith("linux") or spin_pool.threads() < 2:
        parser.error("Linux with two cores or more: the pool's doze and /proc are measured")
    options.batch, options.threads = 1, spin_pool.threads()
    plan, feed = steps_in_order.build(options)
    plan._spin_choice = every_core.Forced(True)  # armed every run
    neighbours = start_neighbours()
    try:
        print(f"{options.net} {options.precision} batch 1 armed on {options.threads} threads, "
              f"{options.rounds} rounds of {options.calls} calls a way")
        report(measure(plan, feed, neighbours, options.rounds, options.calls))
    finally:
        stop(neighbours)


def stop(neighbours: dict[str, subprocess.Popen]) -> None:
    """The neighbour processes ended."""
    for process in neighbours.values():
        os.kill(process.pid, signal.SIGCONT)
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


if __name__ == "__main__":
    main()
