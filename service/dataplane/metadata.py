"""Server and model metadata: what the server is, what a model version takes and answers, and
the repository's models and versions with their states, checks and caches.

REST's metadata and management routes and gRPC's ``ServerMetadata`` and ``ModelMetadata`` answer
from here (`service.dataplane.types`), so both describe a model alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.serving.config import TensorConfig
from engine.serving.errors import ModelNotFound, ServingError
from engine.serving.loaded import LoadedVersion, VersionState
from engine.serving.repository import ModelRepository
from engine.serving.validate import checks_of
from service.dataplane import types
from service.tensors import postprocess
from service.tensors.datatypes import BYTES

SERVER_NAME = "hybridserve"
VERSION = "0.1.0"
EXTENSIONS = ["binary_tensor_data", "classification", "model_repository"]
PLATFORM = "mxnet_mxnet"  # the Open Inference Protocol's name for MXNet


def server() -> types.ServerMetadata:
    """The server's name, version and protocol extensions."""
    return types.ServerMetadata(name=SERVER_NAME, version=VERSION, extensions=EXTENSIONS)


def tensors(specs: Sequence[TensorConfig] | None) -> list[types.TensorMetadata]:
    """Tensor metadata from config entries, as clients send and receive them. An input with a
    preprocess pipeline takes BYTES: ``[-1]`` (one encoded image or text a row) or ``[-1, 2]``
    (a text pipeline of pairs); the inputs a text pipeline fills are left out (the completed
    config keeps them, for clients that tokenise themselves). Outputs with a postprocess are
    shown as it answers them."""
    if any(spec.postprocess is not None for spec in specs or ()):
        return [types.TensorMetadata(name=name, datatype=datatype, shape=shape)
                for name, datatype, shape in postprocess.metadata(specs or ())]
    filled = {name for spec in specs or () if spec.preprocess is not None
              and spec.preprocess.text is not None for name in spec.preprocess.text.filled}
    return [_input_metadata(spec) for spec in specs or () if spec.name not in filled]


def _input_metadata(spec: TensorConfig) -> types.TensorMetadata:
    if spec.preprocess is None:
        return types.TensorMetadata(name=spec.name, datatype=spec.datatype,
                                    shape=list(spec.shape))
    text = spec.preprocess.text
    return types.TensorMetadata(name=spec.name, datatype=BYTES,
                                shape=[-1] if text is None else text.wire_shape)


def versions(repository: ModelRepository, name: str) -> list[types.VersionInfo]:
    """Every version of `name` with its state; 404 when the repository does not know it."""
    rows = [types.VersionInfo(version=row.version, state=row.state.value, reason=row.reason)
            for row in repository.index() if row.name == name]
    if not rows:
        repository.get(name)  # raises InvalidName, ModelNotFound or ModelNotReady
        raise ModelNotFound(f"model {name!r} is not in the repository")
    return rows


def model_metadata(repository: ModelRepository, name: str,
                   version: str | None) -> types.ModelMetadata:
    """V2 model metadata of a ready version (the newest when `version` is None or empty)."""
    handle = repository.get(name, version or None)
    ready = [str(info.version) for info in versions(repository, handle.name)
             if info.state == VersionState.READY]
    return types.ModelMetadata(name=handle.name, versions=ready, platform=PLATFORM,
                               inputs=tensors(handle.served_inputs),
                               outputs=tensors(handle.served_outputs))


def model_ready(repository: ModelRepository, name: str, version: str | None) -> types.ModelReady:
    """A ready version's readiness (the newest when `version` is None or empty).

    Raises:
        ModelNotReady: the repository knows the version, but it is not serving.
        InvalidName, ModelNotFound, VersionNotFound: it does not know it.
    """
    return types.ModelReady(name=repository.get(name, version or None).name, ready=True)


