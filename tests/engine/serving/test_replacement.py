"""Replacing a version 20 times under 32 concurrent clients: no failures, no half-loaded model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.serving.repository import ModelRepository
from tests.engine.serving.helpers import SEED_MLP_CONFIG, run, seed_mlp, seed_mlp_shifted

OUTPUT = "seed_mlp_dense2_fwd_output"
REPLACEMENTS = 20
CLIENTS = 32


@pytest.mark.parametrize("in_place", [False, True], ids=["new-versions", "same-version"])
def test_replacing_under_load_fails_no_request(tmp_path: Path, in_place: bool) -> None:
    symbol, params = seed_mlp()
    data = np.random.default_rng(3).normal(size=(2, 512)).astype(np.float32)
    base = engine.load_model(symbol, params).infer({"data": data})[OUTPUT]

    async def main() -> tuple[list[int], list[BaseException]]:
        reader = ModelRepository(tmp_path)
        repo = ModelRepository(tmp_path)
        await repo.start()
        await repo.add_version("mlp", symbol, params, config=SEED_MLP_CONFIG)
        await reader.start()
        shifts: list[int] = []
        failures: list[BaseException] = []
        done = asyncio.Event()

        async def client(source: ModelRepository) -> None:
            while not done.is_set():
                try:
                    result = await source.infer("mlp", {"data": data})
                except Exception as error:  # noqa: BLE001 - every failure is collected
                    failures.append(error)
                    continue
                shift = result[OUTPUT] - base
                level = int(round(float(shift.mean())))
                # One consistent model per request: every element moved by the same whole shift.
                np.testing.assert_allclose(shift, level, atol=1e-3)
                shifts.append(level)

        async def poller() -> None:
            while not done.is_set():
                await reader.poll()
                await asyncio.sleep(0.005)

        tasks = [asyncio.create_task(client(repo if i % 4 else reader)) for i in range(CLIENTS)]
        tasks.append(asyncio.create_task(poller()))
        for shift in range(1, REPLACEMENTS + 1):
            await asyncio.sleep(0.01)
            await repo.add_version("mlp", symbol, seed_mlp_shifted(shift),
                                   version=1 if in_place else None, replace=in_place)
        await asyncio.sleep(0.05)
        done.set()
        await asyncio.gather(*tasks)
        await reader.poll()
        final = await reader.infer("mlp", {"data": data})
        np.testing.assert_allclose(final[OUTPUT] - base, REPLACEMENTS, atol=1e-3)
        expected_version = 1 if in_place else REPLACEMENTS + 1
        assert repo.get("mlp").version == reader.get("mlp").version == expected_version
        await repo.close()
        await reader.close()
        return shifts, failures

    shifts, failures = run(main(), timeout=120)
    assert failures == []
    assert len(shifts) > 2 * CLIENTS
    assert len(set(shifts)) > 1  # clients saw the switches happen
    assert sorted(set(shifts)) == sorted(set(shifts) & set(range(REPLACEMENTS + 1)))


def test_a_replaced_version_gives_up_its_plans_once_drained(tmp_path: Path) -> None:
    symbol, params = seed_mlp()
    data = np.random.default_rng(4).normal(size=(2, 512)).astype(np.float32)

    async def main() -> tuple[list, list, np.ndarray]:
        repo = ModelRepository(tmp_path)
        await repo.start()
        await repo.add_version("mlp", symbol, params, config=SEED_MLP_CONFIG)
        first = repo.get("mlp")
        await repo.infer("mlp", {"data": data})
        compiled = first.model.plan_signatures()
        await repo.add_version("mlp", symbol, seed_mlp_shifted(1))
        record = repo.records("mlp")[1]
        while record.draining:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)  # the drain's done callback queues the tear-down
        await repo._thread(lambda: None)  # the I/O thread ran what was queued before it
        released = first.model.plan_signatures()
        served = (await repo.infer("mlp", {"data": data}))[OUTPUT]
        await repo.close()
        return compiled, released, served

    compiled, released, served = run(main())
    assert compiled, "the first version compiled plans while it served"
    assert released == []
    reference = engine.load_model(symbol, seed_mlp_shifted(1)).infer({"data": data})[OUTPUT]
    np.testing.assert_allclose(served, reference, rtol=1e-5, atol=1e-5)
