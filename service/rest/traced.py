"""The ``receive`` span of each inference request over HTTP, while tracing is on.

`HybridServeApp.build_middleware_stack` puts `TracedInference` between the `Gate` and the router
only when the runtime traces; otherwise no layer exists and a request pays nothing.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from service.tracing import Tracing


def is_inference(method: str, path: str) -> bool:
    """``POST /predict`` and V2 infer (``/v2/models/{name}[/versions/{v}]/infer``)."""
    return method == "POST" and (
        path == "/predict" or (path.startswith("/v2/models/") and path.endswith("/infer")))


class TracedInference:
    """Open the ``receive`` span (its parent from the ``traceparent`` header) around each
    inference request; other routes pass untraced. Inside the `Gate`, so a request it refuses
    ends its span with the error before the Gate answers it."""

    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_inference(scope["method"], scope["path"]):
            await self.app(scope, receive, send)  # the lifespan too
            return
        with self.tracing.http(scope["headers"], "POST", scope["path"]):
            await self.app(scope, receive, send)
