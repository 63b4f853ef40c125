"""`Gate`: the layer every HTTP request passes between the server and the router.

It keeps three concerns: the drain (refused with 503 while the process drains, health probes
excepted; counted in the process's `service.dataplane.drain.DrainState` while inside), the body
limits (`service.rest.limits`: size, time, content codings) and the error replies
(`service.rest.errors`: any exception becomes its handler's JSON reply). Run as three ASGI layers
they cost the hot routes a coroutine frame, an ``await`` and a ``try`` each per request; one
layer calling the three does the same work in one frame (measured in process,
``bench/asgi_overhead.py``).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from service.dataplane.drain import SHUTTING_DOWN, DrainState
from service.errors import ServiceError
from service.rest.errors import ErrorReplies, error_response
from service.rest.limits import BodyLimit

HEALTH_PREFIX = "/v2/health/"


class Gate:
    """ASGI layer: drain, then body limits, then error replies, around `app` (the router)."""

    def __init__(self, app: ASGIApp, *, drain: DrainState, limits: BodyLimit,
                 errors: ErrorReplies) -> None:
        self.app = app
        self.drain = drain
        self.limits = limits
        self.errors = errors

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse, or count the request in flight and run it with its body limited and its
        errors answered."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        drain = self.drain
        if drain.draining and not scope["path"].startswith(HEALTH_PREFIX):
            # Another replica may answer.
            await error_response(503, SHUTTING_DOWN, {"Retry-After": "1"})(scope, receive, send)
            return
        drain.in_flight += 1
        try:
            try:
                scope, receive, send = self.limits.open(scope, receive, send)
            except ServiceError as error:  # refused by its headers, before the body is read
                await error_response(error.status, str(error))(scope, receive, send)
                return
            scope["starlette.exception_handlers"] = self.errors.scope_handlers
            try:
                await self.app(scope, receive, send)
            except Exception as error:  # noqa: BLE001 - each becomes its handler's reply
                await self.errors.answer(error, scope, receive, send)
        finally:
            drain.in_flight -= 1
