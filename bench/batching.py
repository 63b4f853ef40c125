# ruff: noqa: E402 - BLAS thread variables must be set before numpy is imported
"""Benchmark: dynamic batching vs none, in process (no HTTP), at 64 concurrent callers.

Usage: ``python bench/batching.py [--callers 64] [--seconds 5] [--max-batch 64]
[--delay-us 2000] [--models seed_mlp,lenet]``. Each caller loops sending one-row requests to a
`DynamicBatcher` over ``engine.load_model(...).infer``; the script prints requests per second
with batching (``max_batch_size`` = --max-batch) and without (``max_batch_size=1``), the mean
batch size, the median and p99 latency, and the speed-up. Target: at least 5x on the seed MLP.
The models are the conformance exports in ``tests/fixtures/mxnet/models``.

BLAS runs single-threaded unless ``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS`` are set: batches
already run on their own worker thread, and on a small shared machine a multi-threaded BLAS
spends its time spinning (see docs/benchmarks.md).
"""

from __future__ import annotations

import os

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")  # before numpy is imported

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import engine
from engine.serving.batcher import BatchingPolicy, DynamicBatcher

MODELS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "mxnet" / "models"


@dataclass(frozen=True)
class Result:
    """One run: completed requests per second, batch sizes and latencies."""

    requests_per_s: float
    mean_batch: float
    p50_ms: float
    p99_ms: float


def load(name: str) -> tuple[engine.Model, np.ndarray]:
    """A conformance model and one input row shaped like its io.npz input."""
    meta = json.loads((MODELS / name / "meta.json").read_text())
    model = engine.load_model(MODELS / name / meta["symbol_file"],
                              MODELS / name / meta["params_file"])
    (spec,) = meta["inputs"]
    row = np.random.default_rng(0).normal(size=(1, *spec["shape"][1:])).astype(spec["dtype"])
    return model, row


async def measure(model: engine.Model, row: np.ndarray, policy: BatchingPolicy, callers: int,
                  seconds: float) -> Result:
    """Run `callers` closed-loop clients for `seconds` and count completed requests."""
    name = model.input_names[0]
    latencies: list[float] = []
    stop = time.monotonic() + seconds

    async def caller() -> None:
        while time.monotonic() < stop:
            started = time.monotonic()
            await batcher.submit({name: row})
            latencies.append(time.monotonic() - started)

    async with DynamicBatcher(model.infer, policy, name="bench") as batcher:
        await batcher.submit({name: row})  # warm-up: shapes inferred, caches filled
        before = batcher.stats.snapshot()
        started = time.monotonic()
        await asyncio.gather(*(caller() for _ in range(callers)))
        elapsed = time.monotonic() - started
        after = batcher.stats.snapshot()
    batches = after.batches - before.batches
    mean_batch = (after.batch_rows.total - before.batch_rows.total) / max(batches, 1)
    return Result(len(latencies) / elapsed, mean_batch,
                  float(np.percentile(latencies, 50) * 1e3),
                  float(np.percentile(latencies, 99) * 1e3))


def main() -> None:
    """Parse arguments, run both modes for each model, print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--delay-us", type=int, default=2000)
    parser.add_argument("--models", default="seed_mlp,lenet")
    args = parser.parse_args()
    print(f"OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}, callers {args.callers}, "
          f"{args.seconds:g} s per mode, max_queue_delay {args.delay_us} us\n")
    print("| model | mode | requests/s | mean batch | p50 latency | p99 latency |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        model, row = load(name)
        results = {}
        for mode, size in (("batching", args.max_batch), ("max_batch_size=1", 1)):
            policy = BatchingPolicy(max_batch_size=size, max_queue_delay_s=args.delay_us / 1e6,
                                    max_queue_size=4 * args.callers)
            result = asyncio.run(measure(model, row, policy, args.callers, args.seconds))
            results[mode] = result
            print(f"| {name} | {mode} | {result.requests_per_s:,.0f} | {result.mean_batch:.1f} "
                  f"| {result.p50_ms:.1f} ms | {result.p99_ms:.1f} ms |", flush=True)
        speedup = results["batching"].requests_per_s / results["max_batch_size=1"].requests_per_s
        print(f"| {name} | speed-up | {speedup:.1f}x | | | |", flush=True)


if __name__ == "__main__":
    main()