def models(repository: ModelRepository) -> list[types.ModelSummary]:
    """Every model with its versions."""
    grouped: dict[str, list[types.VersionInfo]] = {}
    for row in repository.index():
        grouped.setdefault(row.name, []).append(
            types.VersionInfo(version=row.version, state=row.state.value, reason=row.reason))
    return [types.ModelSummary(name=name, versions=rows) for name, rows in grouped.items()]


def model(repository: ModelRepository, name: str) -> types.ModelDetail:
    """Versions of `name`, with the config and tensors of its newest ready version."""
    rows = versions(repository, name)
    handle = _loaded(repository, name)
    return types.ModelDetail(name=name, versions=rows,
                             ready_version=None if handle is None else handle.version,
                             **_described(handle), caches=caches(handle))


def _loaded(repository: ModelRepository, name: str,
            number: int | None = None) -> LoadedVersion | None:
    """The ready version (the newest when `number` is None), or None when none is."""
    try:
        return repository.get(name, number)
    except ServingError:
        return None


def _described(handle: LoadedVersion | None) -> dict[str, Any]:
    """A loaded version's config, tensors and checks (all None or empty without one)."""
    return {"config": None if handle is None else handle.config.model_dump(mode="json"),
            "inputs": tensors(handle.served_inputs if handle else None),
            "outputs": tensors(handle.served_outputs if handle else None),
            "checks": checks(handle)}


def caches(handle: LoadedVersion | None) -> dict[str, types.CacheStats] | None:
    """Entries, capacity and evictions of the model's per-signature caches, when it has any."""
    stats = None if handle is None else getattr(handle.model, "cache_stats", None)
    if stats is None:
        return None
    return {name: types.CacheStats(**values) for name, values in stats().items()}


def version(repository: ModelRepository, name: str, number: int) -> types.VersionDetail:
    """One version's state, and its config and tensors when it is loaded."""
    row = next((info for info in versions(repository, name) if info.version == number), None)
    handle = _loaded(repository, name, number)
    return types.VersionDetail(
        name=name, version=number, state=row.state if row else VersionState.UNAVAILABLE.value,
        reason=row.reason if row else "not on disk", **_described(handle))


def serving_versions(repository: ModelRepository, name: str) -> list[int]:
    """The versions of `name` serving now, lowest first."""
    return [row.version for row in repository.index()
            if row.name == name and row.state == VersionState.READY]


def uploaded(repository: ModelRepository, name: str, number: int, served: list[int],
             previous: LoadedVersion | None) -> types.UploadDetail:
    """An upload's answer: version `number`'s detail, and what changed for clients of the name
    since `served` (the versions serving before) and `previous` (the newest of them)."""
    detail = version(repository, name, number)
    new = _loaded(repository, name, number)
    changes = [] if previous is None or new is None else (
        _changes("input", tensors(previous.served_inputs), detail.inputs)
        + _changes("output", tensors(previous.served_outputs), detail.outputs))
    return types.UploadDetail(
        **detail.model_dump(), previous_version=None if previous is None else previous.version,
        stopped_serving=sorted(set(served) - set(serving_versions(repository, name))),
        inputs_changed=any(change.kind == "input" for change in changes),
        outputs_changed=any(change.kind == "output" for change in changes),
        tensor_changes=changes)


def _changes(kind: str, before: Sequence[types.TensorMetadata],
             after: Sequence[types.TensorMetadata]) -> list[types.TensorChange]:
    """The tensors of one kind added, removed, or with another datatype or shape, by name."""
    old = {tensor.name: tensor for tensor in before}
    new = {tensor.name: tensor for tensor in after}
    return [types.TensorChange(kind=kind, name=name, before=old.get(name), after=new.get(name))
            for name in [*old, *(name for name in new if name not in old)]
            if old.get(name) != new.get(name)]


def checks(handle: LoadedVersion | None) -> types.ValidationChecks | None:
    """What validation checked when `handle`'s version was loaded (None: not loaded here)."""
    record = None if handle is None else checks_of(handle.model)
    return None if record is None else types.ValidationChecks.model_validate(record.as_dict())
