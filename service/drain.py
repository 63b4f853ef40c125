"""Graceful shutdown: requests already in the server finish, later ones get 503.

On SIGTERM the server turns not-ready, `Drain` answers every request that arrives from then on
with 503 and ``Retry-After`` (health routes excepted, so probes see the state), and the process
waits for the requests already inside to finish before it stops listening.
"""

from __future__ import annotations

import asyncio
import time

from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import error_response

HEALTH_PREFIX = "/v2/health/"
SHUTTING_DOWN = "the server is shutting down; retry shortly (another replica may answer)"


class DrainState:
    """Whether the process is draining, and how many requests are inside it."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0

    async def drain(self, grace_s: float) -> None:
        """Refuse new requests and wait, up to ``grace_s``, for those in flight."""
        self.draining = True
        deadline = time.monotonic() + grace_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)


class Drain:
    """ASGI middleware counting requests in flight and refusing new ones while draining."""

    def __init__(self, app: ASGIApp, *, state: DrainState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, or answer 503 when it arrives after draining began."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.state.draining and not scope["path"].startswith(HEALTH_PREFIX):
            response = error_response(503, SHUTTING_DOWN, {"Retry-After": "1"})
            await response(scope, receive, send)
            return
        self.state.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.in_flight -= 1
