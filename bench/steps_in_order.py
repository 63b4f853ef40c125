"""Benchmark: a plan's steps timed one by one in the order a run takes them, per node.

Usage: ``python bench/steps_in_order.py [--net resnet18_v1] [--batch 1] [--runs 30]
[--threads 1] [--top 12] [--in-order] [--precision fp32|bf16|int8] [--node NAME]
[--clock wall|thread] [--winograd-min-tiles N] [--f4-min-tiles N] [--bf16-grid-max-steps N]
[--pixels-min-depth N] [--pointwise-min-depth N] [--plans N] [--warm N]
[--again] [--openvino]
[--peer-python PYTHON] [--statistic median|best]``.

Every run walks ``plan.steps`` once in order, each step timed inside a run made as
``plan.run`` makes it (`Plan.walk`: denormals flushed, over the cores `plan.run` would use), so
a step finds the caches as the step before left them: ResNet-18's 512-channel 3×3 layers took
about 2.7× as long in order as called three times in a row, their weights then in cache. The
report gives per node the median over runs of its steps' summed time, its step count and kinds
of call, the nodes slowest first (``--in-order``: in the order a run reaches them, to read
beside OpenVINO's layers), and the median of whole ``plan.run`` calls (steady runs,
replayed: `engine.cpu.steady_walk`, after the two a walk makes record) taken in turn with
the walks (`bench/executor.py`'s step kinds sum the same walks by kind). ``--node`` lists a
node's steps one by one; ``--winograd-min-tiles`` and ``--f4-min-tiles`` bind a second plan
with `winograd_bind`'s thresholds changed, ``--bf16-grid-max-steps`` with `conv_amx`'s
limit on the direct products handing their readers bf16 on the AVX-512 BF16 tile,
``--pixels-min-depth`` with the K from which that tile's direct products run pixel tiles,
``--pointwise-min-depth`` with the channels from which a 1×1 layer at 7² runs on them, and
time the two in turn; ``--plans N`` binds N
identical plans (a model each) and times them in turn, where one plan differing from another
shows where their memory lies mattering. ``--warm N`` (one thread) adds each node's best of N
calls of its steps in a row, its weights and data then in cache. ``--again`` walks each run
calling every step twice, the second call right after the first, and gives each node's second
call beside its first: what a step pays for the state the steps before it left (its data,
weights and code out of cache), all else as in the walk. A step whose work depends on what
ran before it may take another path the second time: less work (a pairing a hand-off already
did) or more (a hand-off the first call consumed, ResNet-50 v2's int8 residual products then
on the NumPy path). ``--openvino`` then prints
OpenVINO's own time per layer, in its order, for the same network, batch, thread count and
precision (int8 through NNCF, as `bench/executor.py` quantises it), from the peer environment
(`bench/quantized_peers.py --layer-turns`), its calls timed in turns with our runs, `TURN`
of each at a time. ``--clock thread`` reads
the calling thread's CPU time in place of the wall clock (one thread only), which other
processes on a busy machine leave out; ``--statistic best`` gives each node's best run in
place of its median. One thread by default. ``--threads`` sets BLAS's pools through
threadpoolctl, the count a plan's jobs are cut for and run on, as `bench/executor.py` and the
server set it; the engine's slabs over Python threads (`parallel.set_threads`) stay off, as
they are there.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# This checkout's engine and the sibling modules (as bench/executor.py does).
sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

import nets  # noqa: E402 - found through the path set just above
import quantized_peers  # noqa: E402 - the same

import engine  # noqa: E402

NETWORKS = {"resnet18_v1": (nets.resnet18_v1, (3, 224, 224)),
            "resnet50_v2": (nets.resnet50_v2, (3, 224, 224)),
            "mobilenet_v2": (nets.mobilenet_v2, (3, 224, 224))}


def call_kind(call: Any) -> str:
    """A short name for a bound call: its class, or a partial's function."""
    function = getattr(call, "func", None)
    name = type(call).__name__
    if name == "partial" and function is not None:
        return getattr(function, "__name__", type(function).__name__)
    return name


# What a step's seconds are read from: the wall clock, or the calling thread's CPU time, which
# a busy machine's other processes leave out (one thread only: a product's parts on other
# threads are not counted).
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
# What a node's row gives of its runs: the median, or the best (on a busy machine the best of
# the thread's CPU time is the steadiest figure of a node's own work).
STATISTICS = {"median": statistics.median, "best": min}
TURN = 5  # our runs, then as many of OpenVINO's calls, in turn (``--openvino``)


