"""The model repository as operations: index, load, unload, delete and upload.

REST's repository and management routes and gRPC's ``Repository*`` calls run these; each side
reads its own wire format (and checks the admin token) first. An upload's body is streamed by
the caller (``receive``: REST's multipart reader, `service.rest.uploads`) into the staging
directory the repository then validates and renames into place, at most `UploadSlots.limit` at
once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from engine.serving.loaded import VersionState
from engine.serving.names import check_model_name, check_version
from engine.serving.repository import ModelRepository
from service.dataplane import metadata, types
from service.errors import ServiceError

RETRY_AFTER_S = 5


def index(repository: ModelRepository, ready: bool | None) -> list[types.VersionStatus]:
    """Rows of the V2 repository index, optionally only (not) ready ones."""
    return [types.VersionStatus(name=row.name, version=str(row.version), state=row.state.value,
                                reason=row.reason)
            for row in repository.index()
            if ready is None or (row.state == VersionState.READY) == ready]


async def load(repository: ModelRepository, name: str, version: str | None = None
               ) -> types.Done:
    """Load a model by its version policy, or one more version."""
    await repository.load(name, version)
    return types.Done(name=name, version=_number(version), action="loaded")


async def unload(repository: ModelRepository, name: str, version: str | None = None
                 ) -> types.Done:
    """Unload a model, or one version of it."""
    await repository.unload(name, version)
    return types.Done(name=name, version=_number(version), action="unloaded")


async def delete(repository: ModelRepository, name: str, version: str | None = None
                 ) -> types.Done:
    """Delete a model and all its versions, or one version."""
    if version is None:
        await repository.delete_model(name)
    else:
        await repository.delete_version(name, version)
    return types.Done(name=name, version=_number(version), action="deleted")


def _number(version: str | None) -> int | None:
    """A version from a request's path or query (checked by the operation) as the integer
    every management answer gives, as an upload's does."""
    return None if version is None else check_version(version)


class UploadsBusy(ServiceError):
    """As many uploads as allowed are being received; retry after `RETRY_AFTER_S` seconds."""

    status = 503


class UploadSlots:
    """At most `limit` uploads received and validated at once (each holds a staging directory,
    a worker thread and, while validating, its model in memory)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Take a slot for the block, or raise `UploadsBusy` (503 with Retry-After)."""
        if self.active >= self.limit:
            raise UploadsBusy(f"{self.active} model uploads are already in progress, the most "
                              "this server takes at once (max_concurrent_uploads); retry later",
                              {"Retry-After": str(RETRY_AFTER_S)})
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1


@dataclass(frozen=True)
class UploadForm:
    """The small fields of an upload; its model files are already in the staging directory."""

    config: bytes | None
    version: str | None
    replace: bool


async def upload(repository: ModelRepository, slots: UploadSlots, name: str,
                 receive: Callable[[Path], Awaitable[UploadForm]]) -> types.UploadDetail:
    """Add a version of `name` from the files `receive` writes into a staging directory;
    answers once it is validated and loaded, saying which versions stopped serving and how
    the inputs and outputs differ from the version that served before. The name is checked
    before `receive` reads a byte, and the slot is taken before the staging directory is
    made."""
    check_model_name(name)
    with slots.hold():
        async with repository.staging() as staging:
            form = await receive(staging)
            served = metadata.serving_versions(repository, name)
            previous = repository.get(name, max(served)) if served else None
            number = await repository.add_staged(name, staging, config=form.config,
                                                 version=form.version, replace=form.replace)
    return metadata.uploaded(repository, name, number, served, previous)
