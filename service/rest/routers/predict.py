"""The simple form: ``POST /predict`` with nested lists in and out (or images)."""

from __future__ import annotations

from typing import Any

from starlette.types import Receive, Scope, Send

from service.rest import schemas
from service.rest.openapi import ERRORS, body_of, operation
from service.rest.responses import dumps
from service.rest.routes import AsgiRoute, header, read_body, reply, runtime_of


async def predict(scope: Scope, receive: Receive, send: Send) -> None:
    """Run `inputs` on `model` (newest ready version unless `version` is given); or images
    (a raw ``image/*`` body or multipart files) on ``?model=NAME[&version=N]``."""
    body = await read_body(receive)
    if body is None:
        return  # the client is gone: nobody to answer
    answer = await runtime_of(scope).inference.predict(
        body, header(scope, b"content-type"), scope.get("query_string", b"").decode("latin-1"))
    await reply(send, dumps(answer))


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


ROUTES = [AsgiRoute("/predict", predict, method="POST", operation=operation(
    predict, "inference", schemas.PredictResponse, errors=ERRORS, **_predict_body()))]
