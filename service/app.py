"""The FastAPI applications: the inference API, the management API, or both on one port."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from service import routers
from service.drain import Drain
from service.errors import install_handlers
from service.fast_lane import FastLane
from service.limits import BodyLimit
from service.openapi import install_openapi
from service.runtime import Runtime

VERSION = "0.1.0"


class HybridServeApp(FastAPI):
    """FastAPI with the hot routes answered by a `FastLane` before any of FastAPI's machinery.

    A lane added with ``add_middleware`` still runs inside FastAPI's own layers (its telemetry
    check, server-error and body-limit middleware: 7% of the event loop per ``/predict``).
    """

    lane: FastLane | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.lane is None:
            await super().__call__(scope, receive, send)
        else:
            await self.lane(scope, receive, send)

    async def without_lane(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app as FastAPI serves it: where the lane sends what it does not answer."""
        await super().__call__(scope, receive, send)


def create_app(runtime: Runtime, *, inference: bool = True, management: bool = True,
               owns_runtime: bool = True) -> HybridServeApp:
    """An app serving the inference and/or management routes of `runtime`.

    The app that owns the runtime starts and closes it in its lifespan.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if owns_runtime:
            await runtime.start()
        try:
            yield
        finally:
            if owns_runtime:
                await runtime.close()

    title = "HybridServe" + ("" if inference else " management")
    app = HybridServeApp(title=title, version=VERSION, lifespan=lifespan,
                         description="Serves MXNet-format models: Open Inference Protocol (V2), "
                         "/predict, management and metrics.")
    app.state.runtime = runtime
    selected = (routers.INFERENCE if inference else routers.HEALTH) + (
        routers.MANAGEMENT if management else ())
    for router in selected:
        app.include_router(router)
    install_handlers(app)
    install_openapi(app)
    app.add_middleware(BodyLimit, max_bytes=runtime.settings.max_request_bytes,
                       max_upload_bytes=runtime.settings.max_upload_bytes,
                       body_timeout_s=runtime.settings.body_timeout)
    app.add_middleware(Drain, state=runtime.drain)
    if inference:
        app.lane = FastLane(app.without_lane, runtime=runtime)
    return app
