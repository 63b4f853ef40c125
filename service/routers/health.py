"""Server metadata and health (Open Inference Protocol)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from service import schemas
from service.errors import NotReady

router = APIRouter(tags=["health"])
SERVER_NAME = "hybridserve"
EXTENSIONS = ["binary_tensor_data", "classification", "model_repository"]
NOT_READY = "the server is starting or stopping; the model repository is not ready"


@router.get("/v2")
@router.get("/v2/", include_in_schema=False)  # the protocol's spelling; no redirect
async def server_metadata(request: Request) -> schemas.ServerMetadata:
    """Server name, version and protocol extensions."""
    return schemas.ServerMetadata(name=SERVER_NAME, version=request.app.version,
                                  extensions=EXTENSIONS)


@router.get("/v2/health/live")
async def live() -> schemas.Live:
    """200 while the process serves HTTP."""
    return schemas.Live(live=True)


@router.get("/v2/health/ready", responses={503: {"model": schemas.ErrorResponse}})
async def ready(request: Request) -> schemas.Ready:
    """200 once the repository has been scanned and its models loaded; 503 before and after."""
    if not request.app.state.runtime.ready:
        raise NotReady(NOT_READY)
    return schemas.Ready(ready=True)
