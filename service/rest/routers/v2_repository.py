"""Model repository extension of the Open Inference Protocol (index, load, unload).

Bodies are read by hand rather than by a pydantic model, so that each wrong field gets a
message naming it (FastAPI's own parsing answers some with a generic 400) and no string is
quietly read as a boolean.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from service.dataplane import repository as operations
from service.dataplane import types
from service.errors import BadRequest
from service.rest import schemas
from service.rest.deps import Admin, Repository
from service.rest.openapi import ERRORS, optional_body_of
from service.rest.routes import FileStackRoute
from service.tensors import json

router = APIRouter(prefix="/v2/repository", tags=["repository"], responses=ERRORS,
                   route_class=FileStackRoute)


async def body_object(request: Request, what: str) -> dict[str, Any]:
    """The request's JSON object body; ``{}`` for an empty body, 400 for anything else."""
    body = await request.body()
    if not body.strip():
        return {}
    return json.as_object(json.load_json(body, what), what)


def parameters_of(document: dict[str, Any], what: str) -> dict[str, Any]:
    """The body's ``parameters`` object (``{}`` when absent)."""
    parameters = document.get("parameters")
    return {} if parameters is None else json.as_object(parameters, f"{what}: 'parameters'")


@router.post("/index", openapi_extra=optional_body_of(schemas.IndexRequest))
async def repository_index(repository: Repository,
                           request: Request) -> list[types.VersionStatus]:
    """Every version known on disk or in memory with its state."""
    document = await body_object(request, "repository index request")
    ready = json.flag(document, "ready", "repository index request: ")
    return operations.index(repository, ready)


@router.post("/models/{name}/load", dependencies=Admin)
async def load(repository: Repository, name: str, request: Request) -> types.Done:
    """Load a model by its version policy (admin token required)."""
    what = "model load request"
    for key in parameters_of(await body_object(request, what), what):
        raise BadRequest(f"{what}: parameter {key!r} is not supported; versions load from the "
                         "repository as they are (upload files with POST /models/{name})")
    return await operations.load(repository, name)


@router.post("/models/{name}/unload", dependencies=Admin)
async def unload(repository: Repository, name: str, request: Request) -> types.Done:
    """Unload every version of a model (admin token required)."""
    what = "model unload request"
    parameters = parameters_of(await body_object(request, what), what)
    json.flag(parameters, "unload_dependents", f"{what}: parameters.")  # none depend here
    unknown = sorted(set(parameters) - {"unload_dependents"})
    if unknown:
        raise BadRequest(f"{what}: parameters {unknown} are not supported; only "
                         "unload_dependents is")
    return await operations.unload(repository, name)
