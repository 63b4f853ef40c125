"""``_contrib_calibrate_entropy``: the threshold MXNet's entropy calibration picks from a
histogram, as its C++ op computes it (MXNet runs it while calibrating, not in an export).

For each symmetric window of bins around zero (at least ``num_quantized_bins`` wide), the
histogram clipped to the window (the outer mass folded into its end bins) is compared with
the same window merged into ``num_quantized_bins`` bins and spread back over its non-empty
bins; both are smoothed (empty bins get 0.0001) and their KL divergence taken. The window's
right edge with the least divergence is the threshold.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import parse_int
from engine.ops.dtypes import FLOAT32
from engine.ops.quantized import ranges
from engine.ops.registry import Attrs, OpDef, Param, register

F32 = np.float32
SMOOTHING = F32(0.0001)


def _smooth(values: np.ndarray) -> np.ndarray | None:
    """Empty bins take ``SMOOTHING`` from the others; None when nothing is left to take."""
    zeros = values == 0
    nonzero = int(values.size - zeros.sum())
    if not nonzero:
        return None
    taken = F32(SMOOTHING * F32(int(zeros.sum())) / F32(nonzero))
    if taken >= 1.0:
        return None
    return (values + np.where(zeros, SMOOTHING, -taken)).astype(np.float32)


def _total(values: np.ndarray) -> F32:
    """A float32 sum in order, one term after another, as C++'s ``std::accumulate`` adds."""
    return F32(np.cumsum(values, dtype=np.float32)[-1]) if values.size else F32(0)


def _divergence(p: np.ndarray, q: np.ndarray) -> F32:
    p = (p / _total(p)).astype(np.float32)
    q = (q / _total(q)).astype(np.float32)
    return _total((p * np.log(p / q)).astype(np.float32))


def _window_divergence(hist: np.ndarray, start: int, stop: int, bins: int) -> F32:
    sliced = hist[start:stop].astype(np.int64).astype(np.float32)
    sliced[0] = 0  # the window's first bin counts only in p's outer mass, as MXNet counts it
    p = sliced.copy()
    p[0] = _total(hist[:start + 1])
    p[-1] = _total(hist[stop - 1:])  # the window's last bin, then the mass beyond it
    merged = len(sliced) // bins
    quantized = np.cumsum(sliced[:bins * merged].reshape(bins, merged), axis=1,
                          dtype=np.float32)[:, -1]
    quantized[-1] += _total(sliced[bins * merged:])
    # Each quantized bin's mass spread evenly over its non-empty bins (the last quantized bin
    # also takes the remainder), in one pass over the window rather than a loop per bin.
    group = np.minimum(np.arange(len(sliced)) // merged, bins - 1)
    filled = np.bincount(group, weights=sliced != 0, minlength=bins).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(filled > 0, quantized / filled, 0).astype(np.float32)
    q = np.where((p != 0) & (filled[group] > 0), share[group], F32(0)).astype(np.float32)
    p_smooth, q_smooth = _smooth(p), _smooth(q)
    if p_smooth is None or q_smooth is None:
        return F32(np.inf)
    return _divergence(p_smooth, q_smooth)


def _kernel(xp: Any, attrs: Attrs, hist: Any, edges: Any) -> tuple[Any, Any]:
    hist, edges = np.asarray(hist, np.float32), np.asarray(edges, np.float32)
    bins = attrs.num_quantized_bins
    if hist.ndim != 1 or edges.shape != (hist.size + 1,) or hist.size < bins:
        raise ShapeError(f"_contrib_calibrate_entropy: hist {hist.shape} and hist_edges "
                         f"{edges.shape} must be (n,) and (n + 1,) with n >= "
                         f"num_quantized_bins={bins}")
    zero = hist.size // 2
    best = None
    for half in range(bins // 2, zero + 1):
        start, stop = zero - half, zero + half + 1
        divergence = _window_divergence(hist, start, stop, bins)
        if best is None or divergence < best[1]:
            best = (edges[stop], divergence)
    assert best is not None
    return ranges.range_pair(best[0], best[1])


CALIBRATE_ENTROPY = register(OpDef(
    name="_contrib_calibrate_entropy",
    params=(Param("num_quantized_bins", parse_int, 255),),
    inputs=("hist", "hist_edges"),
    outputs=("threshold", "divergence"),
    infer_shape=lambda attrs, shapes: (list(shapes), [(1,), (1,)]),
    infer_dtype=lambda attrs, dtypes: ([FLOAT32, FLOAT32], [FLOAT32, FLOAT32]),
    kernel=ranges.on_host(_kernel),
    uncapturable=ranges.ON_HOST,
    doc="The entropy-calibration threshold of a histogram and its KL divergence.",
))
