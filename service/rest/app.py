"""The FastAPI applications: the inference API, the management API, or both on one port.

The REST face of the data plane (`service.dataplane`), beside gRPC's (`service.grpc`): both
serve one `service.runtime.Runtime`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from service.dataplane.metadata import VERSION
from service.rest import routers
from service.rest.errors import ErrorReplies, install_handlers
from service.rest.gate import Gate
from service.rest.limits import BodyLimit
from service.rest.openapi import install_openapi
from service.rest.routes import Router
from service.rest.traced import TracedInference
from service.runtime import Runtime


class HybridServeApp(FastAPI):
    """FastAPI with one lean stack around its one router, for every route: the app's
    middleware, then `Gate` (drain, body limits, error replies), then the router as
    `service.rest.routes.Router` calls it (its ASGI routes looked up before its scan).

    FastAPI's own stack adds layers this server does not use (its telemetry, which reads the
    environment on each request; a body limit of its own beside `BodyLimit`; a server-error
    layer that re-raises after answering; a file stack only its routes need, which they now
    open themselves). Measured in process, the health probe took 39 µs through that stack and
    Starlette's exception layer, 5 µs through three layers of our own, 3 µs through the gate
    and the router's lookup (`bench/asgi_overhead.py`). The ASGI routes (`service.rest.routes`)
    run inside just this stack.
    """

    runtime: Runtime  # what the ASGI routes serve (`service.rest.routes.runtime_of`)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the lifespan, as FastAPI runs it
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        if self.middleware_stack is None:
            self.middleware_stack = self.build_middleware_stack()
        await self.middleware_stack(scope, receive, send)

    def build_middleware_stack(self) -> ASGIApp:
        """The app's middleware (outermost first), the gate, the router (whose FastAPI routes
        open their own file stack: `service.rest.routes.FileStackRoute`); while the runtime
        traces, the inference requests' spans between the gate and the router."""
        settings = self.runtime.settings
        limits = BodyLimit(max_bytes=settings.max_request_bytes,
                           max_upload_bytes=settings.max_upload_bytes,
                           body_timeout_s=settings.body_timeout)
        router: ASGIApp = Router(self.router)
        if self.runtime.tracing.enabled:
            router = TracedInference(router, self.runtime.tracing)
        app: ASGIApp = Gate(router, drain=self.runtime.drain, limits=limits,
                            errors=ErrorReplies(self.exception_handlers))
        for middleware in reversed(self.user_middleware):
            app = middleware.cls(app, *middleware.args, **middleware.kwargs)
        return app


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
                         description="Serves MXNet-format models: Open Inference Protocol "
                         "(V2), /predict, management and metrics.")
    app.state.runtime = runtime  # for FastAPI's dependencies (`service.rest.deps`)
    app.runtime = runtime
    # The ASGI routes first in the one router: the hot routes are matched before any other.
    app.router.routes[:0] = routers.INFERENCE_ASGI if inference else routers.HEALTH_ASGI
    selected = (routers.INFERENCE if inference else routers.HEALTH) + (
        routers.MANAGEMENT if management else ())
    for router in selected:
        app.include_router(router)
    install_handlers(app)
    install_openapi(app)
    return app
