"""Server metadata and health (Open Inference Protocol)."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.types import Receive, Scope, Send

from service.dataplane import metadata, types
from service.errors import NotReady
from service.rest import schemas
from service.rest.openapi import operation
from service.rest.responses import dumps
from service.rest.routes import AsgiRoute, FileStackRoute, reply, runtime_of

router = APIRouter(tags=["health"], route_class=FileStackRoute)
NOT_READY = "the server is starting or stopping; the model repository is not ready"
FAILED = "models the server was asked to serve failed to load: {} (strict readiness)"
LIVE = dumps(schemas.Live(live=True).model_dump())
READY = dumps(schemas.Ready(ready=True).model_dump())


@router.get("/v2")
@router.get("/v2/", include_in_schema=False)  # the protocol's spelling; no redirect
async def server_metadata() -> types.ServerMetadata:
    """Server name, version and protocol extensions."""
    return metadata.server()


async def live(scope: Scope, receive: Receive, send: Send) -> None:
    """200 while the process serves HTTP."""
    await reply(send, LIVE)


async def ready(scope: Scope, receive: Receive, send: Send) -> None:
    """200 once the repository has been scanned and its models loaded; 503 before and after,
    and, with strict readiness, while a model it was asked to serve failed to load."""
    runtime = runtime_of(scope)
    if not runtime.ready:
        failed = runtime.started and runtime.repository.failed_models()
        raise NotReady(FAILED.format(", ".join(failed)) if failed else NOT_READY)
    await reply(send, READY)


# The probes are ASGI routes so that the HTTP floor stays the server's cheapest route.
ROUTES = [AsgiRoute("/v2/health/live", live, method="GET",
                    operation=operation(live, "health", schemas.Live)),
          AsgiRoute("/v2/health/ready", ready, method="GET", operation=operation(
              ready, "health", schemas.Ready,
              errors={503: {"model": schemas.ErrorResponse,
                            "description": "Service Unavailable"}}))]
