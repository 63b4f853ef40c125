"""`FastLane`: the per-inference routes served straight from ASGI, past FastAPI's machinery.

Profiling the server under load (seed MLP through ``/predict``, 64 connections) put half of the
event loop's time in FastAPI and Starlette around each request — middleware layers, route
matching, dependency solving, response classes — and only a fifth in the handler itself. The
routes a client calls per inference are therefore answered here, before that stack: ``POST
/predict``, ``POST /v2/models/{name}[/versions/{v}]/infer``, and the two health probes (so the
HTTP floor stays the server's cheapest route). They call the same `InferenceService` and give
the same replies, errors, drain and body handling (size and time limits, content codings) as
the FastAPI routes, which stay declared for the OpenAPI schema; every other request goes on to
the FastAPI app.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from service import codecs
from service.content_coding import accepted_coding
from service.drain import SHUTTING_DOWN
from service.errors import (
    NotReady,
    PayloadTooLarge,
    error_reply,
    error_response,
)
from service.limits import (
    BodyDeadlines,
    BodyReader,
    compressed_reply,
    declared_over,
    too_large,
)
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
        self.deadlines = BodyDeadlines(runtime.settings.body_timeout)
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
        headers = dict(scope["headers"])
        body = await self._body(headers, receive)
        content_type = headers.get(b"content-type")
        reply = dumps(await self.inference.predict(
            body, None if content_type is None else content_type.decode("latin-1"),
            scope.get("query_string", b"").decode("latin-1")))
        await _reply(send, 200, reply, JSON, headers.get(b"accept-encoding"))

    async def _infer(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])
        length = headers.get(b"inference-header-content-length")
        header_length = codecs.header_length(None if length is None else length.decode("latin-1"))
        body = await self._body(headers, receive)
        params = scope["path_params"]
        reply, header = await self.inference.infer_v2(params["name"], params["version"], body,
                                                      header_length)
        accept = headers.get(b"accept-encoding")
        if header is None:
            await _reply(send, 200, reply, JSON, accept)
        else:
            await _reply(send, 200, reply, BINARY, accept,
                         [(b"inference-header-content-length", str(header).encode())])

    async def _body(self, headers: dict[bytes, bytes], receive: Receive) -> bytes:
        """The request body, inflated when compressed; 413 as soon as it is known to exceed
        the limit, 408 when it takes longer than ``body_timeout`` to arrive."""
        if declared_over(headers, self.max_bytes):
            raise PayloadTooLarge(too_large(self.max_bytes, "max_request_bytes"))
        deadline = self.deadlines.deadline()
        message = await self.deadlines.receive(receive, deadline)
        if message["type"] == "http.disconnect":
            raise ClientGone
        encoding = headers.get(b"content-encoding")
        if encoding is None and not message.get("more_body", False):  # the usual request
            body: bytes = message.get("body", b"")
            if len(body) > self.max_bytes:
                raise PayloadTooLarge(too_large(self.max_bytes, "max_request_bytes"))
            return body
        reader = BodyReader(self.max_bytes, "max_request_bytes", encoding)
        chunks = []
        while True:
            last = not message.get("more_body", False)
            chunks.append(reader.take(message.get("body", b""), last))
            if last:
                return b"".join(chunks)
            message = await self.deadlines.receive(receive, deadline)
            if message["type"] == "http.disconnect":
                raise ClientGone


async def _reply(send: Send, status: int, body: bytes, content_type: bytes,
                 accept_encoding: bytes | None = None,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """A response; compressed when the client's Accept-Encoding asks and the body is large."""
    extra = list(headers or ())
    if accept_encoding is not None:
        body, coding = compressed_reply(body, accepted_coding(accept_encoding))
        extra += coding
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type),
                            (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})
