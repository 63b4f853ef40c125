"""Benchmark: our GEMM kernel against numpy's OpenBLAS and ONNX Runtime's MLAS, one thread.

The shapes are the products the benchmark networks run at batch 1 and 64 (the seed MLP's
dense layers, ResNet-18's strided and Winograd products, MobileNet v2's 1×1 convolutions).
Each row times ``C (M×N) = A (M×K) @ B (K×N)`` warm (operands in cache, best of many):

* ours: `gemm_kernel` as plans bind it, A packed once (a weight);
* OpenBLAS: ``np.matmul`` into a preallocated C;
* MLAS: a one-node ONNX graph (a FullyConnected without bias, exported by `engine.onnx`:
  ``Gemm`` with B as an initializer, which ONNX Runtime pre-packs at session creation).

Usage: python bench/gemm.py [--repeat N]   (needs onnxruntime in the benchmark's environment)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's engine

from engine import sym  # noqa: E402
from engine.kernels import gemm_bind, gemm_kernel  # noqa: E402

# (M, K, N, where it comes from)
SHAPES = (
    (64, 512, 256, "seed MLP, batch 64, first layer"),
    (64, 256, 128, "seed MLP, batch 64, second layer"),
    (128, 576, 784, "ResNet-18 stride-2 3×3, 64→128 at 28²"),
    (512, 4608, 49, "ResNet-18 3×3, 512 at 7², im2col"),
    (64, 147, 1792, "ResNet-18 stem, one band of 16 rows"),
    (16, 512, 512, "ResNet-18 Winograd product, 512 at 7²"),
    (49, 256, 256, "ResNet-18 Winograd product, 256 at 14²"),
    (144, 24, 3136, "MobileNet v2 expansion 24→144 at 56²"),
    (24, 144, 3136, "MobileNet v2 projection 144→24 at 56²"),
    (576, 96, 196, "MobileNet v2 expansion 96→576 at 14²"),
    (960, 160, 49, "MobileNet v2 expansion 160→960 at 7²"),
)


def best(action: Callable[[], object], repeat: int) -> float:
    """Best seconds of ``repeat`` calls after one warm-up call."""
    action()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def mlas_product(a: np.ndarray, b: np.ndarray) -> Callable[[], object]:
    """ONNX Runtime running ``a @ b`` with ``b`` an initializer, on one thread."""
    import onnxruntime

    from engine.onnx import export

    rows, depth = a.shape
    symbol = sym.FullyConnected(sym.var("data"), num_hidden=b.shape[1], no_bias=True,
                                name="product")
    with tempfile.TemporaryDirectory() as folder:
        path = export((symbol, {"product_weight": np.ascontiguousarray(b.T)}),
                      Path(folder) / "product.onnx", input_shapes={"data": (rows, depth)})
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        session = onnxruntime.InferenceSession(str(path), options,
                                               providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: a}
    return lambda: session.run(None, feed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    options = parser.parse_args()
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")
    print(f"tile {gemm_kernel.tile()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'M×K×N':>16}  {'ours µs':>9} {'OpenBLAS':>9} {'MLAS':>9}  {'ours GF/s':>8} "
          f"{'OpenBLAS':>8} {'MLAS':>8}  ours/MLAS  shape")
    rng = np.random.default_rng(0)
    for rows, depth, columns, label in SHAPES:
        a = rng.standard_normal((rows, depth), dtype=np.float32)
        b = rng.standard_normal((depth, columns), dtype=np.float32)
        times = [best(action, options.repeat) for action in products(a, b)]
        flops = 2 * rows * depth * columns
        rates = " ".join(f"{flops / seconds / 1e9:>8.1f}" for seconds in times)
        print(f"{rows:>4}×{depth:>4}×{columns:>5}  " + " ".join(f"{t * 1e6:>9.1f}" for t in times)
              + f"  {rates}  {times[0] / times[2]:>8.2f}×  {label}")


def products(a: np.ndarray, b: np.ndarray) -> list[Callable[[], object]]:
    """``a @ b`` by ours (A packed once, the loop order a plan's weight product takes), by
    OpenBLAS and by MLAS."""
    c = np.empty((a.shape[0], b.shape[1]), np.float32)
    ours = gemm_kernel.bind_packed(gemm_kernel.pack(a), b, c,
                                   columns_outside=gemm_bind.streams_right(*b.shape))
    return [ours, lambda: np.matmul(a, b, c), mlas_product(a, b)]

if __name__ == "__main__":
    main()
