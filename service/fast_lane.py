"""`FastLane`: the per-inference routes served straight from ASGI, past FastAPI's machinery.

Profiling the server under load (seed MLP through ``/predict``, 64 connections) put half of the
event loop's time in FastAPI and Starlette around each request — middleware layers, route
matching, dependency solving, response classes — and only a fifth in the handler itself. The
routes a client calls per inference are therefore answered here, before that stack: ``POST
/predict``, ``POST /v2/models/{name}[/versions/{v}]/infer``, and the two health probes (so the
HTTP floor stays the server's cheapest route). They call the same `InferenceService` and give
the same replies, errors, drain and body-limit behaviour as the FastAPI routes, which stay
declared for the OpenAPI schema; every other request goes on to the FastAPI app.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from service import codecs
from service.drain import SHUTTING_DOWN
from service.errors import NotReady, PayloadTooLarge, error_reply, error_response
from service.limits import declared_over, too_large
from service.responses import dumps
from service.routers.health import NOT_READY
from service.runtime import Runtime

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]
JSON = b"application/json"
BINARY = b"application/octet-stream"
LIVE = dumps({"live": True})
READY = dumps({"ready": True})


class ClientGone(Exception):
    """The client closed the connection before its request body arrived."""


class FastLane:
    """ASGI middleware answering the hot routes itself; anything else goes on to ``app``."""

    def __init__(self, app: ASGIApp, *, runtime: Runtime) -> None:
        self.app = app
        self.runtime = runtime
        self.inference = runtime.inference
        self.max_bytes = runtime.settings.max_request_bytes
        self._exact: dict[tuple[str, str], Handler] = {
            ("GET", "/v2/health/live"): self._live,
            ("GET", "/v2/health/ready"): self._ready,
            ("POST", "/predict"): self._predict,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a hot route, or pass the request on."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        handler = self._exact.get((scope["method"], scope["path"])) or self._v2_infer(scope)
        if handler is None:
            await self.app(scope, receive, send)
            return
        await self._guarded(handler, scope, receive, send)

    def _v2_infer(self, scope: Scope) -> Handler | None:
        """The V2 infer handler when the path is ``/v2/models/{name}[/versions/{v}]/infer``."""
        if scope["method"] != "POST" or not scope["path"].startswith("/v2/models/"):
            return None
        parts = scope["path"].split("/")
        if len(parts) == 5 and parts[4] == "infer" and parts[3]:
            scope["path_params"] = {"name": parts[3], "version": None}
        elif len(parts) == 7 and parts[4] == "versions" and parts[6] == "infer" and all(
                parts[3:6]):
            scope["path_params"] = {"name": parts[3], "version": parts[5]}
        else:
            return None
        return self._infer

    async def _guarded(self, handler: Handler, scope: Scope, receive: Receive,
                       send: Send) -> None:
        """Drain and errors as the FastAPI app handles them: JSON ``{"error"}`` replies."""
        drain = self.runtime.drain
        probe = handler in (self._live, self._ready)
        if drain.draining and not probe:
            await error_response(503, SHUTTING_DOWN, {"Retry-After": "1"})(scope, receive, send)
            return
        drain.in_flight += 1
        try:
            await handler(scope, receive, send)
        except ClientGone:
            return
        except Exception as error:  # noqa: BLE001 - every failure becomes a JSON error reply
            status, message, headers = error_reply(error, scope["method"], scope["path"])
            self.runtime.metrics.observe_error(status)
            await error_response(status, message, headers)(scope, receive, send)
        finally:
            drain.in_flight -= 1

    async def _live(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _reply(send, 200, LIVE, JSON)

    async def _ready(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.runtime.ready:
            raise NotReady(NOT_READY)
        await _reply(send, 200, READY, JSON)

    async def _predict(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await self._body(scope, receive)
        await _reply(send, 200, dumps(await self.inference.predict(body)), JSON)

    async def _infer(self, scope: Scope, receive: Receive, send: Send) -> None:
        length = codecs.header_length(_header(scope, b"inference-header-content-length"))
        body = await self._body(scope, receive)
        params = scope["path_params"]
        reply, header = await self.inference.infer_v2(params["name"], params["version"], body,
                                                      length)
        if header is None:
            await _reply(send, 200, reply, JSON)
        else:
            await _reply(send, 200, reply, BINARY,
                         [(b"inference-header-content-length", str(header).encode())])

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        """The request body, refused with 413 as soon as it is known to exceed the limit."""
        if declared_over(scope, self.max_bytes):
            raise PayloadTooLarge(too_large(self.max_bytes, "max_request_bytes"))
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise PayloadTooLarge(too_large(self.max_bytes, "max_request_bytes"))
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


async def _reply(send: Send, status: int, body: bytes, content_type: bytes,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type),
                            (b"content-length", str(len(body)).encode()), *(headers or ())]})
    await send({"type": "http.response.body", "body": body})
