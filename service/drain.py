"""Graceful shutdown: requests already in the server finish, later ones get 503.

On SIGTERM the server turns not-ready, every request that arrives from then on is answered
503 with ``Retry-After`` (health routes excepted, so probes see the state), and the process
waits for the requests already inside to finish before it stops listening. The count and the
refusal happen in the layer every request passes, `service.gate.Gate`.
"""

from __future__ import annotations

import asyncio
import time

from starlette.types import Receive, Scope, Send

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


def refuses(state: DrainState, scope: Scope) -> bool:
    """Whether a request arriving now is refused: the process drains and it is no probe."""
    return state.draining and not scope["path"].startswith(HEALTH_PREFIX)


async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
    """The 503 a request gets once draining began (``Retry-After``: another replica may
    answer)."""
    await error_response(503, SHUTTING_DOWN, {"Retry-After": "1"})(scope, receive, send)
