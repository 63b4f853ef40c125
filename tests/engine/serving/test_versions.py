"""Per-version state: `wanted_versions` on its own, and every `VersionRecord` transition driven
through the repository's public API (loads, failures, unloads, replacements, half copies)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.serving import disk
from engine.serving.config import VersionPolicy
from engine.serving.errors import ModelNotReady, ModelNotServing
from engine.serving.loaded import VersionState
from engine.serving.manifest import PARAMS_NAME, SYMBOL_NAME, read_manifest, write_manifest
from engine.serving.repository import ModelRepository
from engine.serving.versions import Phase, VersionRecord, wanted_versions
from tests.engine.serving.fakes import FakeModel, expected
from tests.engine.serving.helpers import fake_loader, fake_symbol, run
from tests.engine.serving.test_repository import write_version

DATA = np.arange(8, dtype=np.float32).reshape(2, 4)


# ----- wanted_versions: a pure function -------------------------------------------------------

@pytest.mark.parametrize("policy, pinned, excluded, wanted", [
    ({}, set(), set(), {5}),
    ({"latest": {"num_versions": 2}}, set(), set(), {3, 5}),
    ({"all": {}}, set(), {3}, {1, 5}),
    ({"specific": {"versions": [1, 4]}}, set(), set(), {1}),  # 4 is not complete on disk
    ({}, {1}, set(), {1, 5}),
    ({}, {1, 4}, {5}, {1}),  # a pinned version must still be complete
    ({"latest": {"num_versions": 9}}, {3}, {3}, {1, 5}),  # excluded wins over pinned
])
def test_wanted_versions_combines_policy_pins_and_exclusions(
        policy: dict[str, Any], pinned: set[int], excluded: set[int], wanted: set[int]) -> None:
    chosen = wanted_versions(VersionPolicy.model_validate(policy), {1, 3, 5}, pinned=pinned,
                             excluded=excluded)
    assert chosen == wanted


def test_wanted_versions_of_nothing_on_disk_is_nothing() -> None:
    assert wanted_versions(VersionPolicy(), [], pinned={2}, excluded=set()) == set()


# ----- helpers ----------------------------------------------------------------------------------

class GatedLoader:
    """The fake loader, counting calls; while `gate` is clear a load blocks inside it."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.calls = 0

    def __call__(self, symbol: Path, params: Path, *, device: str = "cpu") -> FakeModel:
        self.calls += 1
        self.entered.set()
        if not self.gate.wait(10):
            raise TimeoutError("test gate never opened")
        return fake_loader(symbol, params, device=device)


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait (at most 10 s) for `condition` to hold."""
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def state(repo: ModelRepository, name: str, version: int) -> tuple[VersionState, str]:
    rows = {(row.name, row.version): row for row in repo.index()}
    return rows[(name, version)].state, rows[(name, version)].reason


def record(repo: ModelRepository, name: str, version: int) -> VersionRecord:
    return repo.records(name)[version]


# ----- transitions ------------------------------------------------------------------------------

def test_load_goes_unavailable_loading_ready(tmp_path: Path) -> None:
    loader = GatedLoader()
    version_dir = write_version(tmp_path, "m", 1, fake_symbol(1), b"p")

    async def main() -> None:
        repo = ModelRepository(tmp_path, loader=loader)
        try:
            loader.gate.clear()
            starting = asyncio.create_task(repo.start())
            await until(loader.entered.is_set, "the load to start")
            assert state(repo, "m", 1) == (VersionState.LOADING, "")
            assert record(repo, "m", 1).phase is Phase.LOADING
            with pytest.raises(ModelNotReady, match="not loaded"):
                repo.get("m")
            loader.gate.set()
            await starting
            ready = record(repo, "m", 1)
            assert state(repo, "m", 1) == (VersionState.READY, "")
            assert ready.phase is Phase.READY and ready.serving is repo.get("m", 1)
            manifest = read_manifest(version_dir)
            assert manifest is not None and ready.identity == (manifest.digest, None)
        finally:
            await repo.close()

    run(main())


def test_failed_load_is_not_retried_until_the_files_change(tmp_path: Path) -> None:
    loader = GatedLoader()
    write_version(tmp_path, "m", 1, fake_symbol(broken=True), b"p")

    async def main() -> None:
        repo = ModelRepository(tmp_path, loader=loader)
        try:
            await repo.start()
            failed = record(repo, "m", 1)
            assert failed.phase is Phase.FAILED and failed.serving is None
            assert failed.failed is not None and failed.failed[0] is not None
            assert state(repo, "m", 1) == (VersionState.UNAVAILABLE, failed.reason)
            assert "unknown op on purpose" in failed.reason
            calls = loader.calls
            await repo.poll()
            assert loader.calls == calls  # the same files are not loaded again by polling
            # An explicit load does retry, and reports: nothing serves, so the model did not
            # load, for the reason its version gives.
            with pytest.raises(ModelNotServing, match="did not load: version 1: .*on purpose"):
                await repo.load("m")
            assert loader.calls > calls and record(repo, "m", 1).phase is Phase.FAILED
            fixed = tmp_path / "m" / "1"
            (fixed / SYMBOL_NAME).write_bytes(fake_symbol(2))
            write_manifest(fixed)
            await repo.poll()
            assert record(repo, "m", 1).phase is Phase.READY
            assert record(repo, "m", 1).failed is None and state(repo, "m", 1)[1] == ""
        finally:
            await repo.close()

    run(main())


def test_failed_replacement_keeps_the_serving_copy(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, fake_symbol(1), b"p")

    async def main() -> None:
        repo = ModelRepository(tmp_path, loader=fake_loader)
        try:
            await repo.start()
            serving = repo.get("m", 1)
            (tmp_path / "m" / "1" / SYMBOL_NAME).write_bytes(fake_symbol(broken=True))
            write_manifest(tmp_path / "m" / "1")
            await repo.poll()
            kept = record(repo, "m", 1)
            assert kept.phase is Phase.READY and kept.serving is serving is repo.get("m")
            assert kept.failed is not None and "on purpose" in kept.reason
            assert state(repo, "m", 1) == (VersionState.READY, "")
        finally:
            await repo.close()

    run(main())


def test_unload_during_load_waits_for_it_then_unloads(tmp_path: Path) -> None:
    loader = GatedLoader()
    write_version(tmp_path, "m", 1, fake_symbol(1), b"p")

    async def main() -> None:
        repo = ModelRepository(tmp_path, loader=loader)
        try:
            loader.gate.clear()
            starting = asyncio.create_task(repo.start())
            await until(loader.entered.is_set, "the load to start")
            unloading = asyncio.create_task(repo.unload("m"))
            await asyncio.sleep(0.05)
            assert not unloading.done() and record(repo, "m", 1).phase is Phase.LOADING
            loader.gate.set()
            await asyncio.gather(starting, unloading)
            await until(lambda: record(repo, "m", 1).phase is Phase.UNAVAILABLE, "the drain")
            unloaded = record(repo, "m", 1)
            assert unloaded.serving is None and not unloaded.draining
            assert state(repo, "m", 1) == (VersionState.UNAVAILABLE, "unloaded")
            assert repo.memory_bytes() == 0
            await repo.poll()  # an unload by request survives polling
            assert record(repo, "m", 1).phase is Phase.UNAVAILABLE
        finally:
            await repo.close()

    run(main())


def test_unload_drains_in_flight_requests_through_unloading(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, fake_symbol(1), b"p")

    async def main() -> None:
        repo = ModelRepository(tmp_path, loader=fake_loader)
        try:
            await repo.start()
            copy = repo.get("m")
            copy.model.gate.clear()
            request = asyncio.create_task(repo.infer("m", {"data": DATA}))
            await until(lambda: copy.batcher.stats.batches == 1, "the batch to start")
            await repo.unload("m")
            draining = record(repo, "m", 1)
            assert draining.phase is Phase.UNLOADING and list(draining.draining) == [copy]
            assert state(repo, "m", 1) == (VersionState.UNLOADING, "")
            assert repo.memory_bytes() == copy.memory().total
            copy.model.gate.set()
            np.testing.assert_allclose((await request)["out"], expected(copy.model, DATA)["out"])
            await until(lambda: not draining.draining, "the drain")
            assert draining.phase is Phase.UNAVAILABLE and repo.memory_bytes() == 0
        finally:
            await repo.close()

    run(main())


def test_replace_under_load_serves_the_new_copy_while_the_old_drains(tmp_path: Path) -> None:
    async def main() -> None:
        # Two compute threads: with one (the default) CPU batches queue for the cores, and the
        # new copy's batch would wait for the old copy's, held here, to end.
        repo = ModelRepository(tmp_path, loader=fake_loader, compute_threads=2)
        try:
            await repo.start()
            await repo.add_version("m", fake_symbol(1), b"p")
            old = repo.get("m")
            old.model.gate.clear()
            request = asyncio.create_task(repo.infer("m", {"data": DATA}))
            await until(lambda: old.batcher.stats.batches == 1, "the batch to start")
            assert await repo.add_version("m", fake_symbol(2), b"p", version=1,
                                          replace=True) == 1
            replaced = record(repo, "m", 1)
            new = repo.get("m")
            assert new is not old and replaced.serving is new
            assert replaced.phase is Phase.READY and list(replaced.draining) == [old]
            assert state(repo, "m", 1) == (VersionState.READY, "")
            assert repo.memory_bytes() == old.memory().total + new.memory().total
            np.testing.assert_allclose((await repo.infer("m", {"data": DATA}))["out"],
                                       expected(new.model, DATA)["out"])
            old.model.gate.set()  # the request queued before the swap ends on the old copy
            np.testing.assert_allclose((await request)["out"], expected(old.model, DATA)["out"])
            await until(lambda: not replaced.draining, "the drain")
            assert replaced.phase is Phase.READY and repo.memory_bytes() == new.memory().total
        finally:
            await repo.close()

    run(main())


def test_version_reloading_from_disk_stays_ready_until_the_new_copy_serves(
        tmp_path: Path) -> None:
    loader = GatedLoader()
    write_version(tmp_path, "m", 1, fake_symbol(1), b"p")

    async def main() -> None:
        repo = ModelRepository(tmp_path, loader=loader)
        try:
            await repo.start()
            old = repo.get("m")
            (tmp_path / "m" / "1" / SYMBOL_NAME).write_bytes(fake_symbol(2))
            write_manifest(tmp_path / "m" / "1")
            loader.gate.clear()
            loader.entered.clear()
            polling = asyncio.create_task(repo.poll())
            await until(loader.entered.is_set, "the reload to start")
            assert record(repo, "m", 1).phase is Phase.READY and repo.get("m") is old
            loader.gate.set()
            await polling
            assert repo.get("m") is not old and record(repo, "m", 1).phase is Phase.READY
        finally:
            await repo.close()

    run(main())


def test_poll_skips_a_half_copied_version_until_its_manifest_lands(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, fake_symbol(1), b"p")

    async def main() -> None:
        repo = ModelRepository(tmp_path, loader=fake_loader)
        try:
            await repo.start()
            copying = tmp_path / "m" / "2"
            copying.mkdir()
            (copying / SYMBOL_NAME).write_bytes(fake_symbol(2))  # params not there yet
            await repo.poll()
            assert repo.get("m").version == 1
            waiting, reason = state(repo, "m", 2)
            assert waiting is VersionState.UNAVAILABLE and "no MANIFEST.json yet" in reason
            assert record(repo, "m", 2).phase is Phase.UNAVAILABLE
            (copying / PARAMS_NAME).write_bytes(b"p")
            write_manifest(copying)
            await repo.poll()
            assert repo.get("m").version == 2 and record(repo, "m", 2).phase is Phase.READY
            await until(lambda: record(repo, "m", 1).phase is Phase.UNAVAILABLE, "the drain")
            assert state(repo, "m", 1) == (VersionState.UNAVAILABLE,
                                           "not selected by version_policy or unloaded")
        finally:
            await repo.close()

    run(main())


def test_deleted_versions_leave_no_records_once_drained(tmp_path: Path) -> None:
    async def main() -> None:
        repo = ModelRepository(tmp_path, loader=fake_loader)
        try:
            await repo.start()
            await repo.add_version("m", fake_symbol(1), b"p")
            await repo.add_version("m", fake_symbol(2), b"p")
            await repo.load("m", 1)  # pinned beside the latest
            assert sorted(repo.records("m")) == [1, 2] and record(repo, "m", 1).pinned
            await repo.delete_version("m", 1)
            assert sorted(repo.records("m")) == [1, 2]  # 1 still drains
            await until(lambda: not record(repo, "m", 1).draining, "the drain")
            await repo.poll()
            assert sorted(repo.records("m")) == [2]
            await repo.delete_model("m")
            await until(lambda: not any(r.draining for r in repo.records("m").values()),
                        "the drain")
            await repo.poll()
            assert repo.records("m") == {} and repo.index() == []
        finally:
            await repo.close()

    run(main())


def test_upload_is_built_under_the_number_it_gets_even_when_another_writer_races(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_next_version = disk.next_version
    raced: list[int] = []

    def racing_next_version(model_dir: Path) -> int:
        number = real_next_version(model_dir)
        if not raced:  # another writer creates that version between our look and our move
            raced.append(number)
            (model_dir / str(number)).mkdir(parents=True)
            (model_dir / str(number) / SYMBOL_NAME).write_bytes(fake_symbol(9))
        return number

    monkeypatch.setattr(disk, "next_version", racing_next_version)

    async def main() -> None:
        repo = ModelRepository(tmp_path, loader=fake_loader)
        try:
            await repo.start()
            assert await repo.add_version("m", fake_symbol(1), b"p") == 2
            served = repo.get("m")
            assert raced == [1] and served.version == 2
            assert served.batcher.name == "model 'm' version 2"
            assert state(repo, "m", 1)[0] is VersionState.UNAVAILABLE
        finally:
            await repo.close()

    run(main())


def test_cancelled_load_goes_back_to_unavailable(tmp_path: Path) -> None:
    loader = GatedLoader()
    write_version(tmp_path, "m", 1, fake_symbol(1), b"p")

    async def main() -> None:
        repo = ModelRepository(tmp_path, loader=loader)
        try:
            loader.gate.clear()
            polling = asyncio.create_task(repo.poll())  # as `close` cancels background polling
            await until(loader.entered.is_set, "the load to start")
            polling.cancel()
            with pytest.raises(asyncio.CancelledError):
                await polling
            assert record(repo, "m", 1).phase is Phase.UNAVAILABLE
            assert state(repo, "m", 1) == (VersionState.UNAVAILABLE, "not loaded")
            loader.gate.set()
            await repo.poll()
            assert record(repo, "m", 1).phase is Phase.READY
        finally:
            await repo.close()

    run(main())


# ----- not ready for now, or not serving until someone acts -------------------------------------

def test_a_loading_version_is_not_ready_and_an_unloaded_one_is_not_serving(
        tmp_path: Path) -> None:
    """Only a load under way makes waiting worth it (ModelNotReady alone: 503 with Retry-After);
    unloaded, failed, policy-stopped and absent versions stay so (ModelNotServing: 400)."""
    loader = GatedLoader()
    write_version(tmp_path, "m", 1, fake_symbol(1), b"p")
    write_version(tmp_path, "broken", 1, fake_symbol(broken=True), b"p")
    (tmp_path / "empty").mkdir()

    async def main() -> None:
        repo = ModelRepository(tmp_path, loader=loader)
        try:
            loader.gate.clear()
            starting = asyncio.create_task(repo.start())
            await until(loader.entered.is_set, "the first load to start")
            for version in (None, 1):  # loading, or on disk and not reached yet
                with pytest.raises(ModelNotReady) as loading:
                    repo.get("m", version)
                assert not isinstance(loading.value, ModelNotServing)
            loader.gate.set()
            await starting
            write_version(tmp_path, "m", 2, fake_symbol(2), b"p")
            await repo.poll()  # version 2 serves; the default policy (latest 1) stops 1
            await repo.unload("m", 2)
            for name, version, why in (("m", 1, "not selected by version_policy"),
                                       ("m", None, "version 2: not selected"),
                                       ("broken", None, "on purpose"),
                                       ("empty", None, "no complete version on disk")):
                with pytest.raises(ModelNotServing, match=why) as stopped:
                    repo.get(name, version)
                assert "it serves once loaded" in str(stopped.value)
        finally:
            loader.gate.set()
            await repo.close()

    run(main())


def test_a_load_that_leaves_nothing_serving_fails_naming_each_version(tmp_path: Path) -> None:
    write_version(tmp_path, "copying", 1, fake_symbol(1), b"p", manifest=False)
    write_version(tmp_path, "copying", 2, fake_symbol(2), b"p", manifest=False)
    write_version(tmp_path, "broken", 1, fake_symbol(broken=True), b"p")
    (tmp_path / "empty").mkdir()

    async def main() -> None:
        repo = ModelRepository(tmp_path, loader=fake_loader)
        try:
            await repo.start()
            for name, version, reasons in (
                    ("copying", None, "version 1: .*MANIFEST.*; version 2: .*MANIFEST"),
                    ("copying", 2, "version 2: .*MANIFEST"),
                    ("broken", None, "version 1: .*on purpose"),
                    ("empty", None, "it has no version on disk")):
                with pytest.raises(ModelNotServing, match=f"model {name!r} did not load: "
                                                          f"{reasons}"):
                    await repo.load(name, version)
        finally:
            await repo.close()

    run(main())
