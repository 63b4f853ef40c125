"""`ModelRepository`: the models of a directory, loaded, versioned and kept in step with disk."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from engine.errors import EngineError
from engine.serving import disk
from engine.serving.batcher import BatchingPolicy, DynamicBatcher
from engine.serving.config import CONFIG_NAME, ModelConfig, parse_config
from engine.serving.errors import (
    Conflict,
    InvalidModel,
    MemoryBudgetExceeded,
    ModelNotFound,
    ModelNotReady,
    VersionNotFound,
)
from engine.serving.loaded import LoadedVersion, VersionState, VersionStatus
from engine.serving.manifest import (
    MODEL_FILES,
    PARAMS_NAME,
    read_manifest,
    verify_manifest,
    write_bytes_durably,
    write_manifest,
)
from engine.serving.names import check_model_name, check_version
from engine.serving.validate import Loader, Validated, default_loader, load_and_validate

log = logging.getLogger(__name__)
T = TypeVar("T")
Source = bytes | str | os.PathLike[str]
Identity = tuple[str | None, str | None]


class ModelRepository:
    """Serve the models of one directory; several instances may share it and converge by polling.

    Args:
        root: the repository directory (created if missing).
        loader: builds a model from (symbol path, params path, device=...); `engine.load_model`.
        device: used when a model's config names none.
        memory_budget_bytes: refuse loads that would take the total past this (None: no limit).
        poll_interval_s: re-scan the directory this often after `start` (None: only on demand).
        require_manifest: skip version directories without ``MANIFEST.json`` (still copying).
        compute_threads: worker threads shared by all batchers.
        stale_tmp_age_s: at `start`, delete staging directories untouched for this long.

    Example:
        >>> repo = ModelRepository("models", poll_interval_s=5)
        >>> await repo.start()
        >>> version = await repo.add_version("mlp", symbol_bytes, params_bytes)
        >>> outputs = await repo.infer("mlp", {"data": x})
        >>> await repo.close()
    """

    def __init__(self, root: str | os.PathLike[str], *, loader: Loader | None = None,
                 device: str = "cpu", memory_budget_bytes: int | None = None,
                 poll_interval_s: float | None = None, require_manifest: bool = True,
                 compute_threads: int = 2, stale_tmp_age_s: float = 600.0) -> None:
        self.root = Path(root)
        self.loader = loader or default_loader
        self.device = device
        self.memory_budget_bytes = memory_budget_bytes
        self.poll_interval_s = poll_interval_s
        self.require_manifest = require_manifest
        self.stale_tmp_age_s = stale_tmp_age_s
        self._compute = ThreadPoolExecutor(compute_threads, thread_name_prefix="serving-compute")
        self._io = ThreadPoolExecutor(1, thread_name_prefix="serving-load")
        self._lock = asyncio.Lock()
        self._disk: dict[str, disk.DiskModel] = {}
        self._loaded: dict[str, dict[int, LoadedVersion]] = {}
        self._reasons: dict[tuple[str, int], str] = {}
        self._failed: dict[tuple[str, int], Identity] = {}
        self._loading: set[tuple[str, int]] = set()
        self._retiring: set[LoadedVersion] = set()
        self._drains: set[asyncio.Task[None]] = set()
        self._unloaded: set[str] = set()
        self._pinned: dict[str, set[int]] = {}
        self._excluded: dict[str, set[int]] = {}
        self._poll_task: asyncio.Task[None] | None = None

    # ----- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Remove stale staging directories, load what the directory holds, start polling."""
        self.root.mkdir(parents=True, exist_ok=True)
        await self._thread(disk.remove_stale, self.root, self.stale_tmp_age_s)
        await self.poll()
        if self.poll_interval_s and self._poll_task is None:
            self._poll_task = asyncio.get_running_loop().create_task(self._poll_forever())

    async def close(self) -> None:
        """Stop polling, drain and unload every version, stop the worker threads."""
        if self._poll_task is not None:
            self._poll_task.cancel()
            await asyncio.gather(self._poll_task, return_exceptions=True)
            self._poll_task = None
        async with self._lock:
            for name in list(self._loaded):
                for version in list(self._loaded[name]):
                    self._retire(name, version)
        await asyncio.gather(*self._drains, return_exceptions=True)
        self._compute.shutdown(wait=False)
        self._io.shutdown(wait=False)

    async def _poll_forever(self) -> None:
        assert self.poll_interval_s is not None
        while True:
            await asyncio.sleep(self.poll_interval_s)
            try:
                await self.poll()
            except Exception:  # noqa: BLE001 - polling must survive a bad directory state
                log.exception("polling %s failed", self.root)

    async def poll(self) -> None:
        """Re-scan the directory and load, replace or unload versions to match it."""
        async with self._lock:
            self._disk = await self._thread(disk.scan, self.root,
                                            require_manifest=self.require_manifest)
            for name in sorted(set(self._disk) | set(self._loaded)):
                await self._reconcile(name)

    # ----- reading -----------------------------------------------------------------------------

    def get(self, name: str, version: int | str | None = None) -> LoadedVersion:
        """The ready version (the highest one when `version` is None).

        Raises:
            InvalidName, ModelNotFound, VersionNotFound, ModelNotReady.
        """
        check_model_name(name)
        versions = self._loaded.get(name)
        if name not in self._disk and not versions:
            raise ModelNotFound(f"model {name!r} is not in the repository")
        if version is None:
            if not versions:
                raise ModelNotReady(f"model {name!r} has no version ready: {self._why(name)}")
            return versions[max(versions)]
        number = check_version(version)
        if versions and number in versions:
            return versions[number]
        if number in self._disk.get(name, disk.DiskModel(name, None)).versions:
            raise ModelNotReady(f"model {name!r} version {number} is not ready: "
                                f"{self._reason(name, number)}")
        raise VersionNotFound(f"model {name!r} has no version {number}; versions on disk: "
                              f"{sorted(self._disk[name].versions) if name in self._disk else []}")

    async def infer(self, name: str, inputs: Mapping[str, Any], *,
                    version: int | str | None = None,
                    timeout_s: float | None = None) -> dict[str, np.ndarray]:
        """Run one request on the named model (see `DynamicBatcher.submit` for its errors)."""
        for attempt in range(3):
            handle = self.get(name, version)
            try:
                return await handle.infer(inputs, timeout_s=timeout_s)
            except ModelNotReady:
                # The version was swapped out between look-up and queueing: use its successor.
                if attempt == 2 or not handle.batcher.closing:
                    raise
        raise AssertionError("unreachable")

    def index(self) -> list[VersionStatus]:
        """State of every version known on disk or in memory, sorted by name and version."""
        rows = []
        for name in sorted(set(self._disk) | set(self._loaded)):
            loaded = self._loaded.get(name, {})
            on_disk = self._disk[name].versions if name in self._disk else {}
            for version in sorted(set(loaded) | set(on_disk)):
                if version in loaded:
                    rows.append(VersionStatus(name, version, VersionState.READY))
                elif (name, version) in self._loading:
                    rows.append(VersionStatus(name, version, VersionState.LOADING))
                elif any(r.name == name and r.version == version for r in self._retiring):
                    rows.append(VersionStatus(name, version, VersionState.UNLOADING))
                else:
                    rows.append(VersionStatus(name, version, VersionState.UNAVAILABLE,
                                              self._reason(name, version)))
        return rows

    def loaded(self) -> list[LoadedVersion]:
        """Every ready version (for metrics: ``.batcher.stats``, ``.batcher.queue_depth``)."""
        return [self._loaded[name][version] for name in sorted(self._loaded)
                for version in sorted(self._loaded[name])]

    def memory_bytes(self) -> int:
        """Bytes held by loaded and draining versions (parameters plus planned activations)."""
        versions = [lv for lvs in self._loaded.values() for lv in lvs.values()]
        return sum(lv.memory().total for lv in [*versions, *self._retiring])

    # ----- explicit control ------------------------------------------------------------------

    async def load(self, name: str, version: int | str | None = None) -> None:
        """Load a model by its version policy (or one extra version); raise if a load fails."""
        check_model_name(name)
        async with self._lock:
            model = await self._rescan(name)
            self._unloaded.discard(name)
            if version is None:
                self._excluded.pop(name, None)
            else:
                number = self._existing_version(model, version)
                self._pinned.setdefault(name, set()).add(number)
                self._excluded.get(name, set()).discard(number)
            await self._reconcile(name, strict=True)

    async def unload(self, name: str, version: int | str | None = None) -> None:
        """Unload a model (all versions) or one version; polling will not reload it."""
        check_model_name(name)
        async with self._lock:
            model = await self._rescan(name)
            if version is None:
                self._unloaded.add(name)
                self._pinned.pop(name, None)
            else:
                number = self._existing_version(model, version)
                self._excluded.setdefault(name, set()).add(number)
                self._pinned.get(name, set()).discard(number)
            await self._reconcile(name)

    async def delete_model(self, name: str) -> None:
        """Remove a model directory (atomically) and unload all its versions."""
        check_model_name(name)
        async with self._lock:
            await self._rescan(name)
            await self._thread(disk.remove_atomically, self.root, self.root / name)
            self._disk.pop(name, None)
            self._unloaded.discard(name)
            self._pinned.pop(name, None)
            self._excluded.pop(name, None)
            await self._reconcile(name)

    async def delete_version(self, name: str, version: int | str) -> None:
        """Remove one version directory (atomically) and unload it."""
        check_model_name(name)
        async with self._lock:
            number = self._existing_version(await self._rescan(name), version)
            await self._thread(disk.remove_atomically, self.root, self.root / name / str(number))
            await self._rescan(name)
            await self._reconcile(name)

    async def add_version(self, name: str, symbol: Source, params: Source, *,
                          config: ModelConfig | bytes | str | dict[str, Any] | None = None,
                          version: int | str | None = None, replace: bool = False) -> int:
        """Validate a new version in a staging directory, move it into place, serve it.

        `symbol`/`params` are bytes or paths; `config`, when given, becomes the model's
        ``config.json``. The version number defaults to one past the highest on disk. (To
        write the files straight into the staging directory, use `staging` and `add_staged`.)

        Returns:
            The version number.

        Raises:
            InvalidName, InvalidModel (validation failed), Conflict (the version exists and
            `replace` is False), MemoryBudgetExceeded.
        """
        check_model_name(name)
        async with self.staging() as staging:
            await self._thread(_stage, staging, symbol, params)
            return await self.add_staged(name, staging, config=config, version=version,
                                         replace=replace)

    @contextlib.asynccontextmanager
    async def staging(self) -> AsyncIterator[Path]:
        """A fresh staging directory inside the repository, removed on exit whatever happened.

        Write ``model-symbol.json`` and ``model-0000.params`` into it, then pass it to
        `add_staged`, which moves it into place: nothing is left behind by a failed upload.

        Example:
            >>> async with repo.staging() as staging:
            ...     (staging / "model-symbol.json").write_bytes(symbol_bytes)
            ...     (staging / "model-0000.params").write_bytes(params_bytes)
            ...     version = await repo.add_staged("mlp", staging)
        """
        path = await self._thread(disk.new_staging_dir, self.root)
        try:
            yield path
        finally:
            await self._thread(disk.remove_tree, path)

    async def add_staged(self, name: str, staging: Path, *,
                         config: ModelConfig | bytes | str | dict[str, Any] | None = None,
                         version: int | str | None = None, replace: bool = False) -> int:
        """Validate the model files written to `staging` (from `staging()`), move them into
        place as a new version and serve it; arguments, result and errors as `add_version`."""
        check_model_name(name)
        number = None if version is None else check_version(version)
        where = f"upload of model {name!r}" + ("" if number is None else f" version {number}")
        parsed = (config if isinstance(config, ModelConfig) or config is None
                  else parse_config(config, f"{where}: config"))
        effective = parsed or await self._thread(_read_model_config, self.root / name)
        validated = await self._thread(self._validate, staging, effective, where, False)
        manifest = await self._thread(write_manifest, staging)
        async with self._lock:
            preloaded = self._wrap(name, number or 0, validated, (manifest.digest, None))
            await self._check_budget(await self._measure(preloaded), where)
            number = await self._thread(self._place, name, staging, number, replace)
            if parsed is not None:  # only now: a refused upload must change nothing
                await self._thread(_write_config, self.root / name, parsed)
            model = await self._rescan(name)
            preloaded.renumber(number, model.config_digest)
            self._unloaded.discard(name)
            self._failed.pop((name, number), None)
            await self._reconcile(name, preloaded=preloaded)
        return number

    # ----- internals -------------------------------------------------------------------------

    async def _thread(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._io, functools.partial(function, *args, **kwargs))

    async def _rescan(self, name: str) -> disk.DiskModel:
        model_dir = self.root / name
        if not await self._thread(model_dir.is_dir):
            self._disk.pop(name, None)
            raise ModelNotFound(f"model {name!r} is not in the repository {self.root}")
        model = await self._thread(disk.scan_model, model_dir,
                                   require_manifest=self.require_manifest)
        self._disk[name] = model
        return model

    def _existing_version(self, model: disk.DiskModel, version: int | str) -> int:
        number = check_version(version)
        if number not in model.versions and number not in self._loaded.get(model.name, {}):
            raise VersionNotFound(f"model {model.name!r} has no version {number}; versions on "
                                  f"disk: {sorted(model.versions)}")
        return number

    async def _reconcile(self, name: str, *, strict: bool = False,
                         preloaded: LoadedVersion | None = None) -> None:
        """Make the loaded versions of `name` match disk, the version policy and requests."""
        loaded = self._loaded.setdefault(name, {})
        model = self._disk.get(name)
        if model is None or name in self._unloaded:
            for version in list(loaded):
                self._retire(name, version)
            if model is None:
                del self._loaded[name]
            return
        try:
            config = (ModelConfig() if model.config_bytes is None else
                      parse_config(model.config_bytes, str(self.root / name / CONFIG_NAME)))
        except InvalidModel as error:
            for version in model.versions:
                self._reasons[(name, version)] = str(error)
            if strict:
                raise
            return
        complete = {v for v, entry in model.versions.items() if entry.manifest_digest}
        wanted = ((set(config.version_policy.select(complete)) | self._pinned.get(name, set()))
                  & complete) - self._excluded.get(name, set())
        first_error = await self._load_wanted(model, config, wanted, strict=strict,
                                              preloaded=preloaded)
        for version in list(loaded):
            # A failed load keeps the previous versions serving.
            if version not in model.versions or (version not in wanted and first_error is None):
                self._retire(name, version)
        self._explain_unloaded(model, wanted)
        if strict and first_error is not None:
            raise first_error

    async def _load_wanted(self, model: disk.DiskModel, config: ModelConfig, wanted: set[int],
                           *, strict: bool, preloaded: LoadedVersion | None) -> Exception | None:
        """Load and publish each wanted version not already serving as it is on disk; the
        first load error. Without `strict`, a version that failed as it is stays failed."""
        name, loaded = model.name, self._loaded[model.name]
        first_error: Exception | None = None
        for version in sorted(wanted):
            identity = (model.versions[version].manifest_digest, model.config_digest)
            current = loaded.get(version)
            if current is not None and current.identity == identity:
                continue
            if preloaded is not None and (preloaded.version, preloaded.identity) == (version,
                                                                                     identity):
                self._publish(preloaded)
                continue
            if not strict and self._failed.get((name, version)) == identity:
                first_error = first_error or InvalidModel(self._reason(name, version))
                continue
            try:
                self._publish(await self._load_version(name, version, config, identity))
            except (EngineError, OSError) as error:
                log.warning("model %r version %d: load failed: %s", name, version, error)
                self._reasons[(name, version)] = str(error)
                self._failed[(name, version)] = identity
                first_error = first_error or error
        return first_error

    def _explain_unloaded(self, model: disk.DiskModel, wanted: set[int]) -> None:
        """Record why each version on disk but not loaded is not serving."""
        for version in model.versions.keys() - self._loaded[model.name].keys():
            entry = model.versions[version]
            if entry.problem is not None:
                self._reasons[(model.name, version)] = entry.problem
            elif version not in wanted and (model.name, version) not in self._failed:
                self._reasons[(model.name, version)] = "not selected by version_policy or unloaded"

    async def _load_version(self, name: str, version: int, config: ModelConfig,
                            identity: Identity) -> LoadedVersion:
        version_dir = self.root / name / str(version)
        where = f"model {name!r} version {version}"
        params_size = await self._thread(lambda: (version_dir / PARAMS_NAME).stat().st_size)
        await self._check_budget(params_size, where)
        self._loading.add((name, version))
        try:
            validated = await self._thread(self._validate, version_dir, config, where, True)
        finally:
            self._loading.discard((name, version))
        loaded = self._wrap(name, version, validated, identity)
        await self._check_budget(await self._measure(loaded), where)
        return loaded

    def _validate(self, version_dir: Path, config: ModelConfig, where: str,
                  verify: bool) -> Validated:
        if verify:
            manifest = read_manifest(version_dir)
            if manifest is None and self.require_manifest:
                raise InvalidModel(f"{where}: {version_dir} has no MANIFEST.json")
            if manifest is not None:
                verify_manifest(version_dir, manifest)
        return load_and_validate(version_dir, config, loader=self.loader,
                                 device=config.device or self.device, where=where,
                                 memory_cap_bytes=self.memory_budget_bytes)

    def _wrap(self, name: str, version: int, validated: Validated,
              identity: Identity) -> LoadedVersion:
        policy = BatchingPolicy.from_config(validated.config)
        batcher = DynamicBatcher(validated.model.infer, policy, executor=self._compute,
                                 name=f"model {name!r} version {version}")
        return LoadedVersion(name, version, validated.model, validated.config, batcher,
                             manifest_digest=identity[0], config_digest=identity[1])

    async def _measure(self, version: LoadedVersion) -> int:
        """Bytes `version` holds, measured off the event loop: measuring compiles the plan of
        its largest batch (half a second for a ResNet-18 at batch 32)."""
        return (await self._thread(version.memory)).total

    async def _check_budget(self, needed: int, where: str) -> None:
        budget = self.memory_budget_bytes
        if budget is None:
            return
        accounted = [*(lv for lvs in self._loaded.values() for lv in lvs.values()),
                     *self._retiring]
        used = await self._thread(lambda: sum(lv.memory().total for lv in accounted))
        if used + needed > budget:
            raise MemoryBudgetExceeded(
                f"{where}: needs {needed} bytes, but {used} of the {budget}-byte memory budget "
                "are in use; unload a model or raise the budget")

    def _publish(self, new: LoadedVersion) -> None:
        """Make `new` the serving copy of its version (one dict assignment), retire the old."""
        loaded = self._loaded.setdefault(new.name, {})
        old = loaded.get(new.version)
        new.batcher.start()
        loaded[new.version] = new
        self._reasons.pop((new.name, new.version), None)
        self._failed.pop((new.name, new.version), None)
        if old is not None:
            self._drain(old)

    def _retire(self, name: str, version: int) -> None:
        self._drain(self._loaded[name].pop(version))
        self._reasons[(name, version)] = "unloaded"

    def _drain(self, old: LoadedVersion) -> None:
        """Let in-flight requests on `old` finish in the background, then drop it."""
        self._retiring.add(old)

        async def drain() -> None:
            try:
                await old.batcher.close()
            finally:
                self._retiring.discard(old)

        task = asyncio.get_running_loop().create_task(drain())
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    def _place(self, name: str, staging: Path, number: int | None, replace: bool) -> int:
        model_dir = self.root / name
        model_dir.mkdir(exist_ok=True)
        if number is None:
            for _ in range(100):
                existing = disk.scan_model(model_dir, require_manifest=False).versions
                candidate = max(existing, default=0) + 1
                try:
                    disk.move_into_place(staging, model_dir / str(candidate))
                    return candidate
                except FileExistsError:
                    continue  # another writer took that number first
            raise Conflict(f"model {name!r}: could not pick a free version number")
        target = model_dir / str(number)
        if target.exists() and replace:
            disk.replace_dir(self.root, staging, target)
            return number
        try:
            disk.move_into_place(staging, target)
        except FileExistsError:
            raise Conflict(f"model {name!r} version {number} already exists; delete it first "
                           "or ask to replace it") from None
        return number

    def _why(self, name: str) -> str:
        reasons = [f"version {v}: {self._reason(name, v)}"
                   for v in sorted(self._disk[name].versions)] if name in self._disk else []
        return "; ".join(reasons) or "no complete version on disk"

    def _reason(self, name: str, version: int) -> str:
        return self._reasons.get((name, version), "not loaded")


def _stage(staging: Path, symbol: Source, params: Source) -> None:
    for file_name, source in zip(MODEL_FILES, (symbol, params)):
        data = source if isinstance(source, bytes) else Path(os.fspath(source))
        disk.write_file(staging / file_name, data)


def _read_model_config(model_dir: Path) -> ModelConfig:
    try:
        data = (model_dir / CONFIG_NAME).read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return ModelConfig()
    return parse_config(data, str(model_dir / CONFIG_NAME))


def _write_config(model_dir: Path, config: ModelConfig) -> None:
    model_dir.mkdir(exist_ok=True)
    data = config.model_dump_json(indent=2, exclude_none=True).encode() + b"\n"
    write_bytes_durably(model_dir / CONFIG_NAME, data)
