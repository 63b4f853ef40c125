"""Errors: the service's own error classes, and the one table from error class to status.

Every failure has an HTTP status (`status_of`: a `ServiceError`'s own, or the engine error's in
`STATUS`) and a message; REST answers with both (`service.rest.errors`), gRPC with the code of
that status and the same message (`service.grpc.status`).
"""

from __future__ import annotations

import logging
import math

from engine.errors import (
    EngineError,
    ExecutionError,
    InputError,
    ModelFormatError,
    ShapeError,
)
from engine.serving.errors import (
    Conflict,
    InvalidModel,
    InvalidName,
    MemoryBudgetExceeded,
    ModelNotFound,
    ModelNotReady,
    ModelNotServing,
    Overloaded,
    TimedOut,
    VersionNotFound,
)

log = logging.getLogger(__name__)


class ServiceError(Exception):
    """An error found by the service itself; `status` is its HTTP status."""

    status = 500

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = headers or {}


class BadRequest(ServiceError):
    """The request is malformed: not JSON, a bad tensor, an unknown input or output."""

    status = 400


class Unauthorized(ServiceError):
    """No bearer token, or not in the form ``Authorization: Bearer <token>``."""

    status = 401


class Forbidden(ServiceError):
    """The token is wrong, or management is disabled because no token is configured."""

    status = 403


class NotFound(ServiceError):
    """No such route or resource."""

    status = 404


class RequestTimeout(ServiceError):
    """The request body did not arrive within ``body_timeout`` seconds."""

    status = 408


class PayloadTooLarge(ServiceError):
    """The body or one tensor is over its configured limit."""

    status = 413


class UnsupportedMediaType(ServiceError):
    """The body is compressed with a Content-Encoding this server does not read."""

    status = 415


class NotReady(ServiceError):
    """The server is still starting or already stopping."""

    status = 503


# Engine and serving errors, most specific first; the first class in an error's MRO wins.
STATUS: dict[type[Exception], int] = {
    InvalidName: 400,
    ModelNotFound: 404,
    VersionNotFound: 404,
    Conflict: 409,
    MemoryBudgetExceeded: 409,
    InvalidModel: 422,
    ModelNotServing: 400,  # as Triton answers; Retry-After would promise what retrying lacks
    ModelNotReady: 503,
    Overloaded: 503,
    TimedOut: 504,
    InputError: 400,
    ShapeError: 422,
    ModelFormatError: 422,
    ExecutionError: 500,
    EngineError: 500,
}


def status_of(error: Exception) -> int:
    """The HTTP status of an engine, serving or service error."""
    if isinstance(error, ServiceError):
        return error.status
    for cls in type(error).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def _retry_after(error: Exception) -> dict[str, str]:
    seconds = getattr(error, "retry_after", 1.0)
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def known_error_reply(error: Exception, method: str, path: str) -> tuple[int, str, dict]:
    """Status, message and headers for an engine, serving or service error (logs 5xx)."""
    status = status_of(error)
    headers = dict(error.headers) if isinstance(error, ServiceError) else {}
    if status == 503 and "Retry-After" not in headers:
        headers.update(_retry_after(error))
    if status >= 500 and status not in (503, 504):
        log.error("%s %s failed", method, path, exc_info=error)
    return status, str(error), headers


def unexpected_error_reply(error: Exception, method: str, path: str) -> tuple[int, str, dict]:
    """500 without internals for any other exception, logged with its traceback; 400 for a
    RecursionError, which only a body nested past a parser's depth (a config.json a thousand
    arrays deep, say) raises while a request is decoded."""
    if isinstance(error, RecursionError):
        return 400, f"the request nests values too deeply to be read: {error}", {}
    log.error("%s %s failed unexpectedly", method, path, exc_info=error)
    return 500, f"internal error ({type(error).__name__}); see the server log", {}


def error_reply(error: Exception, method: str, path: str) -> tuple[int, str, dict]:
    """Status, message and headers of any exception, as REST's exception handlers answer it
    (`service.rest.errors`) and gRPC translates it (`service.grpc.status`)."""
    if isinstance(error, (ServiceError, EngineError)):
        return known_error_reply(error, method, path)
    return unexpected_error_reply(error, method, path)
