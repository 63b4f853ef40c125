"""Graceful shutdown: requests already in the server finish, later ones are refused.

On SIGTERM the server turns not-ready, every request that arrives from then on is refused (REST:
503 with ``Retry-After``, health routes excepted so probes see the state; gRPC: UNAVAILABLE),
and the process waits for the requests already inside to finish before it stops listening.
One `DrainState` per process counts the requests of both: REST's in the layer every request
passes (`service.rest.gate.Gate`), gRPC's in its servicer (`service.grpc.servicer`).
"""

from __future__ import annotations

import asyncio
import time

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
