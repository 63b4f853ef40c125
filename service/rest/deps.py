"""Dependencies of the routers: the app's repository and services, and the admin token check."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from engine.serving.repository import ModelRepository
from service.dataplane.metrics import Metrics
from service.dataplane.repository import UploadSlots
from service.errors import Unauthorized
from service.runtime import Runtime

_bearer = HTTPBearer(auto_error=False, description="the server's admin token")


def runtime(request: Request) -> Runtime:
    """The runtime shared by the apps of this process."""
    value: Runtime = request.app.state.runtime
    return value


async def get_repository(request: Request) -> ModelRepository:
    """The repository the app serves."""
    return runtime(request).repository


async def get_uploads(request: Request) -> UploadSlots:
    """The bound on concurrent uploads, shared by the apps of this process."""
    return runtime(request).uploads


async def get_metrics(request: Request) -> Metrics:
    """The app's metrics."""
    return runtime(request).metrics


async def require_admin(request: Request, credentials: Annotated[
        HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """Allow the request only with ``Authorization: Bearer <the server's admin token>``."""
    runtime(request).admin.check(
        None if credentials is None else credentials.credentials,
        Unauthorized("this endpoint needs the header 'Authorization: Bearer <admin token>'",
                     {"WWW-Authenticate": "Bearer"}))


Repository = Annotated[ModelRepository, Depends(get_repository)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
Uploads = Annotated[UploadSlots, Depends(get_uploads)]
Admin = [Depends(require_admin)]
