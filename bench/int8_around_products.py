"""Benchmark: the time of an int8 plan's run spent around its products, one thread, the
thread's CPU time.

Usage: ``python bench/int8_around_products.py [--net resnet18_v1] [--batch 1] [--runs 60]
[--part input|python|both]``.

``input``: the plan's input made ready and quantized, each after a whole run (so the caches
hold what a run leaves): copied into the plan's buffer and quantized from there, against the
quantize pointed at the caller's array (`Plan._fill_inputs`), in turn. ``python``: each fused
convolution step's time in the plan's walk less its native jobs' own (each job timed inside
the step, the timer's own cost taken off), summed over the steps: the Python a steady step
runs with its code and objects evicted by the layers before it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

import steps_in_order  # noqa: E402 - found through the path set just above

from engine.cpu import parallel  # noqa: E402
from engine.runtime.buffers import fill_rows  # noqa: E402

CLOCK = time.thread_time_ns


def fused_layer(call: Any) -> Any:
    """The `fused._FusedInt8Conv` a bound convolution step's call closes over, or None."""
    names = getattr(getattr(call, "__code__", None), "co_freevars", ())
    cells = getattr(call, "__closure__", None) or ()
    return dict(zip(names, (cell.cell_contents for cell in cells))).get("fused")


def time_input(plan: Any, feed: dict, runs: int) -> None:
    """The input copied in and quantized, against the quantize reading the caller's array."""
    (name, buffer, pointers), = plan._input_buffers
    if not pointers:
        print("input: the plan copies its input (no reader reads it in place)")
        return
    quantize = plan.steps[0].call

    def copied() -> None:
        fill_rows(buffer, feed[name])
        quantize()

    def in_place() -> None:
        for point in pointers:
            point(feed[name].ctypes.data)
        quantize()
        for point in pointers:
            point(buffer.ctypes.data)

    ways = {"copied, then quantized": copied, "quantized in place": in_place}
    times: dict[str, list[int]] = {label: [] for label in ways}
    for run in range(runs):
        for label in (list(ways) if run % 2 == 0 else list(ways)[::-1]):
            plan.run(feed, copy_outputs=False)
            start = CLOCK()
            ways[label]()
            times[label].append(CLOCK() - start)
    for label, values in times.items():
        print(f"input {label}: median {statistics.median(values) / 1e3:.1f} µs, best "
              f"{min(values) / 1e3:.1f}")


def time_python(plan: Any, runs: int) -> None:
    """Each steady fused step's time less its jobs' own, summed over the steps of a walk."""
    inside = [0]

    def timed(job: Any) -> Any:
        def run() -> None:
            start = CLOCK()
            job()
            inside[0] += CLOCK() - start
        return run

    steps = []
    for step in plan.steps:
        layer = fused_layer(step.call)
        jobs = 0
        if layer is not None and layer._steady is not None:
            steady = list(layer._steady)
            steady[1] = tuple(timed(job) for job in steady[1])
            layer._steady, jobs = tuple(steady), len(steady[1])
        steps.append((step.call, jobs))
    empty = timed(lambda: None)  # the timer's own cost inside a step, warm
    costs = []
    for _ in range(2000):
        inside[0] = 0
        start = CLOCK()
        empty()
        costs.append(CLOCK() - start - inside[0])
    timer = statistics.median(costs)
    per_step: list[list[float]] = [[] for _ in steps]

    def walk() -> None:
        for index, (call, jobs) in enumerate(steps):
            if not jobs:
                call()
                continue
            inside[0] = 0
            start = CLOCK()
            call()
            per_step[index].append(CLOCK() - start - inside[0] - jobs * timer)

    for _ in range(runs):
        plan._run_on_cpu(walk)
    medians = [statistics.median(values) / 1e3 for values in per_step if values]
    bests = [min(values) / 1e3 for values in per_step if values]
    print(f"python: {len(medians)} fused steps, each step's median {min(medians):.1f}–"
          f"{max(medians):.1f} µs (median {statistics.median(medians):.1f}); summed "
          f"medians {sum(medians):.0f} µs a run, summed bests {sum(bests):.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(steps_in_order.NETWORKS),
                        default="resnet18_v1")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--part", choices=("input", "python", "both"), default="both")
    options = parser.parse_args()
    from threadpoolctl import threadpool_limits

    parallel.set_threads(1)
    threadpool_limits(1)
    plan, feed = steps_in_order.build(argparse.Namespace(
        net=options.net, batch=options.batch, precision="int8", threads=1))
    if options.part in ("input", "both"):
        time_input(plan, feed, options.runs)
    if options.part in ("python", "both"):
        time_python(plan, options.runs)


if __name__ == "__main__":
    main()
