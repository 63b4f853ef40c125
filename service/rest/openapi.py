"""OpenAPI details FastAPI cannot see: bodies read raw (for speed and binary tensors), errors,
and the operations of the routes answered in plain ASGI (`service.rest.routes`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from service.rest import schemas
from service.rest.routes import AsgiRoute

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
# The replies of the ASGI routes, which FastAPI does not know either.
ASGI_REPLIES: list[type[BaseModel]] = [schemas.PredictResponse, schemas.V2InferResponse,
                                       schemas.Live, schemas.Ready, schemas.ErrorResponse]


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


def _json_reply(model: type[BaseModel], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": {
        "$ref": REF.format(model=model.__name__)}}}}


def operation(endpoint: Callable[..., Any], tag: str, reply: type[BaseModel], *,
              errors: dict[int | str, dict[str, Any]] | None = None,
              **extra: Any) -> dict[str, Any]:
    """The OpenAPI operation of an ASGI route (`AsgiRoute` adds its id), as FastAPI would
    write it for a route declared with these replies: summary from the endpoint's name,
    description from its docstring.

    Args:
        endpoint: the route's endpoint.
        tag: the OpenAPI tag (the resource).
        reply: the schema of the 200 reply.
        errors: error statuses and their descriptions (``ERRORS`` form).
        extra: more fields of the operation (``requestBody``, ``parameters``).
    """
    name = endpoint.__name__
    responses = {"200": _json_reply(reply, "Successful Response")}
    for status, error in (errors or {}).items():
        responses[str(status)] = _json_reply(error["model"], error["description"])
    return {"tags": [tag], "summary": name.replace("_", " ").title(),
            "description": inspect.cleandoc(endpoint.__doc__ or ""), **extra,
            "responses": responses}


def install_openapi(app: FastAPI) -> None:
    """Add the ASGI routes' operations, and the schemas of raw-read bodies and of those
    routes' replies, to `app`'s OpenAPI document."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = build()
        paths = document.setdefault("paths", {})
        for route in app.routes:
            if isinstance(route, AsgiRoute):
                paths.setdefault(route.path, {})[route.method.lower()] = route.operation
        components = document.setdefault("components", {}).setdefault("schemas", {})
        for model in RAW_BODIES + ASGI_REPLIES:
            mode = "validation" if model in RAW_BODIES else "serialization"
            schema = model.model_json_schema(ref_template=REF, mode=mode)
            for name, definition in schema.pop("$defs", {}).items():
                components.setdefault(name, definition)
            components.setdefault(model.__name__, schema)
        return document

    app.openapi = openapi  # type: ignore[method-assign]
