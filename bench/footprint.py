"""Benchmark: the memory one run of a plan touches, against OpenVINO's, and what the state of
the caches between runs costs a run.

A run that touches more memory than the caches keep finds more of it out of cache, the next
run too. This counts what one warm ``plan.run`` reads or writes, by the page
(`touched_memory`: Linux's page tables, no hardware counters), split into the plan's
weights (the values its products read, derived while it bound; an int8 plan's packed
weights), its own arrays (buffers, scratch, padded copies, the bf16 hand-offs between
layers) and everything else the process touched (the input, code, Python's heap, and the
arrays a plan keeps in NumPy's memory: all of a plan's below `workspace.ARENA_FROM_BYTES`,
an int8 plan's per-thread scratch). ``--openvino`` counts one call of OpenVINO's on the
same case in the peer environment (`bench/quantized_peers.py --footprint`), its whole
process. ``--between 0,8,32`` first times runs (one thread: thread time; else wall) with
that many MB of another array read between each run and the next, interleaved, so that what
a run pays for the caches its predecessor left shows as a slope. ``--models N`` does
neither: it gives the process's resident memory after each of N models of the case loaded
and run once (a server holding several), OpenVINO's after each of N compiled with
``--openvino``.

The counting process runs without transparent huge pages (a huge page is accessed or not as
one 2 MB page), so its plan is built again after the timing, which keeps them.

    .venv/bin/python bench/footprint.py --net mobilenet_v2 --precision bf16 --openvino
    .venv/bin/python bench/footprint.py --net resnet50_v2 --precision bf16 --between 0,8,16,32
    .venv/bin/python bench/footprint.py --net resnet18_v1 --precision fp32 --models 3 --openvino
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

import steps_in_order  # noqa: E402 - found through the path set just above
import touched_memory  # noqa: E402 - the same

MB = 1 << 20
PARTS = ("weights", "plan", "elsewhere")  # `attribute`'s labels


def attribute(mappings: list[tuple[int, int, int]],
              spans: dict[str, list[tuple[int, int]]]) -> dict[str, int]:
    """Bytes touched by part: a mapping holding a span of the workspace's ``"derived"`` arena
    counts as ``weights``, one holding a ``"plan"`` span as ``plan``, any other as
    ``elsewhere`` (`Workspace.arena_spans`: each span is a mapping of its own)."""
    owners = [(address, part) for key, part in (("derived", "weights"), ("plan", "plan"))
              for address, _ in spans[key]]
    totals = dict.fromkeys(PARTS, 0)
    for start, end, touched in mappings:
        part = next((part for address, part in owners if start <= address < end), "elsewhere")
        totals[part] += touched
    return totals


def between_runs(plan: Any, feed: dict[str, np.ndarray], sizes: list[int], rounds: int,
                 threads: int) -> dict[int, float]:
    """Median seconds of a run after reading each of ``sizes`` MB of another array (a byte a
    cache line), the sizes interleaved round by round."""
    clock = time.thread_time if threads == 1 else time.perf_counter
    other = np.ones(max(sizes) * MB, np.uint8)
    seconds: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(rounds):
        for size in sizes:
            other[:size * MB:64].sum()
            start = clock()
            plan.run(feed, copy_outputs=False)
            seconds[size].append(clock() - start)
    return {size: statistics.median(values) for size, values in seconds.items()}


def ours_touched(options: argparse.Namespace) -> dict[str, int]:
    """What one warm run of a plan built now touches, by part (`attribute`)."""
    plan, feed = steps_in_order.build(options)
    for _ in range(3):
        plan.run(feed, copy_outputs=False)
    mappings = touched_memory.touched_by(lambda: plan.run(feed, copy_outputs=False))
    return attribute(mappings, arena_spans(plan))


def arena_spans(plan: Any) -> dict[str, list[tuple[int, int]]]:
    """`Workspace.arena_spans` of ``plan``, an int8 plan's packed weights (`int8_memory`,
    an arena of their own) counted with its derived values."""
    from engine.kernels import int8_memory

    spans = plan.workspace.arena_spans()
    packed = plan.workspace.shared(None, int8_memory.TAG)
    if packed is not None:
        spans["derived"] += packed.spans
    return spans


def ours_resident(options: argparse.Namespace, count: int) -> list[float]:
    """The process's resident MB before, then after each of ``count`` models of the network
    loaded (each with a copy of the weights of its own, as a model read from its files has)
    and run once (its plan compiled)."""
    load, feed = steps_in_order.network(options)
    gc.collect()
    resident = [touched_memory.resident_bytes() / MB]
    models = []
    for _ in range(count):
        models.append(load(own_weights=True))
        models[-1].infer(feed)
        gc.collect()
        resident.append(touched_memory.resident_bytes() / MB)
    return resident


def openvino_answer(options: argparse.Namespace, *asked: str) -> dict[str, Any]:
    """OpenVINO's answer to `bench/quantized_peers.py --footprint` (with ``asked``) on the
    same case."""
    import executor

    with tempfile.TemporaryDirectory() as root:
        folder, runtime = steps_in_order.openvino_case(options, Path(root))
        done = subprocess.run(
            [executor.peer_python(options.peer_python),
             str(Path(__file__).with_name("quantized_peers.py")), runtime, str(folder),
             "--batch", str(options.batch), "--threads", str(options.threads), "--footprint",
             *asked], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(steps_in_order.NETWORKS), default="resnet18_v1")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="fp32")
    parser.add_argument("--between", default="",
                        help="MB read between runs, comma-separated (e.g. 0,8,32): time runs "
                             "after each")
    parser.add_argument("--rounds", type=int, default=60, help="runs per --between size")
    parser.add_argument("--models", type=int, default=0,
                        help="instead: the resident memory after each of this many models of "
                             "the case loaded and run once")
    parser.add_argument("--openvino", action="store_true",
                        help="also count one call of OpenVINO's on the same case")
    parser.add_argument("--peer-python", default=None,
                        help="the peer environment's Python (as bench/executor.py's option)")
    options = parser.parse_args()
    from threadpoolctl import threadpool_limits

    case = f"{options.net} batch {options.batch}, {options.precision}, {options.threads} thread(s)"
    if options.models:
        threadpool_limits(options.threads)
        resident = ours_resident(options, options.models)
        print(f"{case}: resident {resident[0]:.0f} MB, then after each model loaded (its own "
              f"weights) and run: " + ", ".join(f"{mb:.0f}" for mb in resident[1:]))
        if options.openvino:
            peer = openvino_answer(options, "--models", str(options.models))
            print(f"OpenVINO ({peer['precision']}): resident {peer['resident_mb'][0]:.0f} MB "
                  f"with the runtime imported, then after each model compiled and run: "
                  + ", ".join(f"{mb:.0f}" for mb in peer["resident_mb"][1:]))
        return
    if options.between:
        sizes = [int(size) for size in options.between.split(",")]
        plan, feed = steps_in_order.build(options)
        threadpool_limits(options.threads)
        medians = between_runs(plan, feed, sizes, options.rounds, options.threads)
        print(f"{case}: a run after reading " + ", ".join(
            f"{size} MB {seconds * 1e3:.3f} ms" for size, seconds in medians.items()))
        del plan, feed
    touched_memory.no_huge_pages()
    parts = ours_touched(options)
    print(f"{case}: one run touches {sum(parts.values()) / MB:.1f} MB: weights "
          f"{parts['weights'] / MB:.1f}, the plan's arrays {parts['plan'] / MB:.1f}, elsewhere "
          f"in the process {parts['elsewhere'] / MB:.1f}")
    if options.openvino:
        peer = openvino_answer(options)
        print(f"OpenVINO ({peer['precision']}): one call touches {peer['touched_mb']:.1f} MB, "
              f"its whole process")


if __name__ == "__main__":
    main()
