"""Traces of inference requests through OpenTelemetry: optional, and off unless asked for.

Tracing is on when the server is started with ``--trace`` (``HYBRIDSERVE_TRACE``) or when
``OTEL_TRACES_EXPORTER`` names an exporter, and off whenever ``OTEL_SDK_DISABLED`` is true. The
rest is configured by the standard ``OTEL_*`` variables (`service.tracing.otel`). Off, the hooks
are those of `Tracing` itself, which do nothing, and OpenTelemetry's SDK is never imported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from service.tracing.off import NO_SPAN, BatchObserver, Span, Tracing

__all__ = ["NO_SPAN", "BatchObserver", "Span", "Tracing", "TracingUnavailable", "wanted",
           "from_environment"]
EXTRA = "pip install 'hybridserve[tracing]'"


class TracingUnavailable(RuntimeError):
    """Tracing was asked for, but cannot start (the extra is missing, or its variables are
    wrong)."""


def wanted(requested: bool, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether to trace: `requested` (``--trace``) or an exporter named in
    ``OTEL_TRACES_EXPORTER``, unless ``OTEL_SDK_DISABLED`` is true or the exporter is
    ``none``."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none":
        return False
    return requested or bool(exporters)


def from_environment(requested: bool, environ: Mapping[str, str] = os.environ) -> Tracing:
    """The process's tracing: off (`Tracing`), or OpenTelemetry's as the ``OTEL_*`` variables
    configure it.

    Raises:
        TracingUnavailable: tracing is wanted but the ``tracing`` extra is not installed, or
            the variables ask for an exporter or protocol this server does not have.
    """
    if not wanted(requested, environ):
        return Tracing()
    try:
        from service.tracing import otel
    except ImportError as error:
        raise TracingUnavailable(f"tracing is switched on (--trace or OTEL_TRACES_EXPORTER) but "
                                 f"OpenTelemetry's SDK cannot be imported ({error}); {EXTRA}"
                                 ) from None
    try:
        return otel.from_environment(environ)
    except otel.TracingConfigError as error:
        raise TracingUnavailable(str(error)) from None
