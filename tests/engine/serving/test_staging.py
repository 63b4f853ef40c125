"""Uploads written straight into a staging directory, and heavy work kept off the event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import TypeVar

import pytest

from engine.serving.disk import TMP_PREFIX
from engine.serving.errors import InvalidModel
from engine.serving.manifest import PARAMS_NAME, SYMBOL_NAME
from engine.serving.repository import ModelRepository
from tests.engine.serving.fakes import FakeModel
from tests.engine.serving.helpers import fake_loader, fake_symbol, run
from tests.engine.serving.test_repository import write_version

T = TypeVar("T")
MEASURE_S = 0.4  # what compiling a ResNet-18's batch-32 plan costs, give or take


class SlowToMeasure:
    """A loader whose models take `MEASURE_S` to report activation bytes (a plan compile)."""

    def __init__(self) -> None:
        self.measured: list[tuple[int, ...]] = []

    def __call__(self, symbol: Path, params: Path, *, device: str = "cpu") -> FakeModel:
        model = fake_loader(symbol, params, device=device)

        def activation_bytes(shapes: Mapping[str, tuple[int, ...]]) -> int:
            time.sleep(MEASURE_S)  # would stall every request if run on the event loop
            self.measured.append(tuple(shapes["data"]))
            return 1024

        model.activation_bytes = activation_bytes  # type: ignore[method-assign]
        return model


async def _longest_stall(work: Awaitable[T]) -> tuple[T, float]:
    """`work`'s result, and the longest the event loop went without running a 5 ms ticker."""
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.get_running_loop().create_task(tick())
    try:
        result = await work
    finally:
        ticker.cancel()
    return result, max(gaps)


def test_memory_accounting_of_an_upload_runs_off_the_loop(tmp_path: Path) -> None:
    loader = SlowToMeasure()

    async def main() -> None:
        repo = ModelRepository(tmp_path, loader=loader, memory_budget_bytes=1 << 30)
        await repo.start()
        try:
            config = {"max_batch_size": 16}
            number, stall = await _longest_stall(repo.add_version(
                "m", fake_symbol(), b"params", config=config))
            assert number == 1 and loader.measured == [(16, 4)]
            assert stall < MEASURE_S / 2, f"the event loop stalled {stall:.3f} s"
            number, stall = await _longest_stall(repo.add_version(
                "m", fake_symbol(seed=1), b"params", config=config))
            assert number == 2 and len(loader.measured) >= 2
            assert stall < MEASURE_S / 2, f"the event loop stalled {stall:.3f} s"
        finally:
            await repo.close()

    run(main())


def test_memory_accounting_of_a_load_from_disk_runs_off_the_loop(tmp_path: Path) -> None:
    loader = SlowToMeasure()
    write_version(tmp_path, "m", 1, fake_symbol(), b"params")

    async def main() -> None:
        repo = ModelRepository(tmp_path, loader=loader, memory_budget_bytes=1 << 30)
        _, stall = await _longest_stall(repo.start())
        try:
            assert repo.get("m").version == 1 and loader.measured
            assert stall < MEASURE_S / 2, f"the event loop stalled {stall:.3f} s"
        finally:
            await repo.close()

    run(main())


def test_files_written_into_staging_are_served_and_staging_is_always_removed(
        tmp_path: Path) -> None:
    async def main() -> None:
        repo = ModelRepository(tmp_path, loader=fake_loader)
        await repo.start()
        try:
            async with repo.staging() as staging:
                assert staging.parent == tmp_path and staging.name.startswith(TMP_PREFIX)
                (staging / SYMBOL_NAME).write_bytes(fake_symbol(seed=3))
                (staging / PARAMS_NAME).write_bytes(b"params")
                assert await repo.add_staged("m", staging, config={"max_batch_size": 4}) == 1
            assert repo.get("m").version == 1 and not staging.exists()
            with pytest.raises(InvalidModel):
                async with repo.staging() as staging:
                    (staging / SYMBOL_NAME).write_bytes(fake_symbol(broken=True))
                    (staging / PARAMS_NAME).write_bytes(b"params")
                    await repo.add_staged("m", staging)
            with pytest.raises(ConnectionError):
                async with repo.staging() as staging:
                    (staging / SYMBOL_NAME).write_bytes(b"half a sym")
                    raise ConnectionError("the client went away")
            assert sorted(path.name for path in tmp_path.iterdir()) == ["m"]
            assert sorted(path.name for path in (tmp_path / "m").iterdir()) == ["1", "config.json"]
        finally:
            await repo.close()

    run(main())

