"""Benchmark: a float32 ResNet-18 (random weights) loaded with ``precision="int8"``: top-1
agreement with float32 over random images, and its time against the float32 model
(interleaved A/B, medians).

* calibration: ``--calibration`` random standard-normal images, naive (min/max) or entropy;
* agreement: ``--images`` other random images in batches of 32, the int8 plan against the
  float32 model's plan, top-1 class and relative error of the logits;
* time: one inference per round on each model in turn at each of ``--batches`` (1 and 8 by
  default), on the threads BLAS is given (``OPENBLAS_NUM_THREADS=1``: one thread; the runs
  use every core otherwise), with the load average before and after;
* ``--full-range-too``: on a host where the int8 GEMM takes weights within ±63 (AVX2 without
  VNNI, `engine.quantize.rewrite`), a second int8 model with full-range weights (±127, as
  other hosts quantize it), its agreement and time beside the first's.

Usage: python bench/int8_ptq.py [--size 224] [--images 256] [--mode naive] [--rounds 5]
       [--batches 1,8] [--full-range-too]
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
from bench import nets  # noqa: E402
from engine.cpu import spin_pool  # noqa: E402
from engine.quantize import rewrite  # noqa: E402


def load_int8(symbol: object, params: dict, calibration: np.ndarray, mode: str,
              full_range: bool) -> object:
    """The int8 model; ``full_range``: its weights within ±127 whatever the host's GEMM."""
    narrow_here = rewrite.narrow_weights_here
    if full_range:
        rewrite.narrow_weights_here = lambda: False
    try:
        return engine.load_model(symbol, params, precision="int8",
                                 calibration={"data": calibration},
                                 calibration_settings={"mode": mode})
    finally:
        rewrite.narrow_weights_here = narrow_here


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--calibration", type=int, default=32)
    parser.add_argument("--mode", choices=("naive", "entropy"), default="naive")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", default="1,8",
                        help="batch sizes to time, comma-separated")
    parser.add_argument("--full-range-too", action="store_true",
                        help="also an int8 model with full-range weights (±127)")
    args = parser.parse_args()
    symbol = nets.resnet18_v1()
    params = nets.random_params(symbol, (1, 3, args.size, args.size))
    rng = np.random.default_rng(36)
    shape = (3, args.size, args.size)
    calibration = rng.standard_normal((args.calibration, *shape)).astype(np.float32)
    fp32 = engine.load_model(symbol, params)
    models = {"fp32": fp32}
    variants = [("int8", False)] + ([("int8 ±127", True)] if args.full_range_too else [])
    for name, full_range in variants:
        started = time.perf_counter()
        models[name] = model = load_int8(symbol, params, calibration, args.mode, full_range)
        print(f"{name} load with {args.mode} calibration on {args.calibration} images: "
              f"{time.perf_counter() - started:.1f} s; convolutions with weights within "
              f"±63: {rewrite.narrowed_layers(model.run_graph)}")
    test_seed = rng.bit_generator.state
    for name, _ in variants:
        rng.bit_generator.state = test_seed  # each model on the same images
        agree, worst = [], 0.0
        for start in range(0, args.images, 32):
            images = rng.standard_normal((min(32, args.images - start), *shape)).astype(
                np.float32)
            want = fp32.infer({"data": images})["output_output"]
            got = models[name].infer({"data": images})["output_output"]
            agree.extend(got.argmax(axis=1) == want.argmax(axis=1))
            worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
        print(f"{name}: top-1 agreement over {len(agree)} images: {np.mean(agree):.1%}; "
              f"largest relative error of the logits {worst:.3g}")
    print(f"threads: {spin_pool.threads()} (cores {spin_pool.cores()}); load average "
          f"{' '.join(f'{value:.2f}' for value in os.getloadavg())}")
    for batch in (int(value) for value in args.batches.split(",")):
        feed = {"data": rng.standard_normal((batch, *shape)).astype(np.float32)}
        times: dict[str, list[float]] = {name: [] for name in models}
        for model in models.values():
            for _ in range(8):  # compile, and let the plan time its runs armed and alone
                model.infer(feed)
        for _ in range(args.rounds):
            for name, model in models.items():
                begin = time.perf_counter()
                model.infer(feed)
                times[name].append(time.perf_counter() - begin)
        medians = {name: statistics.median(times[name]) * 1e3 for name in models}
        print(f"batch {batch}: " + ", ".join(
            f"{name} {ms:.1f} ms" + ("" if name == "fp32" else
                                     f" (÷ fp32 {ms / medians['fp32']:.2f})")
            for name, ms in medians.items()) + f"; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
