"""Management API: list, describe, upload, delete, load and unload models."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, status

from service.dataplane import metadata, types
from service.dataplane import repository as operations
from service.rest import schemas
from service.rest.deps import Admin, Repository, Uploads
from service.rest.openapi import ERRORS
from service.rest.routes import FileStackRoute
from service.rest.uploads import receive_upload

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
async def list_models(repository: Repository) -> list[types.ModelSummary]:
    """Every model with its versions and their states."""
    return metadata.models(repository)


@router.get("/{name}")
async def describe_model(repository: Repository, name: str) -> types.ModelDetail:
    """Versions, config and input/output metadata of a model."""
    return metadata.model(repository, name)


@router.post("/{name}", dependencies=Admin, status_code=status.HTTP_201_CREATED,
             openapi_extra=UPLOAD_BODY, responses=UPLOAD_ERRORS)
async def upload(request: Request, repository: Repository, slots: Uploads,
                 name: str) -> types.UploadDetail:
    """Validate and add a version; answers once it is loaded (admin token required).

    The body is multipart: ``symbol``, ``params``, optional ``config``, ``labels`` (repeatable),
    ``version``, ``replace``.
    """
    return await operations.upload(repository, slots, name,
                                   lambda staging: receive_upload(request, staging))


@router.delete("/{name}", dependencies=Admin)
async def delete_model(repository: Repository, name: str) -> types.Done:
    """Delete a model and all its versions (admin token required)."""
    return await operations.delete(repository, name)


@router.delete("/{name}/versions/{number}", dependencies=Admin)
async def delete_version(repository: Repository, name: str, number: str) -> types.Done:
    """Delete one version (admin token required)."""
    return await operations.delete(repository, name, number)


@router.post("/{name}/load", dependencies=Admin)
async def load(repository: Repository, name: str, version: str | None = None) -> types.Done:
    """Load a model by its version policy, or one more version (admin token required)."""
    return await operations.load(repository, name, version)


@router.post("/{name}/unload", dependencies=Admin)
async def unload(repository: Repository, name: str,
                 version: str | None = None) -> types.Done:
    """Unload a model, or one version of it (admin token required)."""
    return await operations.unload(repository, name, version)
