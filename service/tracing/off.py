"""The tracing hooks, and what they do while tracing is off: nothing.

`Tracing` is the interface of the tracer: `http` and `grpc` open a request's ``receive`` span,
`traced` makes a function (``decode``, ``encode``) a step of the request, `step` opens one
inline (``preprocess``), and `batch_observer` (handed to the repository's batchers) adds
``queue`` and ``compute``. This class is the tracer of a process that does not trace, and its
hooks are bound once, when the runtime and its fronts are made: `traced` returns the function
itself, the fronts add no ``receive`` hook (`enabled` is false), there is no batch observer
(the batchers keep no contexts), and `step` returns the shared `NO_SPAN` (only requests to a
model with an image pipeline reach it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from engine.serving.batcher import BatchRun

# (model name, version, finished batch): the repository's batchers call it once per batch.
BatchObserver = Callable[[str, int, BatchRun], None]
# The call's gRPC metadata, as ``ServicerContext.invocation_metadata`` gives it.
Metadata = Callable[[], Iterable[tuple[str, Any]] | None]
# What a step's result says of its request: (model name, version, rows).
About = Callable[[Any], tuple[str, int, int]]
Step = TypeVar("Step", bound=Callable[..., Any])


class Span(Protocol):
    """An open span: a context manager (the current span inside it)."""

    def __enter__(self) -> Span: ...

    def __exit__(self, *exc_info: object) -> None: ...

    def describe(self, model: str, version: int, rows: int) -> None:
        """Name the model version and batch size the request turned out to be for, on this
        span and on the request's ``receive`` span."""


class _NoSpan:
    """The span of a process that does not trace."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def describe(self, model: str, version: int, rows: int) -> None:
        return None


NO_SPAN = _NoSpan()


class Tracing:
    """Tracing switched off: every hook is a no-op. `service.tracing.otel` traces."""

    enabled = False
    batch_observer: BatchObserver | None = None

    def http(self, headers: Iterable[tuple[bytes, bytes]], method: str, path: str) -> Span:
        """The ``receive`` span of an HTTP request (its parent from the ``traceparent``
        header)."""
        return NO_SPAN

    def grpc(self, metadata: Metadata, method: str) -> Span:
        """The ``receive`` span of a gRPC request (its parent from ``traceparent`` metadata)."""
        return NO_SPAN

    def step(self, name: str) -> Span:
        """A span of one step of the current request (``preprocess``)."""
        return NO_SPAN

    def traced(self, name: str, function: Step, about: About | None = None) -> Step:
        """`function` as a step of the current request: each call in a span `name`, which
        `about` (given the result) names the model version and rows in. Off: `function`
        itself, so that a caller binds it once and its requests pay nothing."""
        return function

    def shutdown(self) -> None:
        """Send the spans still buffered and stop (nothing to do when off)."""
