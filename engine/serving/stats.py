"""Counters and histograms a batcher keeps for the metrics endpoint (no Prometheus import here)."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

# Bucket upper bounds, Prometheus style (a value v falls into the first bucket with v <= bound).
TIME_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                  0.5, 1.0, 2.5, 5.0, 10.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass
class Histogram:
    """A fixed-bucket histogram: per-bucket counts (the last one is +Inf), sum and count."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        """Record one value."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, count of values <= bound) pairs ending with (inf, count)."""
        pairs, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            running += count
            pairs.append((bound, running))
        return pairs

    @property
    def mean(self) -> float:
        """Mean of the recorded values (0 when there are none)."""
        return self.total / self.count if self.count else 0.0

    def copy(self) -> Histogram:
        """An independent copy."""
        return Histogram(self.bounds, list(self.counts), self.total, self.count)


@dataclass
class BatcherStats:
    """What one `DynamicBatcher` has done so far; read by the service's metrics endpoint."""

    requests: int = 0       # accepted into the queue
    rows: int = 0           # rows of accepted requests
    succeeded: int = 0      # requests answered with outputs
    failed: int = 0         # requests whose batch raised
    rejected: int = 0       # refused because the queue was full (`Overloaded`)
    timed_out: int = 0      # deadline passed (`TimedOut`)
    cancelled: int = 0      # caller went away before its result was ready
    batches: int = 0        # batches run (successful or not)
    queue_time_s: Histogram = field(default_factory=lambda: Histogram(TIME_BUCKETS_S))
    compute_time_s: Histogram = field(default_factory=lambda: Histogram(TIME_BUCKETS_S))
    batch_rows: Histogram = field(default_factory=lambda: Histogram(SIZE_BUCKETS))
    batch_requests: Histogram = field(default_factory=lambda: Histogram(SIZE_BUCKETS))

    def snapshot(self) -> BatcherStats:
        """A consistent copy, safe to read while the batcher goes on."""
        return BatcherStats(
            self.requests, self.rows, self.succeeded, self.failed, self.rejected,
            self.timed_out, self.cancelled, self.batches, self.queue_time_s.copy(),
            self.compute_time_s.copy(), self.batch_rows.copy(), self.batch_requests.copy())
