"""Tracing on: OpenTelemetry spans of inference requests, exported by the SDK.

Imported only when tracing is switched on (`service.tracing.from_environment`), so a process
that does not trace never loads OpenTelemetry's SDK (an optional extra, ``tracing``).

Each request is one trace, or joins the caller's when it sends a W3C ``traceparent`` (an HTTP
header, or gRPC metadata). Its spans:

- ``receive`` (server kind): the request from the front's first look to its answer;
- ``decode``: the body or protobuf read into arrays and checked against the model's config;
- ``preprocess``: images decoded and transformed, for an input with an image pipeline only;
- ``queue``: from entering the model's batcher to its batch being formed;
- ``compute``: the batch's run. A batch serves several requests, each in its own trace, so every
  request gets a ``compute`` span of its own with the shared batch's start and end, its size in
  rows and requests, and a batch number shared by the requests that ran together;
- ``encode``: the outputs postprocessed and written as the reply.

``queue`` and ``compute`` are made after the batch finishes, by the batcher's observer, from the
times it recorded, under the span that was current when the request was queued. A request the
sampler leaves out (``OTEL_TRACES_SAMPLER``) gets no step spans at all: with the standard
samplers they would be left out too, and making them is most of tracing's cost.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from engine.serving.batcher import BatchRun
from service.tracing.off import NO_SPAN, About, Metadata, Span, Step, Tracing

log = logging.getLogger(__name__)

SCOPE = "hybridserve"
# Span attributes: the model version, the batch, and the protocol that carried the request.
MODEL = "hybridserve.model.name"
VERSION = "hybridserve.model.version"
ROWS = "hybridserve.request.rows"
BATCH_SIZE = "hybridserve.batch.size"
BATCH_REQUESTS = "hybridserve.batch.requests"
BATCH_NUMBER = "hybridserve.batch.number"
PROTOCOL = "hybridserve.protocol"


class TracingConfigError(ValueError):
    """The ``OTEL_*`` variables ask for something this server cannot export with."""


# What the current request turned out to be for (model, version, rows), once decoded: the
# steps after ``decode`` start with these attributes.
_DESCRIBED: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("described")


class _OpenSpan:
    """A span made current while open; `describe` also names the request's ``receive`` span
    and the steps that follow."""

    __slots__ = ("_manager", "_span", "_request", "_token")

    def __init__(self, manager: Any, request: trace.Span | None = None) -> None:
        self._manager = manager
        self._request = request
        self._span: trace.Span | None = None
        self._token: contextvars.Token[dict[str, Any]] | None = None

    def __enter__(self) -> _OpenSpan:
        if self._request is None:  # a request's receive span: nothing described yet
            self._token = _DESCRIBED.set({})
        self._span = self._manager.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._manager.__exit__(*exc_info)
        if self._token is not None:
            _DESCRIBED.reset(self._token)

    def describe(self, model: str, version: int, rows: int) -> None:
        attributes = {MODEL: model, VERSION: version, ROWS: rows}
        _DESCRIBED.get({}).update(attributes)
        for span in (self._span, self._request):
            if span is not None:
                span.set_attributes(attributes)


class OpenTelemetryTracing(Tracing):
    """Spans of every inference request, made by `provider`'s tracer."""

    enabled = True

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(SCOPE)
        self._batches = itertools.count(1)
        self.batch_observer = self._observe

    def http(self, headers: Iterable[tuple[bytes, bytes]], method: str, path: str) -> Span:
        carrier = {key.decode("latin-1"): value.decode("latin-1") for key, value in headers}
        return self._receive(carrier, {PROTOCOL: "http", "http.request.method": method,
                                       "url.path": path})

    def grpc(self, metadata: Metadata, method: str) -> Span:
        carrier = {key: value for key, value in metadata() or () if isinstance(value, str)}
        return self._receive(carrier, {PROTOCOL: "grpc", "rpc.system": "grpc",
                                       "rpc.method": method})

    def _receive(self, carrier: Mapping[str, str], attributes: dict[str, Any]) -> Span:
        return _OpenSpan(self.tracer.start_as_current_span(
            "receive", context=propagate.extract(carrier), kind=SpanKind.SERVER,
            attributes=attributes))

    def step(self, name: str) -> Span:
        request = trace.get_current_span()
        if not request.is_recording():
            return NO_SPAN  # the request is not sampled: nor are its steps
        return _OpenSpan(self.tracer.start_as_current_span(name, attributes=_DESCRIBED.get({})),
                         request)

    def traced(self, name: str, function: Step, about: About | None = None) -> Step:
        @functools.wraps(function)
        def step(*args: Any, **kwargs: Any) -> Any:
            if not trace.get_current_span().is_recording():
                return function(*args, **kwargs)  # not sampled: no span to make
            with self.step(name) as span:
                result = function(*args, **kwargs)
                if about is not None:
                    span.describe(*about(result))
                return result

        return step  # type: ignore[return-value]

    def _observe(self, model: str, version: int, run: BatchRun) -> None:
        """The ``queue`` and ``compute`` spans of each request of a finished batch. Called by
        the batcher before it answers the requests: a failure here is logged, never raised
        into the batch."""
        try:
            self._batch_spans(model, version, run)
        except Exception:  # noqa: BLE001 - a tracing fault must not fail requests
            log.exception("could not record the spans of a batch of %s version %s",
                          model, version)

    def _batch_spans(self, model: str, version: int, run: BatchRun) -> None:
        # The batcher's times are `time.monotonic`; spans take nanoseconds since the epoch.
        offset = time.time_ns() - time.monotonic_ns()

        def epoch_ns(monotonic_s: float) -> int:
            return int(monotonic_s * 1e9) + offset

        started, finished = epoch_ns(run.started), epoch_ns(run.finished)
        batch = {MODEL: model, VERSION: version, BATCH_SIZE: sum(run.rows),
                 BATCH_REQUESTS: len(run.rows), BATCH_NUMBER: next(self._batches)}
        for context, enqueued, rows in zip(run.contexts, run.enqueued, run.rows):
            parent = _otel_context_of(context)
            if not trace.get_current_span(parent).is_recording():
                continue  # a request the sampler left out, or one queued outside a request
            queue = self.tracer.start_span("queue", parent, start_time=epoch_ns(enqueued),
                                           attributes={**batch, ROWS: rows})
            queue.end(started)
            compute = self.tracer.start_span("compute", parent, start_time=started,
                                             attributes={**batch, ROWS: rows})
            if run.error is not None:
                compute.record_exception(run.error)
                compute.set_status(Status(StatusCode.ERROR, str(run.error)))
            compute.end(finished)

    def shutdown(self) -> None:
        self.provider.shutdown()


