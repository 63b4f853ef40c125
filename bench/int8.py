"""Benchmark: MXNet's int8 exports on our compiled int8 path (fused convolutions on the
VNNI/AMX GEMM, or AVX2's where the host has no VNNI, `engine.kernels.int8_conv`) against the
float64 BLAS products (interleaved A/B, medians), and the int8 GEMM's own throughput, one
thread.

* models: each fixture under tests/fixtures/mxnet_quantized (batch 2, as MXNet ran it),
  `engine.load_model`, one inference per round on each path in turn
  (`integer.use_fast_path`), the two paths' outputs checked equal bit for bit first;
* GEMM: ``C = A @ W`` (uint8 A, int8 W packed once) through `gemm_int8.multiply` as the
  convolutions call it (the copy of A into padded rows included), on VNNI (else AVX2) and,
  where the host has it, AMX-INT8, best and median of many (and, on an AVX2 host without
  VNNI, weights within ±63 on its ``vpmaddubsw`` kernel), beside the float64 BLAS product
  the other path runs (A converted to float64, one thread, median) and float32 products of
  the same shape, one thread, best: ours (`gemm_kernel`, the weights packed as a plan packs
  them) and NumPy's sgemm;
* classifier (``--classifier``): ResNet-50 v2's last layer at batch 1 (one row, K 2048,
  N 1000: 2 MB of packed weights) on VNNI (else AVX2) with its weights out of cache, as a
  network's walk finds them: a pass over ``--evict`` MB between calls, then one row (the
  one-row tile) and, in turn, two rows (the whole tile, as one row took it before), the
  thread's CPU time, medians and first quartiles.

Usage: python bench/int8.py [--rounds N] [--repeat N] [--models-only] [--gemm-only]
[--classifier] [--evict MB]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's engine

import engine  # noqa: E402
from engine.cpu import blas_threads  # noqa: E402
from engine.kernels import gemm_bind, gemm_int8, gemm_kernel  # noqa: E402
from engine.ops.quantized import integer  # noqa: E402

MODELS = ("resnet18_v1_naive", "resnet50_v1_thin_entropy", "mobilenet_v2_naive",
          "bert_encoder_naive")
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "mxnet_quantized"
# (M, K, N, where it comes from): ResNet-50's products at batch 1, 224²
SHAPES = ((3136, 576, 64, "3×3 64→64 at 56², im2col"), (3136, 64, 256, "1×1 64→256 at 56²"),
          (784, 1152, 128, "3×3 128→128 at 28²"), (196, 2304, 256, "3×3 256→256 at 14²"),
          (49, 4608, 512, "3×3 512→512 at 7²"), (2, 2048, 1000, "classifier, batch 2"),
          (1, 512, 1000, "ResNet-18's classifier, batch 1"))


def _infer(model: object, data: np.ndarray, fast: bool) -> tuple[float, np.ndarray]:
    integer.use_fast_path(fast)
    start = time.perf_counter()
    (result,) = model.infer({"data": data}).values()
    return time.perf_counter() - start, np.asarray(result)


def models(rounds: int) -> None:
    print(f"load average {' '.join(f'{value:.2f}' for value in os.getloadavg())}")
    print(f"{'model':28} {'float64 ms':>11} {'int8 ms':>11} {'speed-up':>8}")
    for name in MODELS:
        folder = FIXTURES / name
        model = engine.load_model(str(folder / f"{name}-symbol.json"),
                                  str(folder / f"{name}-0000.params"))
        data = np.load(folder / "io.npz")["data"]
        slow_out, fast_out = _infer(model, data, False)[1], _infer(model, data, True)[1]
        if not np.array_equal(slow_out, fast_out):
            raise SystemExit(f"{name}: the two paths differ")
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(rounds):
            for fast in (False, True):
                times[fast].append(_infer(model, data, fast)[0])
        slow, fast = (statistics.median(times[f]) * 1e3 for f in (False, True))
        print(f"{name:28} {slow:11.2f} {fast:11.2f} {slow / fast:7.2f}×")
    integer.use_fast_path(True)


def gemm(repeat: int) -> None:
    amx = gemm_int8.amx_available()
    narrow = gemm_int8.narrow_weights_pay()
    kernel = "VNNI" if gemm_int8.vnni_available() else "AVX2"
    print(f"\n{'M×K×N':>16} {kernel + ' best':>9} {'median':>7} {'AMX best':>9} {'median':>7} "
          f"{'float64 BLAS':>12} {'fp32 ours':>9} {'sgemm':>7} {'÷ ours':>6}"
          + (f" {'±63 best':>9} {'median':>7} {'÷ ours':>6}" if narrow else "")
          + "  shape (GOP/s)")
    rng = np.random.default_rng(0)
    for m, k, n, where in SHAPES:
        a = rng.integers(0, 256, (m, k)).astype(np.uint8)
        matrix = rng.integers(-128, 128, (k, n)).astype(np.int8)
        work = 2 * m * k * n / 1e9
        rates = []
        # the weights within ±63 last (the ``vpmaddubsw`` kernel), where this host runs them
        narrow_matrix = (matrix // 2).clip(-63, 63)
        for packed in [gemm_int8.PackedWeights(matrix)] + (
                [gemm_int8.PackedWeights(matrix, amx=True)] if amx else []) + (
                [gemm_int8.PackedWeights(narrow_matrix)] if narrow else []):
            gemm_int8.multiply(a, packed)
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                gemm_int8.multiply(a, packed)
                times.append(time.perf_counter() - start)
            rates += [work / min(times), work / statistics.median(times)]
        if not amx:
            rates[2:2] = [float("nan")] * 2
        blas = []
        w = matrix.astype(np.float64)
        with blas_threads.one_thread():
            for _ in range(max(repeat // 10, 3)):  # the float64 path's product, A converted
                start = time.perf_counter()
                np.matmul(a.astype(np.float64), w)
                blas.append(time.perf_counter() - start)
            ours, sgemm = (work / _best(product, repeat) for product in _fp32_products(m, k, n))
        print(f"{m:>5}×{k:>4}×{n:>4} {rates[0]:9.0f} {rates[1]:7.0f} {rates[2]:9.0f} "
              f"{rates[3]:7.0f} {work / statistics.median(blas):12.0f} {ours:9.0f} "
              f"{sgemm:7.0f} {rates[0] / ours:5.2f}×"
              + (f" {rates[4]:9.0f} {rates[5]:7.0f} {rates[4] / ours:5.2f}×" if narrow else "")
              + f"  {where}")


def _fp32_products(m: int, k: int, n: int) -> list:
    """The float32 products of an int8 product's shape: ours as a plan binds a convolution's
    (its weights, N × K, packed once on the left, the patches K × M on the right) and NumPy's
    sgemm of the int8 product's orientation."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    patches = np.ascontiguousarray(a.T)
    sums = np.empty((n, m), np.float32)
    ours = gemm_kernel.bind_packed(gemm_kernel.pack(np.ascontiguousarray(w.T)), patches, sums,
                                   columns_outside=gemm_bind.streams_right(*patches.shape))
    c = np.empty((m, n), np.float32)
    return [ours, lambda: np.matmul(a, w, c)]


