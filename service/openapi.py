"""OpenAPI details FastAPI cannot see: bodies read raw (for speed and binary tensors), errors."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from service import schemas

REF = "#/components/schemas/{model}"
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": schemas.ErrorResponse, "description": description}
    for status, description in ((400, "Bad request or tensor"), (404, "Unknown model/version"),
                                (408, "Body not received within body_timeout"),
                                (413, "Body or tensor too large"),
                                (415, "Unsupported Content-Encoding"),
                                (503, "Overloaded or not ready (see Retry-After)"),
                                (504, "Timed out"))}
RAW_BODIES: list[type[BaseModel]] = [schemas.V2InferRequest, schemas.PredictRequest,
                                     schemas.IndexRequest]


def body_of(model: type[BaseModel], *, binary: bool = False) -> dict[str, Any]:
    """``openapi_extra`` declaring a JSON request body of schema `model`."""
    content: dict[str, Any] = {"application/json": {"schema": {"$ref": REF.format(
        model=model.__name__)}}}
    if binary:
        content["application/octet-stream"] = {"schema": {"type": "string", "format": "binary"},
                                               "description": "JSON header of "
                                               "Inference-Header-Content-Length bytes, then "
                                               "the binary tensors in input order"}
    return {"requestBody": {"required": True, "content": content}}


def optional_body_of(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` declaring an optional JSON request body of schema `model`."""
    extra = body_of(model)
    extra["requestBody"]["required"] = False
    return extra


V2_INFER_BODY = body_of(schemas.V2InferRequest, binary=True)


def install_openapi(app: FastAPI) -> None:
    """Add the schemas of raw-read bodies to the components of `app`'s OpenAPI document."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = build()
        components = document.setdefault("components", {}).setdefault("schemas", {})
        for model in RAW_BODIES:
            schema = model.model_json_schema(ref_template=REF)
            for name, definition in schema.pop("$defs", {}).items():
                components.setdefault(name, definition)
            components.setdefault(model.__name__, schema)
        return document

    app.openapi = openapi  # type: ignore[method-assign]
