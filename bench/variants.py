"""Benchmark: a kernel's variant against the kernel as it is, two plans in one process, run in
alternation, node by node.

Usage: ``python bench/variants.py --set MODULE:ATTRIBUTE=VALUE [--net resnet50_v2] [--batch 1]
[--precision bf16] [--rounds 20]``, e.g. ``--set
engine.kernels.gemm_bf16_ir:PairTileKernel.asks_large_c=False``.

The first plan binds with the engine as it is; then each ``--set`` (``module:attribute=value``,
the value a Python literal, the attribute a dotted path from the module) is applied, every
kernel made so far is made anew (`engine.cpu.compiled.make_anew`: the first plan keeps the
machine code it bound) and the second plan binds. Each round runs each plan whole
(``plan.run``), then walks it (`Plan.walk`), the calling thread's CPU time read around each
step, on one thread. The report gives each plan's whole runs and each node's median, and for
each node the median over rounds of the second's time over the first's: the two in a round
run seconds apart, so a host's drift, which moves a process's speed 10-30% over minutes,
falls mostly out of that ratio (two plans alike read 0.97-1.03 a node on a busy 2-vCPU VM).
The outputs of the two plans are compared first.

Why not `bench/checkouts.py`: there each checkout runs in a process of its own, whole runs
only, the turns seconds apart; a change to one kind of layer moves a whole run by less than
the turns scatter. Here both plans share a process, so a variant that changes the plan's
memory or threads is not told apart from the host's drift as well.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# This checkout's engine and the sibling modules (as bench/executor.py does).
sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

import numpy as np  # noqa: E402
import steps_in_order  # noqa: E402 - found through the path set just above


def parse_setting(text: str) -> tuple[Any, str, Any]:
    """``module:attribute.path=value`` → (the object holding the attribute, its name, the
    value)."""
    target, _, value = text.partition("=")
    module_name, _, path = target.partition(":")
    if not value or not path:
        raise SystemExit(f"--set {text!r}: expected module:attribute=value")
    holder: Any = importlib.import_module(module_name)
    *parents, name = path.split(".")
    for parent in parents:
        holder = getattr(holder, parent)
    if not hasattr(holder, name):
        raise SystemExit(f"--set {text!r}: {holder!r} has no attribute {name!r}")
    return holder, name, ast.literal_eval(value)


def bind(options: argparse.Namespace) -> tuple[Any, dict[str, np.ndarray]]:
    return steps_in_order.build(argparse.Namespace(
        net=options.net, batch=options.batch, threads=1, precision=options.precision))


def node_steps(plan: Any) -> list[list[int]]:
    """Each node's step indices, in the order of its first step."""
    nodes: dict[int, list[int]] = {}
    for index, step in enumerate(plan.steps):
        nodes.setdefault(id(step.node), []).append(index)
    return list(nodes.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(steps_in_order.NETWORKS), default="resnet50_v2")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="bf16")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--set", action="append", default=[], dest="settings",
                        help="module:attribute=value for the second plan (repeatable)")
    options = parser.parse_args()
    from threadpoolctl import threadpool_limits

    from engine.cpu import compiled

    threadpool_limits(1)
    settings = [parse_setting(text) for text in options.settings]
    plans = {"as is": bind(options)}
    for holder, name, value in settings:
        setattr(holder, name, value)
    compiled.make_anew()
    plans["variant"] = bind(options)
    answers = [plan.run(feed) for plan, feed in plans.values()]
    for index, (first, second) in enumerate(zip(*answers, strict=True)):
        same = np.array_equal(first, second)
        print(f"output {index}: " + ("the same bits" if same else
              f"differs by up to {float(np.max(np.abs(first - second))):.3g}"))
    clock = time.thread_time
    whole: dict[str, list[float]] = {label: [] for label in plans}
    walks: dict[str, list[list[float]]] = {label: [] for label in plans}
    for _ in range(options.rounds):
        for label, (plan, feed) in plans.items():
            start = clock()
            plan.run(feed, copy_outputs=False)
            whole[label].append(clock() - start)
            walks[label].append(plan.walk(feed, clock))
    report(options, plans, whole, walks)


def report(options: argparse.Namespace, plans: dict[str, Any], whole: dict[str, list[float]],
           walks: dict[str, list[list[float]]]) -> None:
    print(f"{options.net} batch {options.batch}, {options.precision}, one thread, "
          f"{options.rounds} rounds, CPU ms; variant: {' '.join(options.settings) or 'none'}")
    for label, seconds in whole.items():
        print(f"  whole run, {label}: median {statistics.median(seconds) * 1e3:.2f}, best "
              f"{min(seconds) * 1e3:.2f}")
    plan = plans["as is"][0]
    nodes = {label: node_steps(bound) for label, (bound, _) in plans.items()}
    if len(nodes["as is"]) != len(nodes["variant"]):
        raise SystemExit(f"the plans differ: {len(nodes['as is'])} nodes with steps against "
                         f"{len(nodes['variant'])}")
    print("  node: median as is, variant; variant ÷ as is (median of rounds)")
    sums = {label: 0.0 for label in plans}
    for position, indices in enumerate(nodes["as is"]):
        times = {label: [sum(walk[i] for i in nodes[label][position]) for walk in runs]
                 for label, runs in walks.items()}
        medians = {label: statistics.median(values) for label, values in times.items()}
        for label, value in medians.items():
            sums[label] += value
        ratio = statistics.median(b / a for a, b in zip(times["as is"], times["variant"],
                                                          strict=True) if a > 0)
        print(f"  {plan.steps[indices[0]].node.name:24s} {medians['as is'] * 1e3:8.3f} "
              f"{medians['variant'] * 1e3:8.3f}  {ratio:.3f}")
    print(f"  nodes' medians summed: as is {sums['as is'] * 1e3:.2f}, variant "
          f"{sums['variant'] * 1e3:.2f} ({sums['variant'] / sums['as is']:.3f})")


if __name__ == "__main__":
    main()