def network(options: argparse.Namespace
            ) -> tuple[Callable[..., Any], dict[str, np.ndarray]]:
    """A loader of the network as ``options`` name it and its feed: each call a model of its
    own, on the same random weights (``own_weights=True``: a copy of them of its own, as a
    model loaded from its files has)."""
    build_network, shape = NETWORKS[options.net]
    symbol = build_network()
    params = nets.random_params(symbol, (options.batch, *shape))
    extra = {}
    if options.precision == "int8":  # calibrated as bench/int8_ptq.py does: random images
        images = np.random.default_rng(36).standard_normal((8, *shape), dtype=np.float32)
        extra = {"calibration": {"data": images}}
    feed = {"data": np.random.default_rng(0).standard_normal((options.batch, *shape),
                                                              dtype=np.float32)}

    def load(own_weights: bool = False) -> Any:
        weights = {name: value.copy() for name, value in params.items()} if own_weights \
            else params
        return engine.load_model(symbol, weights, optimize=True, precision=options.precision,
                                 **extra)

    return load, feed


def build(options: argparse.Namespace) -> tuple[Any, dict[str, np.ndarray]]:
    """A warm plan of the network and its feed."""
    from threadpoolctl import threadpool_limits

    load, feed = network(options)
    model = load()
    model.infer(feed)
    threadpool_limits(options.threads)  # loading may have brought in another BLAS
    plan = model.plan_for(feed)
    plan.run(feed, copy_outputs=False)  # every buffer holds this input's values
    return plan, feed


def report(label: str, plan: Any, per_run: list[list[float]], whole: list[float],
           options: argparse.Namespace, again: list[list[float]] | None = None) -> None:
    """The per-node table of one plan's walks, slowest first (``options.in_order``: in the
    order of each node's first step); ``again``: each walk's second calls (`walk_twice`),
    given beside the first."""
    nodes: dict[int, list[int]] = defaultdict(list)
    for index, step in enumerate(plan.steps):
        nodes[id(step.node)].append(index)
    rows = []
    for indices in nodes.values():
        node = plan.steps[indices[0]].node
        sums = [sum(times[i] for i in indices) for times in per_run]
        kinds: dict[str, int] = defaultdict(int)
        for i in indices:
            kinds[call_kind(plan.steps[i].call)] += 1
        repeated = None if again is None else STATISTICS[options.statistic](
            [sum(times[i] for i in indices) for times in again])
        rows.append((STATISTICS[options.statistic](sums), node, len(indices), dict(kinds),
                     repeated))
    if not options.in_order:  # (else the nodes' order of first steps, as `nodes` holds them)
        rows.sort(key=lambda row: -row[0])
    walks = [sum(times) for times in per_run]
    print(f"{label}{options.net} batch {options.batch}, {options.threads} thread(s), "
          f"{len(plan.steps)} steps, {options.runs} runs")
    quickest = sum(min(times[index] for times in per_run) for index in range(len(plan.steps)))
    print(f"whole run (plan.run): median {statistics.median(whole) * 1e3:.2f} ms, best "
          f"{min(whole) * 1e3:.2f}; steps walked in order: median "
          f"{statistics.median(walks) * 1e3:.2f} ms, each step's quickest summed "
          f"{quickest * 1e3:.2f} ms")
    if again is not None:
        statistic = STATISTICS[options.statistic]
        print(f"every step called twice: first calls summed {statistic(walks) * 1e3:.2f} ms "
              f"({options.statistic} of runs), second calls "
              f"{statistic([sum(times) for times in again]) * 1e3:.2f}")
    warm = warm_times(plan, options.warm) if options.warm else {}
    for seconds, node, count, kinds, repeated in rows[:options.top]:
        listed = ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items(), key=lambda x: -x[1]))
        alone = f", warm alone {warm[id(node)] * 1e3:.3f} ms" if warm else ""
        if repeated is not None:
            alone += f", again {repeated * 1e3:.3f} ms"
        print(f"  {seconds * 1e3:7.3f} ms  {node.name} ({node.op}), {count} steps: {listed}"
              f"{alone}")
    for name in options.node:
        print(f"{name}, step by step (median µs):")
        for index, step in enumerate(plan.steps):
            if step.node.name == name:
                median = statistics.median(times[index] for times in per_run)
                print(f"  {index:4d} {median * 1e6:9.1f}  {call_kind(step.call)}")