def _otel_context_of(context: contextvars.Context) -> otel_context.Context:
    """OpenTelemetry's context as it was in `context` (a request's, copied when queued)."""
    return context.run(otel_context.get_current)


def from_environment(environ: Mapping[str, str] = os.environ) -> OpenTelemetryTracing:
    """Tracing configured by the ``OTEL_*`` variables: the exporters of
    ``OTEL_TRACES_EXPORTER`` (``otlp``, the default: OTLP over HTTP, to
    ``OTEL_EXPORTER_OTLP_ENDPOINT``; ``console``), each behind a `BatchSpanProcessor`
    (``OTEL_BSP_*``); the sampler of ``OTEL_TRACES_SAMPLER``; the resource of
    ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (service name ``hybridserve``
    unless they give one)."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: SCOPE}))
    provider = TracerProvider(resource=resource)
    for processor in _processors(environ):
        provider.add_span_processor(processor)
    return OpenTelemetryTracing(provider)


def _processors(environ: Mapping[str, str]) -> list[SpanProcessor]:
    names = [name.strip().lower() for name in
             environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if name.strip()]
    return [BatchSpanProcessor(_exporter(name, environ)) for name in names if name != "none"]


def _exporter(name: str, environ: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        raise TracingConfigError(f"OTEL_TRACES_EXPORTER names {name!r}; this server exports "
                                 "with 'otlp' (OTLP over HTTP) or 'console', or 'none'")
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                           environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"))
    if protocol != "http/protobuf":
        raise TracingConfigError(f"the OTLP protocol is {protocol!r} (OTEL_EXPORTER_OTLP_"
                                 "[TRACES_]PROTOCOL); this server sends OTLP over HTTP only: "
                                 "set it to 'http/protobuf' and point OTEL_EXPORTER_OTLP_"
                                 "ENDPOINT at the collector's HTTP port (4318)")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()
