"""Benchmark: one int8 1×1 layer at 7² on every core, panel by panel against a chain of rows.

Usage: ``python bench/int8_chain_layer.py [--k 160] [--n 960] [--rounds 3000]``.

The layer (K input channels into N filters, int8 data handed over channels-last, uint8
output) is bound twice in one process: as `int8_conv.rows_first` alone binds it (where it
says no: the copy, the product by panels and the requantize pass, three jobs) and as
`int8_conv.chain_rows_first` binds it (one `part_chain` job of row shares). Both are called
in turn, armed on two cores, round after round, so that a busy machine's load falls on both
alike; the report gives each way's jobs and the quartiles of its wall time. The outputs are
checked equal first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from engine.cpu import spin_pool  # noqa: E402 - found through the path set just above
from engine.kernels import gemm_int8, int8_conv  # noqa: E402


def bound(n: int, rule, data, weight, epilogue):
    """The layer bound with ``rule`` deciding whether it chains, its output and its jobs."""
    chosen = int8_conv.chain_rows_first
    int8_conv.chain_rows_first = rule
    try:
        out = np.zeros((1, n, 7, 7), np.uint8)
        conv = int8_conv.FusedConv(
            data, weight, gemm_int8.PackedWeights(int8_conv.weight_matrix(weight)),
            int8_conv.Geometry((1, 1), (1, 1), (1, 1), (0, 0)), out, None,
            int8_conv.Layouts(data=True, out=True))
        return conv, out, len(conv.jobs_for(epilogue))
    finally:
        int8_conv.chain_rows_first = chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=160)
    parser.add_argument("--n", type=int, default=960)
    parser.add_argument("--rounds", type=int, default=3000)
    args = parser.parse_args()
    k, n = args.k, args.n
    rng = np.random.default_rng(1)
    data = rng.integers(-128, 128, (1, k, 7, 7)).astype(np.int8)  # bytes laid N, H, W, C
    weight = rng.integers(-127, 128, (n, k, 1, 1)).astype(np.int8)
    epilogue = int8_conv.Epilogue(bias=np.zeros(n, np.int32),
                                  scales=np.full(n, 1e-3, np.float32), act="relu", low=0,
                                  high=255)
    ways = {name: bound(n, rule, data, weight, epilogue) for name, rule in (
        ("panels", int8_conv.rows_first), ("chain", int8_conv.chain_rows_first))}
    times: dict[str, list[float]] = {name: [] for name in ways}
    with spin_pool.armed(2):
        for conv, _, _ in ways.values():
            conv(epilogue)
        if not np.array_equal(ways["panels"][1], ways["chain"][1]):
            raise SystemExit("the two ways' outputs differ")
        for _ in range(args.rounds):
            for name, (conv, _, _) in ways.items():
                start = time.perf_counter()
                conv(epilogue)
                times[name].append(time.perf_counter() - start)
    for name, values in times.items():
        quartiles = " ".join(f"{q * 1e6:.1f}" for q in statistics.quantiles(values, n=4))
        print(f"{k} → {n} at 7², {name}: {ways[name][2]} jobs, µs quartiles {quartiles}")


if __name__ == "__main__":
    main()
