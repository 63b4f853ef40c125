"""A tensor's calibrated range from the values it took on the calibration inputs.

``naive`` (MXNet's name for min/max) keeps the smallest and largest value seen. ``entropy``
keeps a histogram of the values over ``[-t, t]`` (``t`` the largest magnitude seen) and takes
the threshold whose int8 quantization loses the least information (the KL divergence search
of `engine.ops.quantized.calibrate`, MXNet's ``_contrib_calibrate_entropy``); a tensor that is
never negative (after a relu) is searched over twice the quantized bins, as it is stored in
uint8 over ``[0, t]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.ops.registry import get_op

MODES = ("naive", "entropy")
QUANTIZED_BINS = 255


@dataclass
class TensorStats:
    """What calibration saw of one tensor: its extremes, then (entropy) its histogram."""

    low: float = np.inf
    high: float = -np.inf
    histogram: np.ndarray | None = field(default=None, repr=False)

    def see_extremes(self, values: np.ndarray) -> None:
        """Widen the extremes by ``values``."""
        if values.size:
            self.low = min(self.low, float(values.min()))
            self.high = max(self.high, float(values.max()))

    @property
    def reach(self) -> float:
        """The largest magnitude seen."""
        return max(abs(self.low), abs(self.high))

    def see_histogram(self, values: np.ndarray, bins: int) -> None:
        """Add ``values`` to the histogram over ``[-reach, reach]`` (extremes seen first)."""
        reach = self.reach or 1.0
        counts, _ = np.histogram(values, bins=bins, range=(-reach, reach))
        self.histogram = counts if self.histogram is None else self.histogram + counts


def naive_range(stats: TensorStats) -> tuple[float, float]:
    """The extremes seen (MXNet's ``naive`` calibration)."""
    return _nonempty(stats.low, stats.high)


def entropy_range(stats: TensorStats) -> tuple[float, float]:
    """``(-t, t)``, or ``(0, t)`` for a tensor never negative, ``t`` the KL threshold."""
    assert stats.histogram is not None, "entropy_range needs the histogram"
    reach = stats.reach or 1.0
    edges = np.linspace(-reach, reach, stats.histogram.size + 1, dtype=np.float32)
    non_negative = stats.low >= 0
    bins = QUANTIZED_BINS * 2 + 1 if non_negative else QUANTIZED_BINS
    search = get_op("_contrib_calibrate_entropy")
    attrs = search.parse_attrs({"num_quantized_bins": str(bins)}, "entropy calibration")
    threshold, _ = search.kernel(np, attrs, stats.histogram.astype(np.float32), edges)
    limit = float(np.asarray(threshold).reshape(-1)[0])
    return _nonempty(0.0 if non_negative else -limit, limit)


def _nonempty(low: float, high: float) -> tuple[float, float]:
    """A range quantization can divide by: a tensor that was all zeros gets a tiny one."""
    if not np.isfinite(low) or not np.isfinite(high) or max(abs(low), abs(high)) == 0:
        return (0.0, 1e-6) if not np.isfinite(low) or low >= 0 else (-1e-6, 1e-6)
    return float(low), float(high)
