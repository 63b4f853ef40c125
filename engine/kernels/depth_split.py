"""A product over column panels cut along K where its left operand would not stay in L2.

`gemm_kernel.bind_packed_columns` walks B's column panels outside: each panel meets every row
of A, so A is read once per panel and must stay in the core's L2 for the product to run at the
tile's speed. The products `gemm_bind._transposed` runs have a few rows (a 7² layer's 49
positions) and a deep K: A is 49 × K floats, 392 KB at K 2048. On a host with 512 KB of L2 a
core (AMD Zen 3), A and a panel no longer fit, and A comes from L3 for every panel. Cut in
runs of K whose share of A fits half the L2, each run's product adds the one before it as a
residual, the last taking the epilogue (bias, clamp) after the sum. One thread, Zen 3, weights
evicted and A freshly written before each call (best of 30): 49×2048×512 (ResNet-50 v2's
7² layers over 2048 channels) 2.0 → 1.44 ms in two runs; 49×4608×512 (its 3×3 stride-2
layer at 7², im2col) 5.2 → 3.3 in four (three runs of 294 KB each: 4.5); 49×2304×512
(ResNet-18's) 2.1 → 1.46 in two; 49×1152×256 (A 220 KB) 0.38 whole, 0.39 in two.

Hosts with AVX-512 keep the whole product (measured there with A in a larger L2: their
choices stay as they were), as do hosts whose L2 size cannot be read.
"""

from __future__ import annotations

from typing import Any

from engine.cpu import cache_sizes, host_features
from engine.kernels import gemm_kernel

# A run's share of A fits this part of L2: the rest holds B's panel, C's tile and what the
# prefetchers bring. At a third of it (4608 in three runs) the product ran 1.37× slower.
L2_SHARE = 0.5
# Runs start at multiples of this many K steps (a cache line of A's rows where K is inner).
STEP = 16


def runs(rows: int, depth: int, l2_bytes: int | None = None,
         avx512: bool | None = None) -> list[tuple[int, int]]:
    """The runs (first, end) of K a product of ``rows`` rows of A over ``depth`` is cut in:
    one, the whole, where A (float32) fits `L2_SHARE` of the L2, on AVX-512 hosts and where
    the L2 is unknown. ``l2_bytes`` and ``avx512``: the host's, read where not given."""
    l2 = cache_sizes.l2_bytes() if l2_bytes is None else l2_bytes
    wide = host_features.has("avx512f") if avx512 is None else avx512
    if wide or not l2:
        return [(0, depth)]
    count = -(-rows * depth * 4 // int(l2 * L2_SHARE))
    count = max(1, min(count, depth // STEP))
    edges = [index * depth // count // STEP * STEP for index in range(count)] + [depth]
    return list(zip(edges[:-1], edges[1:]))


class DepthSplit:
    """A product run as products over runs of K in turn (`runs`), each adding the one before
    it (two buffers taken in turn, the last run writing C). Like a `gemm_kernel.Product` it
    takes an epilogue (`with_epilogue`): the last run's, after the sum of every run."""

    def __init__(self, parts: tuple[gemm_kernel.Product, ...]) -> None:
        self.parts = parts

    def __call__(self) -> None:
        for part in self.parts:
            part()

    def with_epilogue(self, bias_rows: Any = None, bias_columns: Any = None,
                      low: float = float("-inf"), high: float = float("inf")) -> DepthSplit:
        """This product adding a bias per row and/or column, clamped to [low, high]."""
        last = self.parts[-1].with_epilogue(bias_rows, bias_columns, low, high)
        return DepthSplit((*self.parts[:-1], last))


def bind(a: Any, panels: Any, frame: Any, spare: Any, columns: int,
         depths: list[tuple[int, int]]) -> gemm_kernel.Product | DepthSplit:
    """``c = a @ b`` with ``panels = gemm_kernel.pack_columns(b)`` and C the first
    ``columns`` of each row of ``frame`` (C-contiguous float32, rows as many as A's), over
    ``depths`` (`runs`): one product where it is one run, else a `DepthSplit` whose runs
    before the last write into ``frame`` and ``spare`` (``frame``'s shape, overlapping no
    operand) in turn."""
    if len(depths) == 1:
        return gemm_kernel.bind_packed_columns(a, panels, frame[:, :columns])
    # Counted back from the last run, which writes C: the one before it writes the spare.
    frames = [frame if (len(depths) - 1 - index) % 2 == 0 else spare
              for index in range(len(depths))]
    parts = []
    for index, (run, target) in enumerate(zip(depths, frames)):
        part = gemm_kernel.bind_packed_columns(a, panels, target[:, :columns], depths=run)
        if index:
            part = part.with_residual(target, frames[index - 1])
        parts.append(part)
    return DepthSplit(tuple(parts))
