"""Denormals: ResNet-18 on random bit patterns against uniform floats, flushed and not.

Load generators send random bytes by default (Triton's perf_analyzer does): as float32 they
hold denormals, NaN and infinities, and denormals make an x86 core compute many times slower
unless FTZ and DAZ are set (docs/threads.md, "Denormals flushed to zero"). This runs ResNet-18
v1 (224×224, random weights) at batch 1 on one thread, in this process, on both inputs, with
the plan's run flushed as the engine runs it and with the flush left out (the runtime's
`denormals` module swapped for one whose `flushed` does nothing), the four in turn, round by
round, and prints the median and best milliseconds of each.

    .venv/bin/python bench/denormals.py              # 7 rounds of 3 calls each
    .venv/bin/python bench/denormals.py --rounds 15
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

import nets  # noqa: E402 - the sibling module, found through the path set just above
from threadpoolctl import threadpool_limits  # noqa: E402

import engine  # noqa: E402
from engine.runtime import plan as plan_module  # noqa: E402

CALLS = 3  # calls per timed round


class _NoFlush:
    """`denormals.flushed` that sets nothing: the plan runs with the caller's MXCSR."""

    __slots__ = ()

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exception: object) -> None:
        pass


class _Unflushed:
    flushed = _NoFlush


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds of each case")
    args = parser.parse_args()
    symbol = nets.resnet18_v1()
    params = nets.random_params(symbol, (1, 3, 224, 224))
    model = engine.load_model(symbol, {name: value for name, value in params.items()
                                       if name != "data"})
    rng = np.random.default_rng(0)
    bits = np.frombuffer(rng.bytes(3 * 224 * 224 * 4), np.float32).reshape(1, 3, 224, 224)
    inputs = {"random bits": bits.copy(), "uniform floats": rng.random((1, 3, 224, 224),
                                                                       np.float32)}
    tiny = (bits != 0) & (np.abs(bits) < np.finfo(np.float32).tiny)
    print(f"random bits: {tiny.mean():.2%} denormals, {np.isnan(bits).mean():.2%} NaN, "
          f"{np.isinf(bits).mean():.2%} infinities")
    flushing = {"flushed": plan_module.denormals, "not flushed": _Unflushed}
    times: dict[tuple[str, str], list[float]] = {}
    with threadpool_limits(1, user_api="blas"):
        for data in inputs.values():
            for _ in range(CALLS):
                model.infer({"data": data})
        try:
            for index in range(args.rounds):
                ways = list(flushing.items())
                for name, data in inputs.items():
                    for way, module in ways if index % 2 else ways[::-1]:
                        plan_module.denormals = module
                        started = time.perf_counter()
                        for _ in range(CALLS):
                            model.infer({"data": data})
                        elapsed = (time.perf_counter() - started) / CALLS
                        times.setdefault((name, way), []).append(elapsed * 1e3)
        finally:
            plan_module.denormals = flushing["flushed"]
    print("| input | plan run | median ms | best ms |")
    print("| --- | --- | --- | --- |")
    for (name, way), values in times.items():
        print(f"| {name} | {way} | {statistics.median(values):.1f} | {min(values):.1f} |")


if __name__ == "__main__":
    main()
