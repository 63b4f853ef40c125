"""Management API: list, describe, upload, delete, load and unload models."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, status

from engine.serving.names import check_model_name
from service import describe, schemas
from service.deps import Admin, Repository, Uploads
from service.openapi import ERRORS
from service.routes import FileStackRoute
from service.uploads import receive_upload

router = APIRouter(prefix="/models", tags=["management"], responses=ERRORS,
                   route_class=FileStackRoute)

_FILE = {"type": "string", "format": "binary"}
# The body is streamed to disk by `receive_upload`, so FastAPI cannot see it: declared here.
UPLOAD_BODY: dict[str, Any] = {"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": {
        "type": "object", "required": ["symbol", "params"],
        "properties": {
            "symbol": {**_FILE, "description": "NAME-symbol.json"},
            "params": {**_FILE, "description": "NAME-0000.params"},
            "config": {**_FILE, "description": "config.json"},
            "labels": {"type": "array", "items": _FILE,
                       "description": "class labels, one a line; the file name is the one "
                                      "config.json gives an output's labels"},
            "version": {"type": "integer", "minimum": 1, "description": "default: next free"},
            "replace": {"type": "boolean", "default": False,
                        "description": "replace an existing version"}}}}}}}
UPLOAD_ERRORS: dict[int | str, dict[str, Any]] = {
    status_code: {"model": schemas.ErrorResponse, "description": description}
    for status_code, description in ((401, "No bearer token"),
                                     (403, "Wrong token, or management disabled"),
                                     (409, "The version exists, or over the memory budget"),
                                     (422, "The model failed validation"))}


@router.get("")
async def list_models(repository: Repository) -> list[schemas.ModelSummary]:
    """Every model with its versions and their states."""
    return describe.models(repository)


@router.get("/{name}")
async def describe_model(repository: Repository, name: str) -> schemas.ModelDetail:
    """Versions, config and input/output metadata of a model."""
    return describe.model(repository, name)


@router.post("/{name}", dependencies=Admin, status_code=status.HTTP_201_CREATED,
             openapi_extra=UPLOAD_BODY, responses=UPLOAD_ERRORS)
async def upload(request: Request, repository: Repository, slots: Uploads,
                 name: str) -> schemas.VersionDetail:
    """Validate and add a version; answers once it is loaded (admin token required).

    The body is multipart: ``symbol``, ``params``, optional ``config``, ``labels`` (repeatable),
    ``version``, ``replace``.
    """
    check_model_name(name)  # before a byte of the body is read
    with slots.hold():
        async with repository.staging() as staging:
            form = await receive_upload(request, staging)
            number = await repository.add_staged(name, staging, config=form.config,
                                                 version=form.version, replace=form.replace)
    return describe.version(repository, name, number)


@router.delete("/{name}", dependencies=Admin)
async def delete_model(repository: Repository, name: str) -> schemas.Done:
    """Delete a model and all its versions (admin token required)."""
    await repository.delete_model(name)
    return schemas.Done(name=name, action="deleted")


@router.delete("/{name}/versions/{number}", dependencies=Admin)
async def delete_version(repository: Repository, name: str, number: str) -> schemas.Done:
    """Delete one version (admin token required)."""
    await repository.delete_version(name, number)
    return schemas.Done(name=name, version=number, action="deleted")


@router.post("/{name}/load", dependencies=Admin)
async def load(repository: Repository, name: str, version: str | None = None) -> schemas.Done:
    """Load a model by its version policy, or one more version (admin token required)."""
    await repository.load(name, version)
    return schemas.Done(name=name, version=version, action="loaded")


@router.post("/{name}/unload", dependencies=Admin)
async def unload(repository: Repository, name: str,
                 version: str | None = None) -> schemas.Done:
    """Unload a model, or one version of it (admin token required)."""
    await repository.unload(name, version)
    return schemas.Done(name=name, version=version, action="unloaded")
