"""Model metadata, readiness and inference (Open Inference Protocol, JSON and binary tensors)."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.types import Receive, Scope, Send

from engine.serving.errors import ModelNotReady
from service.dataplane import metadata, triton_config, types
from service.errors import BadRequest
from service.rest import schemas
from service.rest.deps import Repository
from service.rest.openapi import ERRORS, V2_INFER_BODY, operation
from service.rest.routes import (
    BINARY,
    AsgiRoute,
    FileStackRoute,
    header,
    read_body,
    reply,
    runtime_of,
)
from service.tensors import binary

PREFIX = "/v2/models/{name}"
router = APIRouter(prefix=PREFIX, tags=["inference"], responses=ERRORS, route_class=FileStackRoute)
HEADER_LENGTH = binary.HEADER_LENGTH.lower().encode()
NOT_READY = {400: {"model": schemas.ErrorResponse, "description": "Not ready"}}


@router.get("")
@router.get("/versions/{version}")
async def model_metadata(repository: Repository, name: str,
                         version: str | None = None) -> types.ModelMetadata:
    """Inputs, outputs and ready versions (the given version, or the newest ready one)."""
    return metadata.model_metadata(repository, name, version)


@router.get("/config", response_model_exclude_none=True)
@router.get("/versions/{version}/config", response_model_exclude_none=True)
async def model_config(repository: Repository, name: str,
                       version: str | None = None) -> types.TritonModelConfig:
    """The version's config in the form of Triton's model configuration (the given version, or
    the newest ready one), as Triton's clients and perf_analyzer read it."""
    return triton_config.model_config(repository, name, version)


@router.get("/ready", responses=NOT_READY)
@router.get("/versions/{version}/ready", responses=NOT_READY)
async def model_ready(repository: Repository, name: str, version: str | None = None
                      ) -> types.ModelReady:
    """200 when the version (default: newest) is ready; 400 when it is not (as Triton
    answers: the protocol's 4xx for not ready), 404 when the model or version is unknown."""
    try:
        return metadata.model_ready(repository, name, version)
    except ModelNotReady as error:
        raise BadRequest(f"not ready: {error}") from None


async def infer(scope: Scope, receive: Receive, send: Send) -> None:
    """Run one request; with Inference-Header-Content-Length the body is JSON then binary."""
    length = binary.header_length(header(scope, HEADER_LENGTH))
    body = await read_body(receive)
    if body is None:
        return  # the client is gone: nobody to answer
    params = scope["path_params"]
    reply_body, binary_header = await runtime_of(scope).inference.infer_v2(
        params["name"], params.get("version"), body, length)
    if binary_header is None:
        await reply(send, reply_body)
    else:
        await reply(send, reply_body, BINARY,
                    ((HEADER_LENGTH, str(binary_header).encode()),))


def _path_parameters(*names: str) -> list[dict[str, object]]:
    return [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in names]


ROUTES = [AsgiRoute(PREFIX + path, infer, method="POST", operation=operation(
    infer, "inference", schemas.V2InferResponse, errors=ERRORS,
    parameters=_path_parameters(*names), **V2_INFER_BODY))
    for path, names in (("/infer", ("name",)), ("/versions/{version}/infer", ("name", "version")))]
