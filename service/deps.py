"""Dependencies of the routers: the app's repository and services, and the admin token check."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from engine.serving.repository import ModelRepository
from service.errors import Forbidden, Unauthorized
from service.inference import InferenceService
from service.metrics import Metrics
from service.runtime import Runtime
from service.uploads import UploadSlots

_bearer = HTTPBearer(auto_error=False, description="the server's admin token")


def runtime(request: Request) -> Runtime:
    """The runtime shared by the apps of this process."""
    value: Runtime = request.app.state.runtime
    return value


async def get_repository(request: Request) -> ModelRepository:
    """The repository the app serves."""
    return runtime(request).repository


async def get_inference(request: Request) -> InferenceService:
    """The app's inference service."""
    return runtime(request).inference


async def get_uploads(request: Request) -> UploadSlots:
    """The bound on concurrent uploads, shared by the apps of this process."""
    return runtime(request).uploads


async def get_metrics(request: Request) -> Metrics:
    """The app's metrics."""
    return runtime(request).metrics


async def require_admin(request: Request, credentials: Annotated[
        HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """Allow the request only with ``Authorization: Bearer <the server's admin token>``."""
    access = runtime(request).admin
    token = access.token
    if token is None:
        raise Forbidden(access.refusal)
    if credentials is None:
        raise Unauthorized("this endpoint needs the header 'Authorization: Bearer <admin token>'",
                           {"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(credentials.credentials.encode(), token.encode()):
        raise Forbidden("the bearer token is not the server's admin token")


Repository = Annotated[ModelRepository, Depends(get_repository)]
Inference = Annotated[InferenceService, Depends(get_inference)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
Uploads = Annotated[UploadSlots, Depends(get_uploads)]
Admin = [Depends(require_admin)]
