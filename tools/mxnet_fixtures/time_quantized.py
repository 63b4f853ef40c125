"""MXNet 1.9.1's own time for the int8 exports under tests/fixtures/mxnet_quantized (its oneDNN
int8 kernels, batch 2, the fixture's input): the reference `bench/int8.py`'s times are read
against. Median and best of many forward passes, outputs copied to NumPy as a caller would.

Usage: python tools/mxnet_fixtures/time_quantized.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import mxnet as mx
import numpy as np

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "mxnet_quantized"
MODELS = ("resnet18_v1_naive", "resnet50_v1_thin_entropy", "mobilenet_v2_naive",
          "bert_encoder_naive")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    print(f"{'model':28} {'median ms':>9} {'best ms':>8}")
    for name in MODELS:
        folder = FIXTURES / name
        net = mx.gluon.SymbolBlock.imports(str(folder / f"{name}-symbol.json"), ["data"],
                                           str(folder / f"{name}-0000.params"), ctx=mx.cpu())
        data = mx.nd.array(np.load(folder / "io.npz")["data"])
        for _ in range(5):
            net(data).asnumpy()
        times = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            net(data).asnumpy()
            times.append(time.perf_counter() - start)
        print(f"{name:28} {statistics.median(times) * 1e3:9.2f} {min(times) * 1e3:8.2f}")


if __name__ == "__main__":
    main()
