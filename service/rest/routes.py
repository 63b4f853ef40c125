"""The two kinds of route in the app's one router: `AsgiRoute` for the hot routes, whose
endpoints speak ASGI, and `FileStackRoute`, FastAPI's route, for every other; and `Router`,
the router as requests reach it.

Profiling the server under load (seed MLP through ``/predict``, 64 connections) put half of the
event loop's time in FastAPI's per-route machinery — dependency solving, the ``Request`` object,
response classes — and only a fifth in the handler itself. The routes a client calls per
inference (``/predict``, V2 infer) and the health probes are therefore plain ASGI endpoints,
registered in the same Starlette router as every other route and so behind the same drain,
body limit and error replies (`service.rest.gate.Gate`). FastAPI cannot see into them: each
carries its OpenAPI operation, which `service.rest.openapi` adds to the document.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

from fastapi.routing import APIRoute, APIRouter
from starlette.convertors import StringConvertor
from starlette.routing import Match, Route
from starlette.types import Receive, Scope, Send

from service.runtime import Runtime

Endpoint = Callable[[Scope, Receive, Send], Awaitable[None]]
JSON = b"application/json"
BINARY = b"application/octet-stream"


def route_path(scope: Scope) -> str:
    """The request's path below the app's root path (``uvicorn --root-path``), as Starlette's
    router matches it: the path as it is when it does not lie under the root path."""
    path: str = scope["path"]
    root_path: str = scope.get("root_path", "")
    if not root_path or not path.startswith(root_path):
        return path
    if path == root_path:
        return ""
    return path[len(root_path):] if path[len(root_path)] == "/" else path


class AsgiRoute(Route):
    """A route answered by ``endpoint(scope, receive, send)``, with its OpenAPI operation."""

    def __init__(self, path: str, endpoint: Endpoint, *, method: str,
                 operation: dict[str, Any]) -> None:
        super().__init__(path, endpoint, methods=[method], include_in_schema=False)
        self.app = endpoint  # called as it is: no request/response adapter around it
        self.methods = {method}  # as FastAPI's routes: no implicit HEAD beside a GET
        self.method = method
        # FastAPI's id for a route of this name, path and method: unique per route.
        operation_id = re.sub(r"\W", "_", f"{self.name}{self.path_format}")
        self.operation = {**operation, "operationId": f"{operation_id}_{method.lower()}"}

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        """Starlette's match; a path without parameters by plain comparison, no pattern."""
        if self.param_convertors or scope["type"] != "http":
            return super().matches(scope)
        path = route_path(scope) if scope.get("root_path") else scope["path"]
        if path != self.path:
            return Match.NONE, {}
        child = {"endpoint": self.endpoint, "path_params": {}}
        return (Match.FULL if scope["method"] in self.methods else Match.PARTIAL), child


class Router:
    """The app's one router as requests reach it: its ASGI routes looked up first, a fixed
    path in a dictionary and a path with parameters by its pattern alone, then, for every other
    request, the router's own scan of all its routes (FastAPI's routes, 404 and 405).

    A lookup finds what the scan would: the ASGI routes come first in the router, and a
    request the lookup does not answer (another method, a root path) goes to the scan. It
    saves the hot routes the scan's per-route calls and FastAPI's per-request hooks (form
    limits, telemetry), which serve only its own routes. Built from the router's routes when
    the app's stack is built, on its first request, as Starlette builds its stack.
    """

    def __init__(self, router: APIRouter) -> None:
        self.scan = router.app
        # By method, then path: no tuple made per request.
        self.fixed: dict[str, dict[str, AsgiRoute]] = {}
        self.patterned: dict[str, list[AsgiRoute]] = {}
        for route in router.routes:
            if not isinstance(route, AsgiRoute) or not all(
                    isinstance(convertor, StringConvertor)
                    for convertor in route.param_convertors.values()):
                break  # the scan finds this route and those after it
            patterns = self.patterned.setdefault(route.method, [])
            if route.param_convertors:
                patterns.append(route)
            elif not any(earlier.path_regex.match(route.path) for earlier in patterns):
                self.fixed.setdefault(route.method, {}).setdefault(route.path, route)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Call the ASGI route for this request, or scan the router."""
        route = None if scope["type"] != "http" or scope.get("root_path") else self.find(scope)
        if route is None:
            await self.scan(scope, receive, send)
            return
        scope["route"] = route
        await route.app(scope, receive, send)

    def find(self, scope: Scope) -> AsgiRoute | None:
        """The ASGI route of this method and path, with ``path_params`` set in `scope`."""
        method, path = scope["method"], scope["path"]
        route = self.fixed.get(method, {}).get(path)
        if route is not None:
            scope["path_params"] = {}
            return route
        for route in self.patterned.get(method, ()):
            match = route.path_regex.match(path)
            if match is not None:
                scope["path_params"] = match.groupdict()
                return route
        return None


class FileStackRoute(APIRoute):
    """FastAPI's route, opening the stack its handlers close uploaded files on.

    FastAPI opens that stack in a layer around its whole router (``AsyncExitStackMiddleware``),
    which would cost every request, the hot routes' too, 3 µs; the routes that use it open it
    themselves. Every ``APIRouter`` of the app is made with ``route_class=FileStackRoute``.
    """

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the route with its file stack in the scope, closed once it has answered."""
        async with AsyncExitStack() as stack:
            scope["fastapi_middleware_astack"] = stack
            await super().handle(scope, receive, send)


def runtime_of(scope: Scope) -> Runtime:
    """The runtime of the app serving this request (`service.rest.app.HybridServeApp.runtime`)."""
    runtime: Runtime = scope["app"].runtime
    return runtime


def header(scope: Scope, name: bytes) -> str | None:
    """A request header's value (`name` in lower case), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


async def read_body(receive: Receive) -> bytes | None:
    """The request body, as `service.rest.limits.BodyLimit` passes it on (inflated, within its size
    and time limits); None when the client went away before sending it all."""
    message = await receive()
    if message["type"] == "http.disconnect":
        return None
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):  # the usual request: one message
        return body
    chunks = [body]
    while message.get("more_body", False):
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
    return b"".join(chunks)


async def reply(send: Send, body: bytes, content_type: bytes = JSON,
                headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """A 200 response with `body` (compressed on the way out by `BodyLimit` when asked)."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", content_type),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})
