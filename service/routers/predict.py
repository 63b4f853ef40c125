"""The simple form: ``POST /predict`` with nested lists in and out."""

from __future__ import annotations

from fastapi import APIRouter, Request

from service import schemas
from service.deps import Inference
from service.openapi import ERRORS, body_of
from service.responses import OrjsonResponse, json_response

router = APIRouter(tags=["inference"], responses=ERRORS)


@router.post("/predict", openapi_extra=body_of(schemas.PredictRequest),
             response_class=OrjsonResponse, responses={200: {"model": schemas.PredictResponse}})
async def predict(request: Request, inference: Inference) -> OrjsonResponse:
    """Run `inputs` on `model` (newest ready version unless `version` is given); or images
    (a raw ``image/*`` body or multipart files) on ``?model=NAME[&version=N]``."""
    return json_response(await inference.predict(await request.body(),
                                                 request.headers.get("content-type"),
                                                 request.url.query))
