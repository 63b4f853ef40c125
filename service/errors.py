"""HTTP errors: every failure becomes JSON ``{"error": message}`` with one status per class."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

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
    Overloaded,
    TimedOut,
    VersionNotFound,
)
from service.responses import json_response

log = logging.getLogger(__name__)


class ServiceError(Exception):
    """An error found by the HTTP layer itself; `status` is its HTTP status."""

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


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """The JSON error body every failure gets."""
    return json_response({"error": message}, status=status, headers=headers)


def _retry_after(error: Exception) -> dict[str, str]:
    seconds = getattr(error, "retry_after", 1.0)
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def _count(request: Request, status: int) -> None:
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is not None:
        runtime.metrics.observe_error(status)


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
    """The reply the exception handlers below give `error`, for code outside FastAPI."""
    if isinstance(error, (ServiceError, EngineError)):
        return known_error_reply(error, method, path)
    return unexpected_error_reply(error, method, path)


async def handle_error(request: Request, error: Exception) -> Response:
    """Map an engine, serving or service error to its status, keeping its message."""
    status, message, headers = known_error_reply(error, request.method, request.url.path)
    _count(request, status)
    return error_response(status, message, headers)


async def handle_http(request: Request, error: Exception) -> Response:
    """Starlette's own errors (unknown route, wrong method) in the same JSON form."""
    assert isinstance(error, StarletteHTTPException)
    detail = error.detail if isinstance(error.detail, str) else str(error.detail)
    if error.status_code == 404:
        detail = f"no route {request.method} {request.url.path}"
    elif error.status_code == 405:
        detail = f"method {request.method} is not allowed on {request.url.path}"
    return error_response(error.status_code, detail, dict(error.headers or {}))


async def handle_validation(request: Request, error: Exception) -> Response:
    """Request parameters or form fields that do not fit the schema: 400, naming each field."""
    assert isinstance(error, RequestValidationError)
    _count(request, 400)
    problems = []
    for problem in error.errors():
        where = ".".join(str(part) for part in problem.get("loc", ()))
        problems.append(f"{where}: {problem.get('msg', 'invalid')}")
    return error_response(400, "invalid request: " + "; ".join(problems))


async def handle_too_deep(request: Request, error: Exception) -> Response:
    """A RecursionError: a body nested deeper than a parser reads (see
    `unexpected_error_reply`); registered of its own so that it is not a server error."""
    status, message, headers = unexpected_error_reply(error, request.method, request.url.path)
    _count(request, status)
    return error_response(status, message, headers)


async def handle_unexpected(request: Request, error: Exception) -> Response:
    """Anything else: 500 without internals, logged with its traceback."""
    status, message, headers = unexpected_error_reply(error, request.method, request.url.path)
    _count(request, status)
    return error_response(status, message, headers)


def install_handlers(app: FastAPI) -> None:
    """Register the handlers on `app`."""
    app.add_exception_handler(ServiceError, handle_error)
    app.add_exception_handler(EngineError, handle_error)
    app.add_exception_handler(StarletteHTTPException, handle_http)
    app.add_exception_handler(RequestValidationError, handle_validation)
    app.add_exception_handler(RecursionError, handle_too_deep)
    app.add_exception_handler(Exception, handle_unexpected)


Handler = Callable[[Request, Exception], Awaitable[Response]]


class ErrorReplies:
    """An exception from any route, or from the router (404, 405), answered by its handler in
    `handlers` (most specific class first), as `install_handlers` registers them.

    It stands where Starlette's ``ExceptionMiddleware`` would, inside the layer every request
    passes (`service.gate.Gate`), at a fraction of its cost per request (no ``Request`` object
    and no wrapped ``send`` unless something failed), and hands the same handlers to FastAPI's
    routes, which answer their own errors with them. Routes fail before their reply begins
    (FastAPI's answer their errors themselves, the ASGI routes send last); should one fail
    after, the server refuses the second reply and logs both errors.
    """

    def __init__(self, handlers: Mapping[Any, Handler]) -> None:
        self.handlers = {key: value for key, value in handlers.items()
                         if isinstance(key, type)}
        # Where FastAPI's routes look for handlers: (by exception class, by status code).
        self.scope_handlers = (self.handlers, {})

    async def answer(self, error: Exception, scope: Scope, receive: Receive,
                     send: Send) -> None:
        """Send the reply of `error`'s handler; re-raise `error` when none handles it."""
        handler = next((self.handlers[cls] for cls in type(error).__mro__
                        if cls in self.handlers), None)
        if handler is None:
            raise error
        response = await handler(Request(scope, receive), error)
        await response(scope, receive, send)
