"""Model repository extension of the Open Inference Protocol (index, load, unload)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body

from service import schemas
from service.deps import Admin, Repository
from service.describe import index
from service.openapi import ERRORS

router = APIRouter(prefix="/v2/repository", tags=["repository"], responses=ERRORS)


@router.post("/index")
async def repository_index(repository: Repository,
                           body: Annotated[schemas.IndexRequest | None, Body()] = None
                           ) -> list[schemas.VersionStatus]:
    """Every version known on disk or in memory with its state."""
    return index(repository, body.ready if body is not None else None)


@router.post("/models/{name}/load", dependencies=Admin)
async def load(repository: Repository, name: str) -> schemas.Done:
    """Load a model by its version policy (admin token required)."""
    await repository.load(name)
    return schemas.Done(name=name, action="loaded")


@router.post("/models/{name}/unload", dependencies=Admin)
async def unload(repository: Repository, name: str) -> schemas.Done:
    """Unload every version of a model (admin token required)."""
    await repository.unload(name)
    return schemas.Done(name=name, action="unloaded")
