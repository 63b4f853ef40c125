"""HTTP error replies: every failure becomes JSON ``{"error": message}`` with its status.

The status and message are `service.errors`' (one table for REST and gRPC); here they become
responses, through FastAPI's exception handlers and `ErrorReplies`, which answers for every
route inside the layer every request passes (`service.rest.gate.Gate`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from service.errors import error_reply
from service.rest.responses import json_response


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """The JSON error body every failure gets."""
    return json_response({"error": message}, status=status, headers=headers)


def _count(request: Request, status: int) -> None:
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is not None:
        runtime.metrics.observe_error(status)


async def handle_error(request: Request, error: Exception) -> Response:
    """An engine, serving or service error with its status and message; a RecursionError (a
    body nested deeper than a parser reads) as 400; anything else as 500 without internals,
    logged with its traceback (`service.errors.error_reply`)."""
    status, message, headers = error_reply(error, request.method, request.url.path)
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


def install_handlers(app: FastAPI) -> None:
    """Register the handlers on `app`: Starlette's and FastAPI's own errors by theirs, every
    other exception (engine, serving and service errors, anything unforeseen) by
    `handle_error`."""
    app.add_exception_handler(StarletteHTTPException, handle_http)
    app.add_exception_handler(RequestValidationError, handle_validation)
    app.add_exception_handler(Exception, handle_error)


Handler = Callable[[Request, Exception], Awaitable[Response]]


class ErrorReplies:
    """An exception from any route, or from the router (404, 405), answered by its handler in
    `handlers` (most specific class first), as `install_handlers` registers them.

    It stands where Starlette's ``ExceptionMiddleware`` would, inside the layer every request
    passes (`service.rest.gate.Gate`), at a fraction of its cost per request (no ``Request`` object
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
