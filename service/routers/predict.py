"""The simple form: ``POST /predict`` with nested lists in and out."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from service import schemas
from service.deps import Inference
from service.openapi import ERRORS, body_of
from service.responses import OrjsonResponse, json_response

router = APIRouter(tags=["inference"], responses=ERRORS)


def _predict_body() -> dict[str, Any]:
    """JSON, or images for a model with a preprocess pipeline (named in the query string)."""
    extra = body_of(schemas.PredictRequest)
    image = {"schema": {"type": "string", "format": "binary"}}
    extra["requestBody"]["content"].update({
        "image/*": {**image, "description": "one image (JPEG, PNG or WebP) for the model's one "
                    "input with a preprocess pipeline; ?model=NAME[&version=N]"},
        "multipart/form-data": {"schema": {"type": "object", "additionalProperties": {
            "type": "array", "items": image["schema"]}}, "description": "one part per image, "
            "named after its input; ?model=NAME[&version=N]"}})
    extra["parameters"] = [
        {"name": "model", "in": "query", "required": False, "schema": {"type": "string"},
         "description": "the model, for an image body"},
        {"name": "version", "in": "query", "required": False, "schema": {"type": "string"},
         "description": "its version, for an image body (default: the newest ready)"}]
    return extra


@router.post("/predict", openapi_extra=_predict_body(),
             response_class=OrjsonResponse, responses={200: {"model": schemas.PredictResponse}})
async def predict(request: Request, inference: Inference) -> OrjsonResponse:
    """Run `inputs` on `model` (newest ready version unless `version` is given); or images
    (a raw ``image/*`` body or multipart files) on ``?model=NAME[&version=N]``."""
    return json_response(await inference.predict(await request.body(),
                                                 request.headers.get("content-type"),
                                                 request.url.query))
