"""Benchmark: one CPU `Model.infer` batch cut into runs of rows (`engine.runtime.batch_split`).

Usage: ``python bench/batch_split.py [--rounds N] [--calls N] [--case NAME ...]``. For
ResNet-18 v1 at batch 4 (224×224) and the seed MLP at batch 64 (``--case`` also takes the MLP
at batch 1024 and a small CNN at batch 2 and 8), ``Model.infer`` each way below, the ways
taking turns block of calls by block so that a noisy machine's drift hits each alike:

* ``one thread``: not split, BLAS on one thread;
* ``BLAS all cores``: not split, BLAS on every core (numpy's default, an engine without the split);
* ``split``: the batch cut into one run of rows per core (`engine.runtime.batch_split`'s
  default), each run with one BLAS thread; ``split, no gate`` the same with the minimum work
  per run (`MIN_PART_WORK`) set to 0, to see what the gate keeps whole.

Prints each way's median and best milliseconds per call over every call timed, and whether
its outputs match the one-thread outputs. threadpoolctl (a dev dependency) sets the BLAS
threads of the unsplit ways.

``--blas-check`` instead answers whether numpy's OpenBLAS ``openblas_set_num_threads_local``
limits only the thread calling it: 1024² float32 GEMMs on the main thread (wall and process
CPU seconds, BLAS's thread count) before and after another thread called it with 1, and two
threads' GEMMs at once after it.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

import nets  # noqa: E402 - the sibling module, found through the path set just above
from threadpoolctl import threadpool_limits  # noqa: E402

import engine  # noqa: E402
from engine import sym  # noqa: E402
from engine.cpu import blas_threads, parallel  # noqa: E402
from engine.runtime import batch_split  # noqa: E402

# After a GEMM on several threads OpenBLAS's workers spin for about 0.1 s (measured: 0.105 s
# of CPU time over a 0.2 s sleep), holding a core a split call would use: each way's block
# starts after this long.
SETTLE_S = 0.25


def small_cnn() -> sym.Symbol:
    """Two 3×3 convolutions (16, 32 channels) with max and global pooling and a dense layer
    over 32×32 images: little work per row, to place the gate (`MIN_PART_WORK`)."""
    net = sym.var("data")
    for index, channels in enumerate((16, 32)):
        net = sym.Convolution(net, num_filter=channels, kernel=(3, 3), pad=(1, 1),
                              name=f"conv{index}")
        net = sym.Activation(net, act_type="relu")
        net = sym.Pooling(net, kernel=(2, 2), stride=(2, 2), pool_type="max",
                          global_pool=index == 1)
    return sym.FullyConnected(sym.Flatten(net), num_hidden=10, name="fc")


CASES = {"ResNet-18 v1, batch 4": (nets.resnet18_v1, (4, 3, 224, 224)),
         "seed MLP, batch 64": (nets.mlp, (64, 512)),
         "seed MLP, batch 1024": (nets.mlp, (1024, 512)),
         "small CNN, batch 2": (small_cnn, (2, 3, 32, 32)),
         "small CNN, batch 8": (small_cnn, (8, 3, 32, 32))}
DEFAULT_CASES = ["ResNet-18 v1, batch 4", "seed MLP, batch 64"]


def ways(cores: int) -> dict[str, tuple[int | None, int, int]]:
    """Each way: (split threads, BLAS threads, minimum work per run)."""
    return {"one thread": (1, 1, batch_split.MIN_PART_WORK),
            "BLAS all cores": (1, cores, batch_split.MIN_PART_WORK),
            "split": (None, cores, batch_split.MIN_PART_WORK),
            "split, no gate": (None, cores, 0)}


def time_way(model: engine.Model, feed: dict, way: tuple, calls: int) -> list[float]:
    """Seconds of each of ``calls`` infer calls run the given way."""
    split_threads, blas_threads, min_work = way
    batch_split.set_threads(split_threads)
    batch_split.MIN_PART_WORK = min_work
    times = []
    with threadpool_limits(blas_threads, user_api="blas"):
        time.sleep(SETTLE_S)
        model.infer(feed)  # the first call of a way may compile its plans
        for _ in range(calls):
            start = time.perf_counter()
            model.infer(feed)
            times.append(time.perf_counter() - start)
    return times


def bench_case(name: str, rounds: int, calls: int) -> None:
    builder, shape = CASES[name]
    net = builder()
    model = engine.load_model(net, nets.random_params(net, shape), optimize=True)
    feed = {"data": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    all_ways = ways(parallel.cores())
    batch_split.set_threads(1)
    with threadpool_limits(1, user_api="blas"):
        reference = model.infer(feed)
    samples: dict[str, list[float]] = {way: [] for way in all_ways}
    for _ in range(rounds):
        for way, setting in all_ways.items():
            samples[way] += time_way(model, feed, setting, calls)
    matches = {}
    for way, setting in all_ways.items():
        batch_split.set_threads(setting[0])
        batch_split.MIN_PART_WORK = setting[2]
        got = model.infer(feed)
        matches[way] = all(np.allclose(got[key], reference[key], rtol=1e-4, atol=1e-5)
                           for key in reference)
    print(f"\n{name} ({rounds} rounds × {calls} calls per way)")
    for way, times in samples.items():
        print(f"  {way:15s} median {statistics.median(times) * 1e3:8.2f} ms   "
              f"best {min(times) * 1e3:8.2f} ms   matches one thread: {matches[way]}")


def blas_check(reps: int = 20) -> None:
    """Print what `openblas_set_num_threads_local` called on another thread does to this one."""
    blas = blas_threads.numpy_openblas()
    assert blas is not None, "not numpy's bundled OpenBLAS"
    matrix = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)

    def gemms(report: dict, key: str) -> None:
        start, cpu = time.perf_counter(), time.thread_time()
        for _ in range(reps):
            matrix @ matrix
        report[key] = (time.perf_counter() - start, time.thread_time() - cpu)

    def timed(label: str, keys: tuple[str, ...]) -> None:
        report: dict = {}
        cpu, start = time.process_time(), time.perf_counter()
        workers = [threading.Thread(target=gemms, args=(report, key)) for key in keys[1:]]
        for worker in workers:
            worker.start()
        gemms(report, keys[0])
        for worker in workers:
            worker.join()
        wall = time.perf_counter() - start
        each = ", ".join(f"{key} {report[key][0]:.3f} s" for key in keys)
        print(f"{label}: {each}; wall {wall:.3f} s, process CPU {time.process_time() - cpu:.3f}"
              f" s; BLAS threads {blas.count()}")

    local = getattr(blas.library, "openblas_set_num_threads_local", None)
    assert local is not None, "this OpenBLAS has no openblas_set_num_threads_local"
    local.argtypes, local.restype = [ctypes.c_int], ctypes.c_int
    matrix @ matrix
    timed(f"{reps} GEMMs, main thread, before", ("main",))
    caller = threading.Thread(target=local, args=(1,))
    caller.start()
    caller.join()
    timed(f"{reps} GEMMs, main thread, after another thread's local(1)", ("main",))
    timed(f"{reps} GEMMs on each of two threads at once, after it", ("main", "other"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--case", choices=list(CASES), action="append")
    parser.add_argument("--blas-check", action="store_true")
    args = parser.parse_args()
    if args.blas_check:
        blas_check()
        return
    gate = batch_split.MIN_PART_WORK
    print(f"cores {parallel.cores()}, load average {os.getloadavg()[0]:.2f}, "
          f"MIN_PART_WORK {gate:,}")
    for name in args.case or DEFAULT_CASES:
        bench_case(name, args.rounds, args.calls)
        batch_split.MIN_PART_WORK = gate
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