def _best(product: object, repeat: int) -> float:
    """Best seconds of ``repeat`` calls after one warm-up call."""
    product()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        product()
        times.append(time.perf_counter() - start)
    return min(times)


def classifier(repeat: int, evict_mb: int) -> None:
    rng = np.random.default_rng(0)
    packed = gemm_int8.PackedWeights(rng.integers(-128, 128, (2048, 1000)).astype(np.int8))
    rows = gemm_int8.padded_rows(2, packed)
    rows[:2, :2048] = rng.integers(0, 256, (2, 2048)).astype(np.uint8)
    evict = np.ones(evict_mb << 20, np.uint8)
    times: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(repeat):
        for count in (1, 2):
            np.add(evict, 1, out=evict)
            start = time.thread_time()
            gemm_int8.multiply_rows(rows, count, packed, signed=False)
            times[count].append(time.thread_time() - start)
    kernel = "VNNI" if gemm_int8.vnni_available() else "AVX2"
    print(f"\nclassifier 2048×1000 on {kernel}, {evict_mb} MB evicted between calls (ms):")
    for count, label in ((1, "one row, one-row tile"), (2, "two rows, whole tile")):
        print(f"  {label:24} median {statistics.median(times[count]) * 1e3:.3f}  first "
              f"quartile {np.percentile(times[count], 25) * 1e3:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--models-only", action="store_true")
    parser.add_argument("--gemm-only", action="store_true")
    parser.add_argument("--classifier", action="store_true")
    parser.add_argument("--evict", type=int, default=128)
    args = parser.parse_args()
    if not gemm_int8.available():
        raise SystemExit("this host has neither AVX-512 VNNI nor AVX2: nothing to compare")
    if args.classifier:
        classifier(args.repeat, args.evict)
        return
    if not args.gemm_only:
        models(args.rounds)
    if not args.models_only:
        gemm(args.repeat)


if __name__ == "__main__":
    main()
