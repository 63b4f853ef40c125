"""Prometheus metrics: request counts and latency here, batcher and memory figures read live.

One `Metrics` per process (`service.runtime.Runtime.metrics`): `InferenceService.run` counts the
requests of REST and gRPC alike, both count their error replies, and REST's ``GET /metrics``
renders it.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from engine.serving.errors import ServingError
from engine.serving.loaded import LoadedVersion, VersionState
from engine.serving.repository import ModelRepository
from engine.serving.stats import TIME_BUCKETS_S
from engine.serving.stats import Histogram as StatsHistogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LABELS = ("model", "version")


def _buckets(histogram: StatsHistogram) -> list[tuple[str, float]]:
    return [("+Inf" if bound == float("inf") else repr(float(bound)), count)
            for bound, count in histogram.cumulative()]


class RepositoryCollector(Collector):
    """Reads the repository's loaded versions at scrape time (no bookkeeping per request)."""

    def __init__(self, repository: ModelRepository) -> None:
        self.repository = repository

    def _loaded(self) -> list[LoadedVersion]:
        handles = []
        for row in self.repository.index():
            if row.state == VersionState.READY:
                try:
                    handles.append(self.repository.get(row.name, row.version))
                except ServingError:
                    continue  # unloaded between the index and the look-up
        return handles

    def collect(self) -> Iterator[Metric]:
        """One family per figure, one sample per loaded model version."""
        handles = self._loaded()
        loaded = GaugeMetricFamily("hybridserve_models_loaded", "Model versions loaded and ready")
        loaded.add_metric([], len(handles))
        memory = GaugeMetricFamily("hybridserve_model_memory_bytes",
                                   "Bytes accounted to a loaded model version", labels=LABELS)
        queue_depth = GaugeMetricFamily("hybridserve_queue_depth", "Requests waiting to be "
                                        "batched", labels=LABELS)
        # Autoscaling signals: work waiting and under way, and how long the oldest has waited
        # (read now, so an idle scrape shows 0 and a stuck queue an age that keeps growing).
        in_flight = GaugeMetricFamily("hybridserve_requests_in_flight", "Requests inside a "
                                      "model version: queued or computing (or waiting for "
                                      "their sequence's turn)", labels=LABELS)
        oldest = GaugeMetricFamily("hybridserve_queue_oldest_seconds", "Seconds the "
                                   "longest-waiting queued request has waited (0: none queued)",
                                   labels=LABELS)
        batches = CounterMetricFamily("hybridserve_batches", "Batches run", labels=LABELS)
        outcomes = CounterMetricFamily("hybridserve_batcher_requests", "Requests seen by the "
                                       "batcher, by outcome", labels=(*LABELS, "outcome"))
        families = {
            "queue": HistogramMetricFamily("hybridserve_queue_time_seconds",
                                           "Time a request waited in the batch queue",
                                           labels=LABELS),
            "compute": HistogramMetricFamily("hybridserve_compute_time_seconds",
                                             "Time one batch took to run", labels=LABELS),
            "rows": HistogramMetricFamily("hybridserve_batch_size",
                                          "Rows per batch run", labels=LABELS),
        }
        active = GaugeMetricFamily("hybridserve_sequences_active", "Sequences holding a place "
                                   "(a direct slot, an oldest candidate)", labels=LABELS)
        waiting = GaugeMetricFamily("hybridserve_sequences_waiting", "Sequence starts waiting "
                                    "for a place", labels=LABELS)
        sequences = CounterMetricFamily("hybridserve_sequences", "Sequences by event: started, "
                                        "ended (sequence_end), dropped_idle (past "
                                        "max_sequence_idle_microseconds)",
                                        labels=(*LABELS, "event"))
        for handle in handles:
            labels = [handle.name, str(handle.version)]
            if handle.sequences is not None:
                counts = handle.sequences.stats
                active.add_metric(labels, counts.active)
                waiting.add_metric(labels, counts.waiting)
                for event in ("started", "ended", "dropped_idle"):
                    sequences.add_metric([*labels, event], getattr(counts, event))
            stats = handle.batcher.stats.snapshot()
            memory.add_metric(labels, handle.memory().total)
            queue_depth.add_metric(labels, handle.batcher.queue_depth)
            in_flight.add_metric(labels, handle.in_flight)
            oldest.add_metric(labels, handle.batcher.oldest_wait_s())
            batches.add_metric(labels, stats.batches)
            for outcome in ("succeeded", "failed", "rejected", "timed_out", "cancelled"):
                outcomes.add_metric([*labels, outcome], getattr(stats, outcome))
            for key, histogram in (("queue", stats.queue_time_s), ("compute",
                                   stats.compute_time_s), ("rows", stats.batch_rows)):
                families[key].add_metric(labels, _buckets(histogram), histogram.total)
        yield from (loaded, memory, queue_depth, in_flight, oldest, batches, outcomes,
                    *families.values(), active, waiting, sequences)
        yield from self._control()

    def _control(self) -> Iterator[Metric]:
        """Loads, unloads and evictions per model (an eviction, to make room under the memory
        budget, is also an unload), and the budget's use."""
        counts = self.repository.counts
        for event, help_text in (("load", "Model versions loaded (uploads included)"),
                                 ("unload", "Model versions unloaded (evictions included)"),
                                 ("eviction", "Models unloaded to make room under the memory "
                                  "budget")):
            family = CounterMetricFamily(f"hybridserve_model_{event}s", help_text,
                                         labels=("model",))
            for name, count in sorted(counts.of(event).items()):
                family.add_metric([name], count)
            yield family
        budget = self.repository.memory_budget_bytes
        if budget is not None:
            family = GaugeMetricFamily("hybridserve_memory_budget_bytes",
                                       "The memory budget of loaded models")
            family.add_metric([], budget)
            yield family


class Metrics:
    """The registry of one process: request counters and latency plus the repository's
    figures."""

    def __init__(self, repository: ModelRepository) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("hybridserve_requests", "Inference requests by outcome",
                                (*LABELS, "outcome"), registry=self.registry)
        self.latency = Histogram("hybridserve_request_latency_seconds",
                                 "Inference time from queueing to outputs", LABELS,
                                 buckets=TIME_BUCKETS_S, registry=self.registry)
        self.http_errors = Counter("hybridserve_http_errors", "Error responses by status",
                                   ("status",), registry=self.registry)
        self.registry.register(RepositoryCollector(repository))
        self.in_flight = Gauge("hybridserve_http_requests_in_flight",
                               "HTTP requests inside the server (the /metrics scrape included)",
                               registry=self.registry)
        # One label look-up per model version, not per request (it was 4% of a /predict).
        self._series: dict[tuple[str, int], _RequestSeries] = {}

    def observe_request(self, model: str, version: int, ok: bool, seconds: float) -> None:
        """Count one inference request and record its latency."""
        series = self._series.get((model, version))
        if series is None:
            series = self._series[(model, version)] = _RequestSeries(self, model, version)
        if ok:
            series.success.inc()
            series.latency.observe(seconds)
        else:
            series.failure.inc()

    def observe_error(self, status: int) -> None:
        """Count one error response."""
        self.http_errors.labels(str(status)).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)


class _RequestSeries:
    """The request counters and latency histogram of one model version, labelled once."""

    def __init__(self, metrics: Metrics, model: str, version: int) -> None:
        labels = (model, str(version))
        self.success = metrics.requests.labels(*labels, "success")
        self.failure = metrics.requests.labels(*labels, "failure")
        self.latency = metrics.latency.labels(*labels)