def walk_twice(plan: Any, feed: dict[str, np.ndarray],
               clock: Any = time.perf_counter) -> tuple[list[float], list[float]]:
    """One walk (`Plan.walk`) calling each step twice, the second call right after the
    first: each step's first and second call's seconds, in order. The plan's steps are as
    they were after it."""
    first: list[float] = []
    second: list[float] = []

    def twice(call: Any) -> Any:
        def both() -> None:
            start = clock()
            call()
            middle = clock()
            call()
            first.append(middle - start)
            second.append(clock() - middle)
        return both

    steps = list(plan.steps)
    plan.steps[:] = [dataclasses.replace(step, call=twice(step.call)) for step in steps]
    try:
        plan.walk(feed, clock)
    finally:
        plan.steps[:] = steps
    return first, second


def warm_times(plan: Any, calls: int) -> dict[int, float]:
    """Per node (by id), the best of ``calls`` calls of its steps in a row, each call right
    after the last: the node's own time with its weights and data in cache, against which its
    time in the walk shows what finding them out of cache costs. One thread: the steps are
    called outside a run, as a run on one thread calls them."""
    clock = time.thread_time
    best: dict[int, float] = {}
    for step in plan.steps:
        times = []
        for _ in range(calls):
            start = clock()
            step.call()
            times.append(clock() - start)
        best[id(step.node)] = best.get(id(step.node), 0.0) + min(times)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(NETWORKS), default="resnet18_v1")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--in-order", action="store_true",
                        help="list the nodes in the order a run reaches them (to read beside "
                             "--openvino's layers), not slowest first")
    parser.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="fp32",
                        help="the model's precision setting (int8: calibrated on 8 random images)")
    parser.add_argument("--winograd-min-tiles", type=int, default=None,
                        help="also bind a plan with winograd_bind.MIN_TILES at this, and time "
                             "the two in turn")
    parser.add_argument("--f4-min-tiles", type=int, default=None,
                        help="the same with winograd_bind.F4_MIN_TILES")
    parser.add_argument("--bf16-grid-max-steps", type=int, default=None,
                        help="bind a second plan with conv_amx.BF16_GRID_MAX_STEPS at N "
                             "(0: no direct product on the AVX-512 BF16 tile hands its "
                             "readers bf16)")
    parser.add_argument("--pixels-min-depth", type=int, default=None,
                        help="the same with conv_amx.PIXELS_MIN_DEPTH (the K from which the "
                             "AVX-512 BF16 tile's direct products run pixel tiles)")
    parser.add_argument("--pointwise-min-depth", type=int, default=None,
                        help="the same with conv_amx.POINTWISE_MIN_DEPTH (the channels from "
                             "which a 1×1 layer at 7² runs on those pixel tiles)")
    parser.add_argument("--warm", type=int, default=0,
                        help="also call each step this many times in a row after the walks "
                             "and give each node's best (one thread)")
    parser.add_argument("--again", action="store_true",
                        help="call every step twice in each walk and give each node's second "
                             "call beside its first")
    parser.add_argument("--node", action="append", default=[],
                        help="a node whose steps are listed one by one (repeatable)")
    parser.add_argument("--plans", type=int, default=1,
                        help="bind this many identical plans (a model each), walked in turn")
    parser.add_argument("--openvino", action="store_true",
                        help="also print OpenVINO's time per layer on the same case")
    parser.add_argument("--peer-python", default=None,
                        help="the peer environment's Python (as bench/executor.py's option)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="thread: the calling thread's CPU time (one thread only)")
    parser.add_argument("--statistic", choices=sorted(STATISTICS), default="median",
                        help="what each node's row gives of its runs' times")
    options = parser.parse_args()
    if options.clock == "thread" and options.threads != 1:
        parser.error("--clock thread counts the calling thread alone: use it with --threads 1")
    if options.warm and options.threads != 1:
        parser.error("--warm calls steps outside a run: use it with --threads 1")
    from threadpoolctl import threadpool_limits

    threadpool_limits(options.threads)
    plans = {"": build(options)}
    for copy in range(1, options.plans):  # identical plans, each of a model of its own
        plans[f"plan {copy + 1}: "] = build(options)
    from engine.kernels import conv_amx, winograd_bind

    changed = {(module, name): value for module, name, value in (
        (winograd_bind, "MIN_TILES", options.winograd_min_tiles),
        (winograd_bind, "F4_MIN_TILES", options.f4_min_tiles),
        (conv_amx, "BF16_GRID_MAX_STEPS", options.bf16_grid_max_steps),
        (conv_amx, "PIXELS_MIN_DEPTH", options.pixels_min_depth),
        (conv_amx, "POINTWISE_MIN_DEPTH", options.pointwise_min_depth)) if value is not None}
    if changed:
        for (module, name), value in changed.items():
            setattr(module, name, value)
        label = ", ".join(f"{name} {value}" for (_, name), value in changed.items())
        plans[f"{label}: "] = build(options)
    per_run: dict[str, list[list[float]]] = {label: [] for label in plans}
    whole: dict[str, list[float]] = {label: [] for label in plans}
    again: dict[str, list[list[float]]] = {label: [] for label in plans}
    clock = CLOCKS[options.clock]
    peer = OpenVinoTurns(options) if options.openvino else None
    for run in range(options.runs):
        for label, (plan, feed) in plans.items():
            if options.again:
                first, second = walk_twice(plan, feed, clock)
                per_run[label].append(first)
                again[label].append(second)
            else:
                per_run[label].append(plan.walk(feed, clock))
            for _ in range(2):  # the walk dropped the plan's records: two runs record first
                plan.run(feed, copy_outputs=False)
            start = clock()
            plan.run(feed, copy_outputs=False)
            whole[label].append(clock() - start)
        if peer is not None and ((run + 1) % TURN == 0 or run + 1 == options.runs):
            peer.turn(run % TURN + 1)  # as many calls as our runs since its last turn
    for label, (plan, _) in plans.items():
        report(label, plan, per_run[label], whole[label], options,
               again[label] if options.again else None)
    if peer is not None:
        print(peer.finish(), end="")


def openvino_case(options: argparse.Namespace, root: Path) -> tuple[Path, str]:
    """The network's folder for the peer environment (as `bench/executor.py` writes it, under
    ``root``, with the case's input) and OpenVINO's runtime name for the precision."""
    import executor

    name = {"mobilenet_v2": "mobilenetv2_1.0"}.get(options.net, options.net)
    folder = executor.prepare_network(name, root, 0)
    executor.write_case_input(folder, options.batch)
    return folder, {"fp32": "ov-f32"}.get(options.precision, f"ov-{options.precision}")


class OpenVinoTurns:
    """OpenVINO's per-layer times on this case, from `quantized_peers --layer-turns` in the
    peer environment on the ONNX file our exporter writes (a folder as `bench/executor.py`
    makes), its calls in turns with our walks (`turn`), so that the host's slow spells fall
    on both: its counters, timed after ours, read 1.09–1.27 ms on ResNet-18's 3×3 int8
    layers against 1.26–1.43 in another run, and only in turns did its per-layer lead at 7²
    show at our tenth percentile too."""

    def __init__(self, options: argparse.Namespace) -> None:
        import subprocess
        import tempfile

        import executor

        self.root = tempfile.TemporaryDirectory()
        folder, runtime = openvino_case(options, Path(self.root.name))
        self.process = subprocess.Popen(
            [executor.peer_python(options.peer_python),
             str(Path(__file__).with_name("quantized_peers.py")), runtime, str(folder),
             "--batch", str(options.batch), "--threads", str(options.threads),
             "--layer-turns"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._until(quantized_peers.TURNS_READY)

    def _until(self, answer: str) -> None:
        """Reads the peer's output up to the line ``answer`` (NNCF's progress before it)."""
        for line in self.process.stdout:
            if line.strip() == answer:
                return
        raise RuntimeError(f"the OpenVINO peer ended before {answer} (exit "
                           f"{self.process.wait()})")

    def turn(self, calls: int) -> None:
        """``calls`` of OpenVINO's calls, timed layer by layer, while ours wait."""
        self.process.stdin.write(f"{calls}\n")
        self.process.stdin.flush()
        self._until(quantized_peers.TURN_DONE)

    def finish(self) -> str:
        """The peer's table of every turn's calls."""
        self.process.stdin.close()
        table = self.process.stdout.read()
        self.process.wait()
        self.root.cleanup()
        return table


if __name__ == "__main__":
    main()
