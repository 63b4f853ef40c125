"""Management API: list, describe, upload, delete, load and unload models."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, UploadFile, status

from service import describe, schemas
from service.deps import Admin, Repository
from service.openapi import ERRORS

router = APIRouter(prefix="/models", tags=["management"], responses=ERRORS)


@router.get("")
async def list_models(repository: Repository) -> list[schemas.ModelSummary]:
    """Every model with its versions and their states."""
    return describe.models(repository)


@router.get("/{name}")
async def describe_model(repository: Repository, name: str) -> schemas.ModelDetail:
    """Versions, config and input/output metadata of a model."""
    return describe.model(repository, name)


@router.post("/{name}", dependencies=Admin, status_code=status.HTTP_201_CREATED)
async def upload(repository: Repository, name: str,
                 symbol: Annotated[UploadFile, File(description="NAME-symbol.json")],
                 params: Annotated[UploadFile, File(description="NAME-0000.params")],
                 config: Annotated[UploadFile | None, File(description="config.json")] = None,
                 version: Annotated[int | None, Form(description="default: next free")] = None,
                 replace: Annotated[bool, Form(description="replace an existing version")] = False,
                 ) -> schemas.VersionDetail:
    """Validate and add a version; answers once it is loaded (admin token required)."""
    number = await repository.add_version(
        name, await symbol.read(), await params.read(), version=version, replace=replace,
        config=None if config is None else await config.read())
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
