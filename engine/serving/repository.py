"""`ModelRepository`: the models of a directory, loaded, versioned and kept in step with disk."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from engine.cpu import denormals
from engine.errors import EngineError
from engine.serving import control, disk
from engine.serving.batcher import BatchingPolicy, BatchRun, DynamicBatcher
from engine.serving.config import CONFIG_NAME, ModelConfig, parse_config
from engine.serving.cores import CoreBudget, CoreShare
from engine.serving.errors import (
    Conflict,
    InvalidModel,
    MemoryBudgetExceeded,
    ModelNotFound,
    ModelNotReady,
    ModelNotServing,
    NoRoomToLoad,
    ServingError,
    VersionNotFound,
)
from engine.serving.loaded import LoadedVersion, VersionStatus
from engine.serving.manifest import (
    MODEL_FILES,
    PARAMS_NAME,
    read_manifest,
    verify_manifest,
    write_bytes_durably,
    write_manifest,
)
from engine.serving.names import check_model_name, check_version
from engine.serving.priority_queue import Scheduling
from engine.serving.sequences import SequenceControl
from engine.serving.validate import (
    Loader,
    Validated,
    concurrent_batches,
    default_loader,
    load_and_validate,
    on_gpu,
)
from engine.serving.versions import Identity, Phase, VersionRecord, wanted_versions

log = logging.getLogger(__name__)
T = TypeVar("T")
# Threads running GPU models' batches: each such model runs 2 at once (`concurrent_batches`).
GPU_COMPUTE_THREADS = 2
Source = bytes | str | os.PathLike[str]


class ModelRepository:
    """Serve the models of one directory; several instances may share it and converge by polling.

    Args:
        root: the repository directory (created if missing).
        loader: builds a model from (symbol path, params path, device=...); `engine.load_model`.
        device: used when a model's config names none.
        memory_budget_bytes: a load that would take the total past this first unloads the
            least recently used idle models that are not pinned, and fails when that is not
            enough (None: no limit).
        poll_interval_s: re-scan the directory this often after `start` (None: only on demand).
        models_at_start: the models `start` loads (None: every model in the directory); the
            others stay unloaded, and polling leaves them be, until loaded.
        load_on_demand: `serving_version` loads a model on disk but not loaded.
        require_manifest: skip version directories without ``MANIFEST.json`` (still copying).
        compute_threads: CPU batches of all models computed at once, one thread each. With
            1 (the default) batches queue for the cores and each runs on all of them, as
            `Model.infer` does in process; with more, each should use its share of the cores
            (the server sets BLAS's thread count to cores / compute_threads, docs/threads.md).
            A model with more instances (``instance_group``) than compute threads runs its
            batches on threads of its own; every CPU batch takes its cores from one
            `CoreBudget` first. GPU models run their batches on threads of their own.
        stale_tmp_age_s: at `start`, delete staging directories untouched for this long.
        batch_observer: called with each version's name, number and finished batch
            (`BatchRun`) by the batchers of versions loaded from then on (a tracer's hook).

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
                 compute_threads: int = 1, stale_tmp_age_s: float = 600.0,
                 batch_observer: Callable[[str, int, BatchRun], None] | None = None,
                 models_at_start: Collection[str] | None = None,
                 load_on_demand: bool = False) -> None:
        self.root = Path(root)
        self.loader = loader or default_loader
        self.device = device
        self.memory_budget_bytes = memory_budget_bytes
        self.poll_interval_s = poll_interval_s
        self.require_manifest = require_manifest
        self.stale_tmp_age_s = stale_tmp_age_s
        self.batch_observer = batch_observer
        # Threads that only run kernels flush denormals (engine.cpu.denormals).
        self._compute = ThreadPoolExecutor(compute_threads, thread_name_prefix="serving-compute",
                                           initializer=denormals.flush_here)
        # A GPU model's batches overlap each other's host work (`concurrent_batches`), so they
        # never queue behind the CPU's batches (threads start only when used).
        self._device_compute = ThreadPoolExecutor(GPU_COMPUTE_THREADS,
                                                  thread_name_prefix="serving-gpu")
        # The cores every CPU batch takes its share of while it computes (`CoreBudget`).
        self._cores = CoreBudget(batches=compute_threads)
        self._io = ThreadPoolExecutor(1, thread_name_prefix="serving-load")
        self._lock = asyncio.Lock()
        self._disk: dict[str, disk.DiskModel] = {}  # the directory as last scanned
        self._records: dict[str, dict[int, VersionRecord]] = {}  # everything else per version
        self._unloaded: set[str] = set()  # models unloaded by request: polling leaves them be
        self._closing = False
        self._became_idle = asyncio.Event()  # a loaded copy finished its last request
        self._poll_task: asyncio.Task[None] | None = None
        self.models_at_start = None if models_at_start is None else frozenset(models_at_start)
        self.load_on_demand = load_on_demand
        self.counts = control.ControlCounts()
        self._missing_at_start: set[str] = set()  # models_at_start with no directory
        self._on_demand: dict[str, asyncio.Task[None]] = {}  # one load per model at a time
        self._demand_failed: dict[str, Any] = {}  # disk state whose on-demand load failed
        self._last_size: dict[str, int] = {}  # bytes a model held when last loaded

    # ----- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Remove stale staging directories, load what the directory holds, start polling."""
        self.root.mkdir(parents=True, exist_ok=True)
        await self._thread(disk.remove_stale, self.root, self.stale_tmp_age_s)
        if self.models_at_start is not None:
            on_disk = await self._thread(disk.scan, self.root,
                                         require_manifest=self.require_manifest)
            self._unloaded.update(set(on_disk) - self.models_at_start)
            self._missing_at_start = set(self.models_at_start) - set(on_disk)
            for name in sorted(self._missing_at_start):
                log.error("model %r was asked to load at start but is not in %s", name,
                          self.root)
        await self.poll()
        if self.poll_interval_s and self._poll_task is None:
            self._poll_task = asyncio.get_running_loop().create_task(self._poll_forever())

    async def close(self) -> None:
        """Stop polling, drain and unload every version, stop the worker threads."""
        self._closing = True
        if self._poll_task is not None:
            self._poll_task.cancel()
            await asyncio.gather(self._poll_task, return_exceptions=True)
            self._poll_task = None
        async with self._lock:
            for record in self._all_records():
                if record.serving is not None:
                    self._retire(record)
        drains = [task for record in self._all_records() for task in record.draining.values()]
        await asyncio.gather(*drains, return_exceptions=True)
        self._compute.shutdown(wait=False)
        self._device_compute.shutdown(wait=False)
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
            for name in sorted(set(self._disk) | set(self._records)):
                await self._reconcile(name)

    # ----- reading -----------------------------------------------------------------------------

    def get(self, name: str, version: int | str | None = None) -> LoadedVersion:
        """The ready version (the highest one when `version` is None).

        Raises:
            InvalidName, ModelNotFound, VersionNotFound; ModelNotReady while a load that would
            serve it is under way, ModelNotServing when none is.
        """
        check_model_name(name)
        versions = self._serving(name)
        if name not in self._disk and not versions:
            raise ModelNotFound(f"model {name!r} is not in the repository")
        on_disk = self._disk[name].versions if name in self._disk else {}
        if version is None:
            if not versions:
                raise self._not_ready(name, on_disk,
                                      f"model {name!r} has no version ready: {self._why(name)}")
            found = versions[max(versions)]
            found.touch()
            return found
        number = check_version(version)
        if versions and number in versions:
            versions[number].touch()
            return versions[number]
        if number in on_disk:
            raise self._not_ready(name, [number], f"model {name!r} version {number} is not "
                                  f"ready: {self._reason(name, number)}")
        raise VersionNotFound(f"model {name!r} has no version {number}; versions on disk: "
                              f"{sorted(self._disk[name].versions) if name in self._disk else []}")

    async def infer(self, name: str, inputs: Mapping[str, Any], *,
                    version: int | str | None = None, timeout_s: float | None = None,
                    handle: LoadedVersion | None = None, rows: int | None = None,
                    sequence: SequenceControl | None = None,
                    scheduling: Scheduling | None = None) -> dict[str, np.ndarray]:
        """Run one request on the named model (see `DynamicBatcher.submit` for its errors).

        ``handle``: what ``get(name, version)`` returned to a caller that looked the version up
        already (to check the inputs against its config); ``rows``: see `DynamicBatcher.submit`;
        ``sequence`` and ``scheduling``: see `LoadedVersion.infer`.
        """
        for attempt in range(3):
            handle = handle or await self.serving_version(name, version)
            try:
                return await handle.infer(inputs, timeout_s=timeout_s, rows=rows,
                                          sequence=sequence, scheduling=scheduling)
            except ModelNotReady:
                # The version was swapped out between look-up and queueing: use its successor,
                # whose batcher checks the inputs again.
                if attempt == 2 or not handle.batcher.closing:
                    raise
                handle, rows = None, None
        raise AssertionError("unreachable")

    def index(self) -> list[VersionStatus]:
        """State of every version known on disk or in memory, sorted by name and version."""
        rows = []
        for name in sorted(set(self._disk) | set(self._records)):
            on_disk = self._disk[name].versions if name in self._disk else {}
            for version in sorted(set(on_disk) | set(self._serving(name))):
                rows.append(self._peek(name, version).status())
        return rows

    async def serving_version(self, name: str,
                              version: int | str | None = None) -> LoadedVersion:
        """`get`, but with `load_on_demand` a model on disk and not loaded is loaded first
        (requests arriving meanwhile wait on the same load).

        Raises:
            What `get` raises; NoRoomToLoad when the memory budget has no room for it, and
            what `load` raises when its load fails otherwise.
        """
        try:
            return self.get(name, version)
        except ModelNotFound:
            # Put into the directory since the last scan (no polling in explicit mode).
            if not self.load_on_demand or not await self._thread((self.root / name).is_dir):
                raise
        except ModelNotReady:
            if not self.load_on_demand or name not in self._disk or (
                    self._demand_failed.get(name) == self._disk_state(name)):
                raise
        task = self._on_demand.get(name)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._load_on_demand(name))
            self._on_demand[name] = task
            task.add_done_callback(lambda _: self._on_demand.pop(name, None))
        await asyncio.shield(task)
        return self.get(name, version)

    async def _load_on_demand(self, name: str) -> None:
        """Load `name` for a request; when that fails it stays unloaded (not counted as a
        model failing to serve), and on the same files is not tried again but for room."""
        log.info("model %r: loading on demand", name)
        try:
            await self.load(name)
        except ServingError as error:
            if not self._serving(name):
                self._unloaded.add(name)
            budget = next((cause for cause in (error, error.__cause__)
                           if isinstance(cause, MemoryBudgetExceeded)), None)
            if budget is not None:
                raise NoRoomToLoad(f"model {name!r} could not be loaded on demand: "
                                   f"{budget}") from error
            self._demand_failed[name] = self._disk_state(name)
            raise

    def _disk_state(self, name: str) -> Any:
        """What must change on disk for a failed load of `name` to be worth another try."""
        model = self._disk.get(name)
        if model is None:
            return None
        return (model.config_digest,
                tuple(sorted((v, e.manifest_digest) for v, e in model.versions.items())))

    def failed_models(self) -> list[str]:
        """Models the repository was asked to serve that nothing serves because their load
        failed (or, named at start, that are not in the directory): readiness asks this."""
        failed = {name for name, versions in self._records.items()
                  if name not in self._unloaded and not self._serving(name)
                  and any(record.phase is Phase.FAILED for record in versions.values())}
        return sorted(failed | (self._missing_at_start - set(self._disk)))

    def records(self, name: str) -> dict[int, VersionRecord]:
        """The records of a model's versions by number (read them; the repository writes them)."""
        return dict(self._records.get(name, {}))

    def memory_bytes(self) -> int:
        """Bytes held by loaded and draining versions (parameters plus planned activations)."""
        return sum(version.memory().total for version in self._in_memory())

    # ----- explicit control ------------------------------------------------------------------

    async def load(self, name: str, version: int | str | None = None) -> None:
        """Load a model by its version policy (or one extra version); raise if a load fails,
        or if it leaves nothing serving (ModelNotServing, with each version's reason)."""
        check_model_name(name)
        async with self._lock:
            model = await self._rescan(name)
            self._unloaded.discard(name)
            number = None
            if version is None:
                for record in self._records.get(name, {}).values():
                    record.excluded = False
            else:
                number = self._existing_version(model, version)
                record = self._record(name, number)
                record.pinned, record.excluded = True, False
            try:
                await self._reconcile(name, strict=True)
            except EngineError as error:
                self._check_loaded(name, number, error)
                raise
            self._check_loaded(name, number)

    def _check_loaded(self, name: str, number: int | None,
                      cause: Exception | None = None) -> None:
        """After a load: ModelNotServing, naming each version's reason, when version `number`
        (any version, when None) is not serving."""
        serving = self._serving(name)
        if (number in serving) if number is not None else serving:
            return
        versions = [number] if number is not None else sorted(self._disk[name].versions)
        reasons = "; ".join(f"version {version}: {self._reason(name, version)}"
                            for version in versions) or "it has no version on disk"
        raise ModelNotServing(f"model {name!r} did not load: {reasons}") from cause

    async def unload(self, name: str, version: int | str | None = None) -> None:
        """Unload a model (all versions) or one version; polling will not reload it."""
        check_model_name(name)
        async with self._lock:
            model = await self._rescan(name)
            if version is None:
                self._unloaded.add(name)
                for record in self._records.get(name, {}).values():
                    record.pinned = False
            else:
                record = self._record(name, self._existing_version(model, version))
                record.pinned, record.excluded = False, True
            await self._reconcile(name)

    async def delete_model(self, name: str) -> None:
        """Remove a model directory (atomically) and unload all its versions."""
        check_model_name(name)
        async with self._lock:
            await self._rescan(name)
            await self._thread(disk.remove_atomically, self.root, self.root / name)
            self._disk.pop(name, None)
            self._unloaded.discard(name)
            for record in self._records.get(name, {}).values():
                record.pinned = record.excluded = False
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
            config_bytes = (_config_bytes(parsed) if parsed is not None else
                            await self._thread(disk.read_config_bytes, self.root / name))
            identity = (manifest.digest, disk.config_digest(config_bytes))
            uploaded = await self._place(name, staging, validated, identity, number, replace,
                                         where)
            if parsed is not None:  # only now: a refused upload must change nothing
                await self._thread(write_bytes_durably, self.root / name / CONFIG_NAME,
                                   config_bytes)
            await self._rescan(name)
            self._unloaded.discard(name)
            self._record(name, uploaded.version).failed = None  # new files: worth a load
            await self._reconcile(name, preloaded=uploaded)
        return uploaded.version

    # ----- internals -------------------------------------------------------------------------

    async def _thread(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._io, functools.partial(function, *args, **kwargs))

    def _record(self, name: str, version: int) -> VersionRecord:
        """The record of a version, created (UNAVAILABLE, "not loaded") on first use."""
        versions = self._records.setdefault(name, {})
        if version not in versions:
            versions[version] = VersionRecord(name, version)
        return versions[version]

    def _peek(self, name: str, version: int) -> VersionRecord:
        """The record of a version, or a blank one (not stored) when there is none yet."""
        return self._records.get(name, {}).get(version) or VersionRecord(name, version)

    def _all_records(self) -> Iterator[VersionRecord]:
        return (record for versions in list(self._records.values())
                for record in list(versions.values()))

    def _serving(self, name: str) -> dict[int, LoadedVersion]:
        """The ready copies of a model's versions, by version number."""
        return {version: record.serving for version, record in self._records.get(name, {}).items()
                if record.serving is not None}

    def _in_memory(self) -> list[LoadedVersion]:
        """Every copy holding memory: those serving and those still draining."""
        return [copy for record in self._all_records()
                for copy in ([record.serving] if record.serving else []) + list(record.draining)]

    def _forget_idle(self, name: str) -> None:
        """Drop the records of versions gone from disk that hold nothing any more."""
        on_disk = self._disk[name].versions if name in self._disk else {}
        versions = self._records.get(name, {})
        for version in [v for v, record in versions.items() if record.idle and v not in on_disk]:
            del versions[version]
        if not versions:
            self._records.pop(name, None)

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
        if number not in model.versions and number not in self._serving(model.name):
            raise VersionNotFound(f"model {model.name!r} has no version {number}; versions on "
                                  f"disk: {sorted(model.versions)}")
        return number

    async def _reconcile(self, name: str, *, strict: bool = False,
                         preloaded: LoadedVersion | None = None) -> None:
        """Make the loaded versions of `name` match disk, the version policy and requests."""
        model = self._disk.get(name)
        serving = [self._record(name, version) for version in self._serving(name)]
        if model is None or name in self._unloaded:
            for record in serving:
                self._retire(record)
            self._forget_idle(name)
            return
        try:
            config = (ModelConfig() if model.config_bytes is None else
                      parse_config(model.config_bytes, str(self.root / name / CONFIG_NAME)))
        except InvalidModel as error:
            for version in model.versions:
                self._record(name, version).reason = str(error)
            if strict:
                raise
            return
        records = self._records.get(name, {})
        wanted = wanted_versions(
            config.version_policy,
            {version for version, entry in model.versions.items() if entry.manifest_digest},
            pinned={version for version, record in records.items() if record.pinned},
            excluded={version for version, record in records.items() if record.excluded})
        first_error = await self._load_wanted(model, config, wanted, strict=strict,
                                              preloaded=preloaded)
        for record in serving:
            # A failed load keeps the previous versions serving.
            gone = record.version not in model.versions
            if record.serving and (gone or (record.version not in wanted and first_error is None)):
                self._retire(record)
        self._explain_unloaded(model, wanted)
        self._forget_idle(name)
        if strict and first_error is not None:
            raise first_error

    async def _load_wanted(self, model: disk.DiskModel, config: ModelConfig, wanted: set[int],
                           *, strict: bool, preloaded: LoadedVersion | None) -> Exception | None:
        """Load and publish each wanted version not already serving as it is on disk; the
        first load error. Without `strict`, a version that failed as it is stays failed."""
        first_error: Exception | None = None
        for version in sorted(wanted):
            record = self._record(model.name, version)
            identity = (model.versions[version].manifest_digest, model.config_digest)
            if record.identity == identity:
                continue
            if preloaded is not None and (preloaded.version, preloaded.identity) == (version,
                                                                                     identity):
                self._publish(record, preloaded)
                continue
            if not strict and record.failed == identity:
                first_error = first_error or InvalidModel(record.reason)
                continue
            error = await self._load(record, config, identity)
            first_error = first_error or error
        return first_error

    def _explain_unloaded(self, model: disk.DiskModel, wanted: set[int]) -> None:
        """Record why each version on disk but not loaded is not serving."""
        for version in model.versions.keys() - self._serving(model.name).keys():
            record, entry = self._record(model.name, version), model.versions[version]
            if entry.problem is not None:
                record.reason = entry.problem
            elif version not in wanted and record.failed is None:
                record.reason = "not selected by version_policy or unloaded"

    async def _load(self, record: VersionRecord, config: ModelConfig,
                    identity: Identity) -> Exception | None:
        """Load the version's files and publish them; the error when that failed."""
        name, version = record.name, record.version
        version_dir = self.root / name / str(version)
        where = f"model {name!r} version {version}"
        record.begin_load()
        try:
            params_size = await self._thread(lambda: (version_dir / PARAMS_NAME).stat().st_size)
            await self._make_room(max(params_size, self._last_size.get(name, 0)), where, name)
            validated = await self._thread(self._validate, version_dir, config, where, True)
            loaded = self._wrap(name, version, validated, identity)
            size = await self._measure(loaded)
            await self._make_room(size, where, name)
        except (EngineError, OSError) as error:
            log.warning("model %r version %d: load failed: %s", name, version, error)
            record.fail(identity, str(error))
            return error
        except BaseException:
            record.abandon_load()
            raise
        self._last_size[name] = size
        self._publish(record, loaded)
        log.info("%s: loaded, %d bytes", where, size)
        # The load's temporaries (the params file's buffer among them) are free now.
        await self._thread(control.reclaim_memory)
        return None

    def _validate(self, version_dir: Path, config: ModelConfig, where: str,
                  verify: bool) -> Validated:
        if verify:
            manifest = read_manifest(version_dir)
            if manifest is None and self.require_manifest:
                raise InvalidModel(f"{where}: {version_dir} has no MANIFEST.json")
            if manifest is not None:
                verify_manifest(version_dir, manifest)
        return load_and_validate(version_dir, config, loader=self.loader,
                                 device=config.asked_device() or self.device, where=where,
                                 memory_cap_bytes=self.memory_budget_bytes)

    def _wrap(self, name: str, version: int, validated: Validated,
              identity: Identity) -> LoadedVersion:
        policy = BatchingPolicy.from_config(
            validated.config, concurrent_batches(validated.model, validated.config.instances))
        observer = None if self.batch_observer is None else functools.partial(
            self.batch_observer, name, version)
        gpu = on_gpu(validated.model)
        instances = policy.max_concurrent_batches
        batcher = DynamicBatcher(validated.model.infer, policy,
                                 executor=self._executor_for(gpu, instances),
                                 name=f"model {name!r} version {version}",
                                 batch_buffers=getattr(validated.model, "batch_buffers", None),
                                 batch_axes=validated.config.batch_axes(),
                                 observer=observer,
                                 core_share=None if gpu else CoreShare(instances, self._cores))
        loaded = LoadedVersion(name, version, validated.model, validated.config, batcher,
                               manifest_digest=identity[0], config_digest=identity[1])
        loaded.on_idle = self._became_idle.set
        return loaded

    def _executor_for(self, gpu: bool, instances: int) -> ThreadPoolExecutor | None:
        """Where a model's batches run: the shared compute threads, or, for a model with more
        instances than they have threads, a pool of its own (None: the batcher's), its
        batches still taking their cores from the shared `CoreBudget`."""
        shared = self._device_compute if gpu else self._compute
        return shared if instances <= shared._max_workers else None

    async def _measure(self, version: LoadedVersion) -> int:
        """Bytes `version` holds, measured off the event loop. The plans it reads (its largest
        batch's among them) were compiled by the load's compile step (`compile_at_load`), so
        measuring compiles nothing; a model without that step compiles its largest batch's
        plan here (half a second for a ResNet-18 at batch 32)."""
        return (await self._thread(version.memory)).total

    async def _make_room(self, needed: int, where: str, name: str) -> None:
        """Unload the least recently used idle models (never `name`, never a pinned one)
        until `needed` more bytes fit the memory budget.

        Raises:
            MemoryBudgetExceeded: they do not fit with every evictable model unloaded; the
                message names the budget and what holds it.
        """
        budget = self.memory_budget_bytes
        if budget is None:
            return
        deadline = asyncio.get_running_loop().time() + control.IDLE_WAIT_S
        while True:
            copies = self._in_memory()
            sizes = await self._thread(_sizes, copies)
            used = sum(size for _, size in sizes)
            if used + needed <= budget:
                return
            serving = {model: list(self._serving(model).values()) for model in self._records}
            victim = control.least_recently_used(serving, keep=name)
            if victim is None and control.busy_but_evictable(serving, keep=name):
                # Wait for one to finish its requests (woken as a copy goes idle), then look
                # again.
                self._became_idle.clear()
                left = deadline - asyncio.get_running_loop().time()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._became_idle.wait(), max(left, 0.0))
                if left > 0:
                    continue
            if victim is None:
                raise MemoryBudgetExceeded(
                    f"{where}: needs {needed} bytes, but {used} of the {budget}-byte memory "
                    f"budget are held by {control.describe_holders(sizes)}, and none of them "
                    "can be unloaded (pinned, or serving requests for "
                    f"{control.IDLE_WAIT_S:g} s); unload a model or raise the budget")
            await self._evict(victim, f"to make room for {where} ({needed} bytes; {used} of "
                                      f"the {budget}-byte budget in use)")

    async def _evict(self, name: str, why: str) -> None:
        """Unload every version of an idle model (as `unload` does) and wait until its memory
        is given back."""
        records = [record for record in self._records.get(name, {}).values()
                   if record.serving is not None]
        self._unloaded.add(name)
        for record in records:
            self._retire(record)
            record.reason = f"unloaded {why}"
        self.counts.add(name, "eviction")
        log.info("model %r: evicted %s", name, why)
        await asyncio.gather(*[task for record in records for task in record.draining.values()],
                             return_exceptions=True)
        await self._thread(control.reclaim_memory)

    def _publish(self, record: VersionRecord, new: LoadedVersion) -> None:
        """Make `new` the serving copy of its version (one assignment), drain the old one."""
        new.batcher.start()
        self.counts.add(new.name, "load")
        old = record.publish(new)
        if old is not None:
            self._drain(record, old)

    def _retire(self, record: VersionRecord) -> None:
        self.counts.add(record.name, "unload")
        log.info("model %r version %d: unloading", record.name, record.version)
        self._drain(record, record.retire())

    def _drain(self, record: VersionRecord, old: LoadedVersion) -> None:
        """Let in-flight requests on `old` finish in the background, then drop it."""

        async def drain() -> None:
            try:
                await old.batcher.close()
            finally:
                record.drained(old)

        task = asyncio.get_running_loop().create_task(drain())
        # Once the task is done, and unless the repository is closing: free the copy's plans
        # one at a time, then collect and trim what it held. The model goes in a list that
        # the tear-down empties: the executor keeps its arguments until the call returns, and
        # the collection must find the model unreachable.
        task.add_done_callback(lambda _: self._reclaim_soon([old.model]))
        record.draining[old] = task

    def _reclaim_soon(self, retired: list[Any]) -> None:
        if self._closing:
            return
        with contextlib.suppress(RuntimeError):  # the event loop is closing
            asyncio.get_running_loop().run_in_executor(self._io, _tear_down, retired)

    async def _place(self, name: str, staging: Path, validated: Validated, identity: Identity,
                     number: int | None, replace: bool, where: str) -> LoadedVersion:
        """Check the upload against the memory budget, then move `staging` into place as
        version `number` (None: one past the highest); the upload, wrapped under that number."""
        for _ in range(100):
            target = (number if number is not None else
                      await self._thread(disk.next_version, self.root / name))
            uploaded = self._wrap(name, target, validated, identity)
            await self._make_room(await self._measure(uploaded), where, name)
            try:
                await self._thread(disk.place_version, self.root, staging,
                                   self.root / name / str(target), replace=replace)
                return uploaded
            except FileExistsError:
                if number is not None:
                    raise Conflict(f"model {name!r} version {number} already exists; upload "
                                   "again with replace=true to replace its files, or delete "
                                   "it first") from None
                # Another writer took that number between the look and the move: the next.
        raise Conflict(f"model {name!r}: could not pick a free version number")

    def _not_ready(self, name: str, versions: Iterable[int], message: str) -> ModelNotReady:
        """ModelNotReady when one of `versions` is loading, or was found on disk and is not
        reconciled yet (retrying soon helps); else ModelNotServing, saying what would help."""
        records = self._records.get(name, {})
        error: ModelNotReady
        if name not in self._unloaded and any(
                version not in records or records[version].phase is Phase.LOADING
                for version in versions):
            error = ModelNotReady(message)
        else:
            error = ModelNotServing(f"{message}; it serves once loaded (the repository's "
                                    "load), not by retrying")
        # For a caller that loads on demand and learns the model's name only from this error
        # (a /predict body names it).
        error.model = name  # type: ignore[attr-defined]
        return error

    def _why(self, name: str) -> str:
        reasons = [f"version {v}: {self._peek(name, v).reason}"
                   for v in sorted(self._disk[name].versions)] if name in self._disk else []
        return "; ".join(reasons) or "no complete version on disk"

    def _reason(self, name: str, version: int) -> str:
        return self._peek(name, version).reason


