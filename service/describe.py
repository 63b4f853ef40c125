"""Repository state as response schemas (metadata, index rows, model details)."""

from __future__ import annotations

from collections.abc import Sequence

from engine.serving.config import TensorConfig
from engine.serving.errors import ModelNotFound, ServingError
from engine.serving.loaded import LoadedVersion, VersionState
from engine.serving.repository import ModelRepository
from engine.serving.validate import checks_of
from service import postprocess_outputs, schemas

PLATFORM = "mxnet_mxnet"  # the Open Inference Protocol's name for MXNet


def tensors(specs: Sequence[TensorConfig] | None) -> list[schemas.TensorMetadata]:
    """Tensor metadata from config entries, as clients send and receive them. An input with a
    preprocess pipeline takes BYTES: ``[-1]`` (one encoded image or text a row) or ``[-1, 2]``
    (a text pipeline of pairs); the inputs a text pipeline fills are left out (the completed
    config keeps them, for clients that tokenise themselves). Outputs with a postprocess are
    shown as it answers them."""
    if any(spec.postprocess is not None for spec in specs or ()):
        return [schemas.TensorMetadata(name=name, datatype=datatype, shape=shape)
                for name, datatype, shape in postprocess_outputs.metadata(specs or ())]
    filled = {name for spec in specs or () if spec.preprocess is not None
              and spec.preprocess.text is not None for name in spec.preprocess.text.filled}
    return [_input_metadata(spec) for spec in specs or () if spec.name not in filled]


def _input_metadata(spec: TensorConfig) -> schemas.TensorMetadata:
    if spec.preprocess is None:
        return schemas.TensorMetadata(name=spec.name, datatype=spec.datatype,
                                      shape=list(spec.shape))
    text = spec.preprocess.text
    return schemas.TensorMetadata(name=spec.name, datatype="BYTES",
                                  shape=[-1] if text is None else text.wire_shape)


def versions(repository: ModelRepository, name: str) -> list[schemas.VersionInfo]:
    """Every version of `name` with its state; 404 when the repository does not know it."""
    rows = [schemas.VersionInfo(version=row.version, state=row.state.value, reason=row.reason)
            for row in repository.index() if row.name == name]
    if not rows:
        repository.get(name)  # raises InvalidName, ModelNotFound or ModelNotReady
        raise ModelNotFound(f"model {name!r} is not in the repository")
    return rows


def metadata(repository: ModelRepository, handle: LoadedVersion) -> schemas.ModelMetadata:
    """V2 model metadata of a ready version."""
    ready = [str(info.version) for info in versions(repository, handle.name)
             if info.state == VersionState.READY]
    return schemas.ModelMetadata(name=handle.name, versions=ready, platform=PLATFORM,
                                 inputs=tensors(handle.config.inputs),
                                 outputs=tensors(handle.config.outputs))


def index(repository: ModelRepository, ready: bool | None) -> list[schemas.VersionStatus]:
    """Rows of the V2 repository index, optionally only (not) ready ones."""
    return [schemas.VersionStatus(name=row.name, version=str(row.version), state=row.state.value,
                                  reason=row.reason)
            for row in repository.index()
            if ready is None or (row.state == VersionState.READY) == ready]


def models(repository: ModelRepository) -> list[schemas.ModelSummary]:
    """Every model with its versions."""
    grouped: dict[str, list[schemas.VersionInfo]] = {}
    for row in repository.index():
        grouped.setdefault(row.name, []).append(
            schemas.VersionInfo(version=row.version, state=row.state.value, reason=row.reason))
    return [schemas.ModelSummary(name=name, versions=rows) for name, rows in grouped.items()]


def model(repository: ModelRepository, name: str) -> schemas.ModelDetail:
    """Versions of `name`, with the config and tensors of its newest ready version."""
    rows = versions(repository, name)
    try:
        handle: LoadedVersion | None = repository.get(name)
    except ServingError:
        handle = None
    return schemas.ModelDetail(
        name=name, versions=rows, ready_version=None if handle is None else handle.version,
        config=None if handle is None else handle.config.model_dump(mode="json"),
        inputs=tensors(handle.config.inputs if handle else None),
        outputs=tensors(handle.config.outputs if handle else None), checks=checks(handle),
        caches=caches(handle))


def caches(handle: LoadedVersion | None) -> dict[str, schemas.CacheStats] | None:
    """Entries, capacity and evictions of the model's per-signature caches, when it has any."""
    stats = None if handle is None else getattr(handle.model, "cache_stats", None)
    if stats is None:
        return None
    return {name: schemas.CacheStats(**values) for name, values in stats().items()}


def version(repository: ModelRepository, name: str, number: int) -> schemas.VersionDetail:
    """One version's state, and its config and tensors when it is loaded."""
    row = next((info for info in versions(repository, name) if info.version == number), None)
    try:
        handle: LoadedVersion | None = repository.get(name, number)
    except ServingError:
        handle = None
    return schemas.VersionDetail(
        name=name, version=number, state=row.state if row else VersionState.UNAVAILABLE.value,
        reason=row.reason if row else "not on disk",
        config=None if handle is None else handle.config.model_dump(mode="json"),
        inputs=tensors(handle.config.inputs if handle else None),
        outputs=tensors(handle.config.outputs if handle else None), checks=checks(handle))


def checks(handle: LoadedVersion | None) -> schemas.ValidationChecks | None:
    """What validation checked when `handle`'s version was loaded (None: not loaded here)."""
    record = None if handle is None else checks_of(handle.model)
    return None if record is None else schemas.ValidationChecks.model_validate(record.as_dict())
