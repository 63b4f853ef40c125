"""Benchmark: this checkout's engine against another checkout's on one network, each in a
process of its own, in turns.

Usage: ``python bench/checkouts.py --other PATH [--net resnet18_v1] [--batch 1]
[--precision bf16] [--threads 1] [--turns 4] [--calls 25]``.

``--other`` is another checkout of the project (``git worktree add ../before HEAD~1``, say).
The network (`bench/executor.py`'s case: random weights, a seeded input) is written once;
then each turn starts a fresh process for this checkout and one for the other, one after the
other (which goes first alternates), and each loads the network with its own engine
(``engine.load_model``, as `bench/executor.py`'s ours does), answers it a few times, and
times ``calls`` calls of ``Model.infer``. On one thread a call is timed by the thread's CPU
time, which leaves out the time other jobs on a shared machine held the core; on every core
(``--threads 0``) by the wall clock. It checks first that both answer the same input alike
(bit for bit, or it says by how much they differ).

Why processes in turns: on a shared VM a process's speed drifts by 10–30% over minutes,
with other tenants' use of the caches and memory, more than a change of a few percent. Two
plans in one process share one engine, and runs of a script minutes apart see different
hosts; turns of fresh processes a few seconds apart see the same host, and each turn's pair
is compared on its own. The report gives each turn's medians and bests, and the turns'
ratios of this checkout's to the other's: their median and range (the bests' are the
steadiest on a busy host).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
WARM_CALLS = 3  # answered before the timed calls: plans bound, steady runs recorded


def prepare(net: str, batch: int, root: Path) -> Path:
    """The network's folder under ``root`` as `bench/executor.py` writes it (its symbol,
    seeded weights and calibration inputs), with the input of ``batch`` images."""
    sys.path[:0] = [str(ROOT), str(HERE.parent)]
    import executor

    folder = executor.prepare_network(net, root, 0)
    executor.write_case_input(folder, batch)
    return folder


def worker(root: Path, folder: Path, batch: int, precision: str, threads: int,
           calls: int) -> None:
    """In a fresh process: the network loaded by ``root``'s engine (int8 calibrated on the
    folder's calibration inputs), its answer saved, then ``calls`` timed calls; prints their
    milliseconds as JSON. It loads the model as `bench/executor.py`'s ``ours_runner`` does,
    not through it: that module puts its own checkout's engine first on the path."""
    sys.path.insert(0, str(root))
    import numpy as np

    import engine
    from engine import sym

    if threads:
        from threadpoolctl import threadpool_limits

        from engine.cpu import parallel

        parallel.set_threads(threads)  # before binding: plans cut their jobs for these
        threadpool_limits(threads, user_api="blas")
    with np.load(folder / "params.npz") as stored:
        params = dict(stored)
    calibration = {"calibration": {"data": np.load(folder / "calibration.npy")}} \
        if precision == "int8" else {}
    model = engine.load_model(sym.load(folder / "model-symbol.json"), params, optimize=True,
                              precision=precision, **calibration)
    feed = {"data": np.load(folder / f"data-b{batch}.npy")}
    answer = next(iter(model.infer(feed).values()))
    np.save(folder / f"answer-{os.getpid()}.npy", answer)
    for _ in range(WARM_CALLS):
        model.infer(feed)
    clock = time.thread_time if threads == 1 else time.perf_counter
    times = []
    for _ in range(calls):
        started = clock()
        model.infer(feed)
        times.append((clock() - started) * 1e3)
    print(json.dumps({"times": times, "answer": f"answer-{os.getpid()}.npy",
                      "engine": str(Path(engine.__file__).parent)}))


def turn(root: Path, folder: Path, options: argparse.Namespace) -> dict[str, Any]:
    """One process of ``root``'s engine: its times and where its answer lies."""
    command = [options.python, str(HERE), "--worker", str(root), "--folder", str(folder),
               "--batch", str(options.batch), "--precision", options.precision,
               "--threads", str(options.threads), "--calls", str(options.calls)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{root}: the worker failed:\n{done.stderr[-2000:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if Path(got["engine"]).resolve() != root / "engine":
        # an installed engine found before the checkout's would time one engine twice
        raise SystemExit(f"{root}: the worker imported the engine from {got['engine']}")
    return got


def compare(options: argparse.Namespace) -> None:
    import numpy as np

    other = Path(options.other).resolve()
    if not (other / "engine" / "__init__.py").exists():
        raise SystemExit(f"--other {other}: not a checkout of this project (no engine/)")
    sides = {"this": ROOT, "other": other}
    with tempfile.TemporaryDirectory() as temporary:
        folder = prepare(options.net, options.batch, Path(temporary))
        clock = "CPU" if options.threads == 1 else "wall-clock"
        print(f"{options.net} batch {options.batch}, {options.precision}, threads "
              f"{options.threads or 'every core'}; {options.calls} calls a process, "
              f"{clock} ms, median [best]; this: {ROOT}, other: {other}")
        results: dict[str, list[list[float]]] = {side: [] for side in sides}
        for index in range(options.turns):
            order = list(sides) if index % 2 == 0 else list(sides)[::-1]
            got = {side: turn(sides[side], folder, options) for side in order}
            if index == 0:
                answers = [np.load(folder / got[side]["answer"]) for side in sides]
                difference = float(np.abs(answers[0] - answers[1]).max())
                print("answers: the same bits" if np.array_equal(*answers) else
                      f"answers differ: largest difference {difference:.3g} "
                      f"(of {float(np.abs(answers[1]).max()):.3g})")
            row = []
            for side in sides:
                times = got[side]["times"]
                results[side].append(times)
                row.append(f"{side} {statistics.median(times):.3f} [{min(times):.3f}]")
            print(f"  turn {index + 1} ({order[0]} first): " + ", ".join(row))
        print("this ÷ other, " + "; ".join(
            f"{name}: {statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f})"
            for name, ratios in turn_ratios(results).items()))


def turn_ratios(results: dict[str, list[list[float]]]) -> dict[str, list[float]]:
    """Each turn's ratio of this checkout's median, and of its best, to the other's: pairs of
    processes a few seconds apart, which saw the same host."""
    return {name: [statistic(this) / statistic(other)
                   for this, other in zip(results["this"], results["other"], strict=True)]
            for name, statistic in (("medians", statistics.median), ("bests", min))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other", help="another checkout of the project")
    parser.add_argument("--net", choices=("resnet18_v1", "resnet50_v2", "mobilenetv2_1.0"),
                        default="resnet18_v1")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="bf16")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads each process runs on (0: every core, each default)")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--calls", type=int, default=25, help="timed calls a process")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter both processes run (its packages, not its "
                             "engine: each process imports its checkout's)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        worker(Path(options.worker), Path(options.folder), options.batch, options.precision,
               options.threads, options.calls)
        return
    if not options.other:
        parser.error("--other is required: the checkout to compare this one with")
    compare(options)


if __name__ == "__main__":
    main()
