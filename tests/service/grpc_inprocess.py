"""The app and its gRPC server over a temporary repository, on one event loop, in-process."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc

from service.grpc import inference_pb2_grpc as pb_grpc
from service.grpc.server import start_grpc
from tests.e2e.server import free_port
from tests.reliability.inprocess import AppClient, app_client

T = TypeVar("T")


class GrpcClient:
    """Calls to the gRPC server of an `AppClient`'s runtime, each run to completion."""

    def __init__(self, app: AppClient, stub: pb_grpc.GRPCInferenceServiceStub,
                 channel: grpc.aio.Channel) -> None:
        self.app = app
        self.runtime = app.runtime
        self.stub = stub
        self.channel = channel

    def run(self, start: Callable[[], Awaitable[T]]) -> T:
        """Start a call on the app's loop (a gRPC call belongs to the loop it starts on) and
        await it."""
        async def started() -> T:
            return await asyncio.wait_for(start(), 60)

        return self.app.loop.run_until_complete(started())

    def call(self, method: str, request: Any, **kwargs: Any) -> Any:
        """One unary call by its RPC name (`request` a message, or bytes for a raw call)."""
        if isinstance(request, bytes):
            raw = self.channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
            return self.run(lambda: raw(request, **kwargs))
        return self.run(lambda: getattr(self.stub, method)(request, **kwargs))

    def code(self, method: str, request: Any, **kwargs: Any) -> tuple[grpc.StatusCode, str]:
        """The status code and details a call ends with (OK and "" when it succeeds)."""
        try:
            self.call(method, request, **kwargs)
        except grpc.aio.AioRpcError as error:
            return error.code(), error.details() or ""
        return grpc.StatusCode.OK, ""


@contextmanager
def grpc_client(root: Path, models: Sequence[str] = ("seed_mlp",),
                **overrides: Any) -> Iterator[GrpcClient]:
    """A `GrpcClient` over a fresh repository at `root` holding the named conformance models."""
    with app_client(root, models, grpc_port=free_port(), **overrides) as app:
        server = app.loop.run_until_complete(start_grpc(app.runtime))
        channel = app.loop.run_until_complete(_channel(app.runtime.settings.grpc_port))
        try:
            yield GrpcClient(app, pb_grpc.GRPCInferenceServiceStub(channel), channel)
        finally:
            app.loop.run_until_complete(channel.close())
            app.loop.run_until_complete(server.stop(None))


async def _channel(port: int) -> grpc.aio.Channel:
    """A channel bound to the running loop (the app's)."""
    return grpc.aio.insecure_channel(f"127.0.0.1:{port}")