def _tear_down(retired: list[Any]) -> None:
    """The retired copies' models, taken out of `retired`: their plans freed a plan at a time
    where they have them (`Model.release_plans`: in one collection they held the GIL, and the
    event loop, for tens of ms at a stretch), then the cycles collected and the heap trimmed."""
    while retired:
        release = getattr(retired.pop(), "release_plans", None)
        if release is not None:
            release()
        del release  # the bound method holds the model
    control.reclaim_memory()


def _sizes(copies: list[LoadedVersion]) -> list[tuple[LoadedVersion, int]]:
    return [(copy, copy.memory().total) for copy in copies]


def _stage(staging: Path, symbol: Source, params: Source) -> None:
    for file_name, source in zip(MODEL_FILES, (symbol, params)):
        data = source if isinstance(source, bytes) else Path(os.fspath(source))
        disk.write_file(staging / file_name, data)


def _read_model_config(model_dir: Path) -> ModelConfig:
    data = disk.read_config_bytes(model_dir)
    return ModelConfig() if data is None else parse_config(data, str(model_dir / CONFIG_NAME))


def _config_bytes(config: ModelConfig) -> bytes:
    """What ``config.json`` holds for `config`."""
    return config.model_dump_json(indent=2, exclude_none=True).encode() + b"\n"
