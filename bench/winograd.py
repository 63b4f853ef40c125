"""Benchmark: stride-1 3×3 convolutions bound as Winograd F(2×2, 3×3) against im2col + GEMM.

Usage: ``python bench/winograd.py [--threads 1] [--repeat 9]``. For ResNet-18's stride-1 3×3
layer shapes (pad 1) at batch 1 and 8 it binds both `engine.kernels.conv_bind` and
`engine.kernels.winograd_bind` (whatever `winograd_bind.applies` says) into their own workspaces and
prints per layer: ms per call of each (median of interleaved rounds), their ratio and the
outputs' max abs difference, and whether `winograd_bind.applies` picks Winograd there. Its
thresholds (`MIN_CHANNELS`, `MIN_TILES`) come from this table and from other shapes run the
same way (edit ``LAYERS``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from executor import interleaved  # noqa: E402 - the sibling module, found through the path

from engine.kernels import conv_bind, winograd_bind  # noqa: E402
from engine.kernels.workspace import Workspace  # noqa: E402

LAYERS = [(64, 56), (128, 28), (256, 14), (512, 7)]  # (channels = filters, height = width)
GEOMETRY = ((3, 3), (1, 1), (1, 1), (1, 1))


def bound(module: Any, data: np.ndarray, weight: np.ndarray, bias: np.ndarray,
          scratch: int) -> tuple[Callable[[], None], np.ndarray]:
    """A run of ``module.bind`` over its own workspace, and the output it writes."""
    out = np.empty_like(data, shape=(data.shape[0], weight.shape[0], *data.shape[2:]))
    calls = module.bind(np, data, weight, bias, out, GEOMETRY, Workspace(np, scratch))

    def run() -> None:
        for call in calls:
            call()

    return run, out


def bench_layer(channels: int, size: int, batch: int, repeat: int) -> str:
    """One table row: both binds of one layer shape."""
    rng = np.random.default_rng(0)
    data = rng.standard_normal((batch, channels, size, size), dtype=np.float32)
    weight = rng.standard_normal((channels, channels, 3, 3), dtype=np.float32) / (3 * channels)
    bias = rng.standard_normal(channels, dtype=np.float32)
    itemsize = data.itemsize
    im2col, reference = bound(conv_bind, data, weight, bias, conv_bind.scratch_bytes(
        data.shape, channels, (size, size), GEOMETRY, itemsize))
    winograd, result = bound(winograd_bind, data, weight, bias, winograd_bind.scratch_bytes(
        data.shape, channels, GEOMETRY, itemsize))
    times = interleaved({"im2col": im2col, "winograd": winograd}, repeat)
    ms = {name: median * 1e3 for name, (median, _) in times.items()}
    weight.flags.writeable = False
    used = "yes" if winograd_bind.applies(data.shape, weight, GEOMETRY) else "no"
    return (f"{channels:>4}×{size:<3}{batch:>6} {ms['im2col']:>10.3f} {ms['winograd']:>10.3f} "
            f"{ms['im2col'] / ms['winograd']:>8.2f}× {np.abs(result - reference).max():>10.1e}"
            f"   {used}")


def main() -> None:
    """Print the per-layer table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads (threadpoolctl)")
    parser.add_argument("--repeat", type=int, default=9, help="interleaved timed rounds")
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads, user_api="blas")
    print(f"numpy {np.__version__}, BLAS threads {args.threads}; ms per call, median of "
          f"{args.repeat} interleaved rounds; speed-up = im2col / winograd")
    print(f"{'layer':<8}{'batch':>6} {'im2col':>10} {'winograd':>10} {'speed-up':>9} "
          f"{'max|diff|':>10}   used")
    for batch in (1, 8):
        for channels, size in LAYERS:
            print(bench_layer(channels, size, batch, args.repeat), flush=True)


if __name__ == "__main__":
    main()
