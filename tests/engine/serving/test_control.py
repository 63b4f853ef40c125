"""Model control: eviction of the least recently used idle model under the memory budget,
pinned and busy models kept, loading on demand, the models loaded at start, failed models."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.serving import control
from engine.serving.errors import (
    MemoryBudgetExceeded,
    ModelNotFound,
    ModelNotServing,
    NoRoomToLoad,
)
from engine.serving.loaded import VersionState
from engine.serving.repository import ModelRepository
from tests.engine.serving.helpers import fake_loader, fake_symbol, run

# A fake model holds 64*3*4 parameter bytes plus 32*16 activation bytes: 1280. This budget
# holds two of them, not three.
BUDGET = 3000
ROW = np.ones((1, 4), np.float32)


def fake_repo(root: Path, **options: Any) -> ModelRepository:
    return ModelRepository(root, loader=fake_loader, stale_tmp_age_s=0, **options)


def states(repo: ModelRepository) -> dict[str, VersionState]:
    return {row.name: row.state for row in repo.index()}


async def until(condition: Any, what: str) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_least_recently_used_idle_model_makes_room(tmp_path: Path) -> None:
    async def main() -> None:
        repo = fake_repo(tmp_path, memory_budget_bytes=BUDGET)
        await repo.start()
        await repo.add_version("a", fake_symbol(1), b"p")
        await repo.add_version("b", fake_symbol(2), b"p")
        await repo.infer("a", {"data": ROW})  # a is now used more recently than b
        await repo.add_version("c", fake_symbol(3), b"p")
        assert states(repo) == {"a": VersionState.READY, "b": VersionState.UNAVAILABLE,
                                "c": VersionState.READY}
        assert repo.memory_bytes() <= BUDGET
        assert repo.counts.of("eviction") == {"b": 1}
        assert repo.counts.of("unload") == {"b": 1}
        assert repo.counts.of("load") == {"a": 1, "b": 1, "c": 1}
        with pytest.raises(ModelNotServing, match="unloaded to make room for upload of model 'c'"):
            repo.get("b")
        await repo.close()

    run(main())


def test_busy_and_pinned_models_stay_and_the_error_names_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        repo = fake_repo(tmp_path, memory_budget_bytes=BUDGET)
        await repo.start()
        await repo.add_version("pinned", fake_symbol(1), b"p", config={"pinned": True})
        await repo.add_version("busy", fake_symbol(2), b"p")
        await repo.infer("pinned", {"data": ROW})  # busy is the least recently used
        model = repo.get("busy").model
        model.gate.clear()  # its request stays running
        request = asyncio.create_task(repo.infer("busy", {"data": ROW}))
        await until(lambda: not repo.get("busy").idle, "the request to run")
        monkeypatch.setattr(control, "IDLE_WAIT_S", 0.2)
        with pytest.raises(MemoryBudgetExceeded) as caught:
            await repo.add_version("c", fake_symbol(3), b"p")
        message = str(caught.value)
        assert "3000-byte memory budget" in message
        assert "'pinned' version 1 1280 bytes (pinned)" in message
        assert "'busy' version 1 1280 bytes (busy)" in message
        assert repo.counts.of("eviction") == {}
        # A load waits for the busy model to finish its request, then unloads it.
        monkeypatch.setattr(control, "IDLE_WAIT_S", 60.0)
        upload = asyncio.create_task(repo.add_version("c", fake_symbol(3), b"p"))
        await asyncio.sleep(0.2)
        assert not upload.done() and states(repo)["busy"] is VersionState.READY
        model.gate.set()
        outputs = await request  # the request in flight was not lost
        assert outputs["out"].shape == (1, 3)
        await upload
        assert repo.counts.of("eviction") == {"busy": 1}
        assert states(repo)["pinned"] is VersionState.READY
        await repo.close()

    run(main())


def test_load_on_demand_shares_one_load_and_evicts(tmp_path: Path) -> None:
    async def main() -> None:
        writer = fake_repo(tmp_path)
        await writer.start()
        for seed, name in enumerate("abc"):
            await writer.add_version(name, fake_symbol(seed), b"p")
        await writer.close()
        repo = fake_repo(tmp_path, memory_budget_bytes=BUDGET, models_at_start=(),
                         load_on_demand=True)
        await repo.start()
        assert set(states(repo).values()) == {VersionState.UNAVAILABLE}
        assert repo.failed_models() == []
        results = await asyncio.gather(*[repo.infer(name, {"data": ROW})
                                         for name in "aaaabb" for _ in range(3)])
        assert all(result["out"].shape == (1, 3) for result in results)
        assert repo.counts.of("load") == {"a": 1, "b": 1}  # 12 requests of a, one load
        await repo.infer("a", {"data": ROW})
        await repo.infer("c", {"data": ROW})  # b is the least recently used
        assert repo.counts.of("eviction") == {"b": 1}
        assert states(repo)["b"] is VersionState.UNAVAILABLE
        await repo.infer("b", {"data": ROW})  # loads again, evicting a
        assert repo.counts.of("eviction") == {"a": 1, "b": 1}
        await repo.close()

    run(main())


def test_load_on_demand_without_room_says_what_holds_the_budget(tmp_path: Path) -> None:
    async def main() -> None:
        writer = fake_repo(tmp_path)
        await writer.start()
        for seed, name in enumerate("abc"):
            await writer.add_version(name, fake_symbol(seed), b"p",
                                     config={"pinned": name != "c"})
        await writer.close()
        repo = fake_repo(tmp_path, memory_budget_bytes=BUDGET, models_at_start={"a", "b"},
                         load_on_demand=True)
        await repo.start()
        with pytest.raises(NoRoomToLoad) as caught:
            await repo.infer("c", {"data": ROW})
        message = str(caught.value)
        assert "model 'c' could not be loaded on demand" in message
        assert "2560 of the 3000-byte memory budget are held by 'a' version 1 1280 bytes " \
            "(pinned), 'b' version 1 1280 bytes (pinned)" in message
        assert repo.failed_models() == []  # a request's failed load is no failing model
        assert states(repo)["c"] is VersionState.UNAVAILABLE
        await repo.close()

    run(main())


def test_models_at_start_and_failed_models(tmp_path: Path) -> None:
    async def main() -> None:
        writer = fake_repo(tmp_path)
        await writer.start()
        await writer.add_version("a", fake_symbol(1), b"p")
        await writer.add_version("b", fake_symbol(2), b"p")
        await writer.close()
        repo = fake_repo(tmp_path, models_at_start={"a", "missing"})
        await repo.start()
        assert states(repo) == {"a": VersionState.READY, "b": VersionState.UNAVAILABLE}
        assert repo.failed_models() == ["missing"]
        await repo.poll()  # polling leaves models not asked for unloaded
        assert states(repo)["b"] is VersionState.UNAVAILABLE
        with pytest.raises(ModelNotServing):
            await repo.serving_version("b")  # no loading on demand here
        await repo.load("b")
        assert states(repo)["b"] is VersionState.READY
        await repo.close()

    run(main())


def test_load_on_demand_finds_a_model_put_into_the_directory_later(tmp_path: Path) -> None:
    async def main() -> None:
        repo = fake_repo(tmp_path, models_at_start=(), load_on_demand=True)
        await repo.start()
        writer = fake_repo(tmp_path)
        await writer.start()
        await writer.add_version("late", fake_symbol(4), b"p")
        await writer.close()
        outputs = await repo.infer("late", {"data": ROW})
        assert outputs["out"].shape == (1, 3)
        with pytest.raises(ModelNotFound):
            await repo.infer("absent", {"data": ROW})
        await repo.close()

    run(main())


def test_a_sequence_under_way_keeps_its_model(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.serving.sequences import SequenceControl
    from tests.conformance.fixtures import model_files
    from tests.engine.serving.helpers import seed_mlp
    from tests.engine.serving.sequence_lstm import LSTM, reference, sequence_config

    tokens, _ = reference()

    async def main() -> None:
        repo = ModelRepository(tmp_path)
        await repo.start()
        symbol, params = model_files(LSTM)
        await repo.add_version(LSTM, symbol.read_bytes(), params.read_bytes(),
                               config=sequence_config())
        await repo.add_version("mlp", *seed_mlp())
        mlp = repo.get("mlp").memory().total
        await repo.unload("mlp")
        await until(lambda: len(repo._in_memory()) == 1, "mlp to drain")
        lstm = repo.get(LSTM).memory().total
        repo.memory_budget_bytes = lstm + mlp - 1  # the MLP fits only in the LSTM's place
        first = {"tokens": tokens[:1, :1]}
        await repo.infer(LSTM, first, rows=1, sequence=SequenceControl(7, start=True))
        monkeypatch.setattr(control, "IDLE_WAIT_S", 0.2)
        with pytest.raises(ModelNotServing, match=f"'{LSTM}' version 1 {lstm} bytes "
                           r"\(busy\)"):
            await repo.load("mlp")
        await repo.infer(LSTM, {"tokens": tokens[1:2, :1]}, rows=1,
                         sequence=SequenceControl(7, end=True))
        await repo.load("mlp")  # the sequence ended: now the LSTM may go
        assert repo.counts.of("eviction") == {LSTM: 1}
        await repo.close()

    run(main(), timeout=240)
