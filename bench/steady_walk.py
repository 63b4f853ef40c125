"""Benchmark: a plan's runs with its steady runs replayed against every step called.

Usage: ``python bench/steady_walk.py [--threads 1] [--rounds 7] [--runs 40]
[--cases resnet18_v1:1,resnet18_v1:8,mobilenet_v2:1,resnet50_v2:1] [--precisions fp32,bf16,int8]``.

For each network, batch and precision, one plan (random He-scaled weights; int8 calibrated on
8 random images, as `bench/steps_in_order.py` does) runs ``--runs`` calls with its replay
(`engine.cpu.steady_walk`) and as many with every step called (`steady_walk.use`),
in turn for ``--rounds`` rounds; the report gives each way's median call, their ratio, and the
steps the replay calls natively. Outputs are checked equal byte for byte first, on three
inputs in turn. One thread by default: BLAS's pools through threadpoolctl and the engine's own
setting (`parallel.set_threads`); ``--threads 0`` leaves every core.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nets  # noqa: E402 - found through the path set just above

import engine  # noqa: E402
from engine.cpu import parallel, steady_walk  # noqa: E402

SHAPE = (3, 224, 224)


def build(net: str, batch: int, precision: str) -> tuple[Any, list[dict[str, np.ndarray]]]:
    """A warm plan of ``net`` and three inputs."""
    symbol = getattr(nets, net)()
    rng = np.random.default_rng(36)
    extra = {"calibration": {"data": rng.standard_normal((8, *SHAPE), dtype=np.float32)}} \
        if precision == "int8" else {}
    model = engine.load_model(symbol, nets.random_params(symbol, (batch, *SHAPE)),
                              precision=precision, **extra)
    feeds = [{"data": rng.standard_normal((batch, *SHAPE), dtype=np.float32)}
             for _ in range(3)]
    model.infer(feeds[0])
    return model.plan_for(feeds[0]), feeds


def check(plan: Any, feeds: list[dict[str, np.ndarray]]) -> None:
    """Replayed runs give the bytes of runs calling every step."""
    steady_walk.use(False)
    wanted = [plan.run(feed) for feed in feeds]
    steady_walk.use(True)
    for run in range(12):
        for mine, theirs in zip(plan.run(feeds[run % 3]), wanted[run % 3], strict=True):
            if not np.array_equal(mine, theirs):
                raise SystemExit(f"a replayed run differs at run {run}")


def timed(plan: Any, feed: dict[str, np.ndarray], runs: int) -> list[float]:
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        plan.run(feed, copy_outputs=False)
        seconds.append(time.perf_counter() - start)
    return seconds


def native_steps(plan: Any) -> str:
    """Steps the plan's steady records replay natively, of all its steps."""
    steady = [record for record in plan._steady._records.values() if record.steady]
    if not steady:
        return f"0/{len(plan.steps)}"
    replayed = max(sum(count >= 0 for count in record.counts_of_jobs) for record in steady)
    return f"{replayed}/{len(plan.steps)}"


def main() -> None:
    from threadpoolctl import threadpool_limits

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--cases", default="resnet18_v1:1,resnet18_v1:8,mobilenet_v2:1,"
                                           "resnet50_v2:1")
    parser.add_argument("--precisions", default="fp32,bf16,int8")
    options = parser.parse_args()
    if options.threads:
        parallel.set_threads(options.threads)
        threadpool_limits(options.threads)
    print(f"{'case':22} {'precision':9} {'every step':>11} {'replayed':>9} {'ratio':>6}  "
          f"native steps   (ms per call, median of {options.rounds} rounds of "
          f"{options.runs} calls; threads {options.threads or 'all'}; "
          f"check every {steady_walk.CHECK_EVERY})")
    for case in options.cases.split(","):
        net, batch = case.split(":")
        for precision in options.precisions.split(","):
            plan, feeds = build(net, int(batch), precision)
            if options.threads:
                threadpool_limits(options.threads)  # loading may bring in another BLAS
            check(plan, feeds)
            ways: dict[str, list[float]] = {"every step": [], "replayed": []}
            for _ in range(options.rounds):
                steady_walk.use(False)
                ways["every step"].append(statistics.median(timed(plan, feeds[0],
                                                                  options.runs)))
                steady_walk.use(True)
                ways["replayed"].append(statistics.median(timed(plan, feeds[0],
                                                                options.runs)))
            called, replayed = (statistics.median(ways[way]) * 1e3 for way in ways)
            print(f"{net + ' b' + batch:22} {precision:9} {called:11.3f} {replayed:9.3f} "
                  f"{replayed / called:6.3f}  {native_steps(plan)}", flush=True)


if __name__ == "__main__":
    main()
