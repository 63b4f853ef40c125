"""Seed MLP (Dense 256-relu, Dense 128-relu, Dense 2; input (1, 512)): 1000 forward passes
imperatively and after ``hybridize()``.

Usage: ``python bench/hybridize.py [--passes 1000] [--repeat 5] [--profile]``. Prints the best
of ``--repeat`` timings of each mode and the speed-up; ``--profile`` also prints where the
hybridized call spends its time (the plan's steps versus the Python around them).
"""

from __future__ import annotations

import argparse
import platform
import time

from engine import nd
from engine.compiler import PASSES
from engine.gluon import nn


def get_net() -> nn.HybridSequential:
    """The seed's MLP, initialized."""
    net = nn.HybridSequential()
    net.add(nn.Dense(256, activation="relu"), nn.Dense(128, activation="relu"), nn.Dense(2))
    net.initialize()
    return net


def bench(net: nn.HybridSequential, x: nd.NDArray, passes: int) -> float:
    """Seconds for ``passes`` forward passes."""
    nd.waitall()
    start = time.perf_counter()
    for _ in range(passes):
        net(x)
    nd.waitall()
    return time.perf_counter() - start


def profile(net: nn.HybridSequential, x: nd.NDArray, passes: int) -> None:
    """Split one hybridized call into plan time and the Python around it."""
    cached = net._cached
    assert cached is not None and cached.model is not None
    feed = {"data": x._data}
    plan = cached.model.plan_for(feed)
    start = time.perf_counter()
    for _ in range(passes):
        plan.run(feed)
    plan_seconds = time.perf_counter() - start
    total = bench(net, x, passes)
    print(f"  plan.run only:        {plan_seconds / passes * 1e6:8.1f} us/call")
    print(f"  net(x) hybridized:    {total / passes * 1e6:8.1f} us/call")
    print(f"  Block.__call__ share: {(total - plan_seconds) / passes * 1e6:8.1f} us/call")
    for op, seconds in sorted(plan.profile(feed, 200).items(), key=lambda item: -item[1]):
        print(f"  step {op:<40} {seconds * 1e6:8.1f} us")


def main() -> None:
    """Run the benchmark and print the result."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--passes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--no-fusion", action="store_true",
                        help="compile without the fuse_elementwise pass")
    args = parser.parse_args()
    x = nd.random.normal(shape=(1, 512))
    passes = [name for name in PASSES if name != "fuse_elementwise"] if args.no_fusion else True
    imperative, hybrid = float("inf"), float("inf")
    for _ in range(args.repeat):
        net = get_net()
        net(x)
        imperative = min(imperative, bench(net, x, args.passes))
        net.hybridize(optimize=passes)
        net(x)
        hybrid = min(hybrid, bench(net, x, args.passes))
    print(f"python {platform.python_version()}, {args.passes} passes, best of {args.repeat}, "
          f"passes: {'all' if passes is True else ', '.join(passes)}")
    print(f"before hybridizing: {imperative:.4f} sec")
    print(f"after hybridizing:  {hybrid:.4f} sec")
    print(f"speed-up: {imperative / hybrid:.2f}x")
    if args.profile:
        profile(net, x, args.passes)


if __name__ == "__main__":
    main()
