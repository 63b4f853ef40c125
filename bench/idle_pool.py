"""Benchmark: the spin pool after an idle pause, a long doze against the short one.

Usage: ``python bench/idle_pool.py [--net mobilenet_v2] [--precision fp32] [--rounds 8]
[--pauses 0.01,0.03,0.1,0.3,1]``.

After a run the pool's workers spin `spin_pool.GRACE_SECONDS`, doze (a poll after each sleep
of 100 µs), then park on a condition a run's arm notifies. How long they doze is a field of the
pool's live state, so a doze of 0.5 s and `spin_pool.DOZE_SECONDS` are compared in one
process, in turn, reversed every round. For each pause the report gives, per way, the median
time of the first run after the pause and of the second, and the process CPU the pause itself
cost (the workers' polls). The plan is forced armed on every core (`every_core.Forced`), so
that each run wants the workers.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

import steps_in_order  # noqa: E402 - found through the path set just above
from every_core import Forced, in_turn  # noqa: E402

from engine.cpu import spin_ir, spin_pool  # noqa: E402

# Doze seconds per way.
WAYS = {"doze 0.5 s": 0.5, f"doze {spin_pool.DOZE_SECONDS:g} s": spin_pool.DOZE_SECONDS}


def idle_way(state, doze_seconds: float):
    """A context setting the pool's doze for a way (the state is read live)."""
    @contextlib.contextmanager
    def way():
        before = int(state[spin_ir.DOZES])
        state[spin_ir.DOZES] = int(doze_seconds * 1e6 / spin_ir.DOZE_MICROSECONDS)
        try:
            yield
        finally:
            state[spin_ir.DOZES] = before

    return way


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(steps_in_order.NETWORKS), default="mobilenet_v2")
    parser.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="fp32")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--pauses", default="0.01,0.03,0.1,0.3,1",
                        help="idle pauses before a run, seconds, comma-separated")
    options = parser.parse_args()
    if spin_pool.threads() < 2:
        parser.error("one core or one BLAS thread: nothing runs on every core")
    options.threads = spin_pool.threads()
    plan, feed = steps_in_order.build(options)
    plan._spin_choice = Forced(True)
    for _ in range(5):
        plan.run(feed, copy_outputs=False)
    state = spin_pool._pool().state
    ways = {name: idle_way(state, seconds) for name, seconds in WAYS.items()}
    pauses = [float(pause) for pause in options.pauses.split(",")]
    print(f"{options.net} {options.precision} batch {options.batch}, {options.threads} threads, "
          f"{options.rounds} rounds; ms: first run after the pause, second run, the pause's "
          "process CPU")

    def measure(pause: float):
        def after_pause(way: str) -> tuple[float, float, float]:
            plan.run(feed, copy_outputs=False)  # the way's pool state in place before the pause
            cpu = time.process_time()
            time.sleep(pause)
            paused_cpu = time.process_time() - cpu
            times = []
            for _ in range(2):
                start = time.perf_counter()
                plan.run(feed, copy_outputs=False)
                times.append(time.perf_counter() - start)
            return times[0], times[1], paused_cpu
        return after_pause

    for pause in pauses:
        results = in_turn(ways, options.rounds, measure(pause))
        print(f"pause {pause:g} s")
        for name, values in results.items():
            first, second, cpu = (statistics.median(value[i] for value in values) * 1e3
                                  for i in range(3))
            print(f"  {name:24s} first {first:7.2f}  second {second:7.2f}  pause CPU {cpu:7.2f}")


if __name__ == "__main__":
    main()
