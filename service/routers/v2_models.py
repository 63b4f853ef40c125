"""Model metadata, readiness and inference (Open Inference Protocol, JSON and binary tensors)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from engine.serving.errors import ModelNotReady
from service import codecs, schemas
from service.deps import Inference, Repository
from service.describe import metadata
from service.errors import BadRequest
from service.openapi import ERRORS, V2_INFER_BODY

router = APIRouter(prefix="/v2/models/{name}", tags=["inference"], responses=ERRORS)
BINARY_TYPE = "application/octet-stream"
NOT_READY = {400: {"model": schemas.ErrorResponse, "description": "Not ready"}}


@router.get("")
@router.get("/versions/{version}")
async def model_metadata(repository: Repository, name: str,
                         version: str | None = None) -> schemas.ModelMetadata:
    """Inputs, outputs and ready versions (the given version, or the newest ready one)."""
    return metadata(repository, repository.get(name, version))


@router.get("/ready", responses=NOT_READY)
@router.get("/versions/{version}/ready", responses=NOT_READY)
async def model_ready(repository: Repository, name: str, version: str | None = None
                      ) -> schemas.ModelReady:
    """200 when the version (default: newest) is ready; 400 when it is not (as Triton
    answers: the protocol's 4xx for not ready), 404 when the model or version is unknown."""
    try:
        handle = repository.get(name, version)
    except ModelNotReady as error:
        raise BadRequest(f"not ready: {error}") from None
    return schemas.ModelReady(name=handle.name, ready=True)


@router.post("/infer", openapi_extra=V2_INFER_BODY,
             responses={200: {"model": schemas.V2InferResponse}})
@router.post("/versions/{version}/infer", openapi_extra=V2_INFER_BODY,
             responses={200: {"model": schemas.V2InferResponse}})
async def infer(request: Request, inference: Inference, name: str,
                version: str | None = None) -> Response:
    """Run one request; with Inference-Header-Content-Length the body is JSON then binary."""
    length = codecs.header_length(request.headers.get(codecs.HEADER_LENGTH))
    body, header = await inference.infer_v2(name, version, await request.body(), length)
    if header is None:
        return Response(body, media_type="application/json")
    return Response(body, media_type=BINARY_TYPE, headers={codecs.HEADER_LENGTH: str(header)})
