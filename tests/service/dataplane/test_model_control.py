"""Loading on demand through the service: V2 infer and /predict load a model that is not
loaded, evictions show in /metrics, and no room under the budget is a 503 naming it."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from service.runtime import Runtime
from tests.e2e.large_mlp import probe, write_mlp
from tests.service.helpers import run, serving, settings_for

WIDTHS = (64, 256, 8)


def _repository(root: Path, pinned: set[str] = frozenset()) -> dict[str, np.ndarray]:
    return {name: write_mlp(root / name, seed, widths=WIDTHS, pinned=name in pinned)
            for seed, name in enumerate(("m0", "m1", "m2"))}


async def _one_model_bytes(root: Path) -> int:
    runtime = Runtime.create(settings_for(root, model_control_mode="explicit",
                                          load_model=("m0",)))
    await runtime.repository.start()
    held = runtime.repository.memory_bytes()
    await runtime.repository.close()
    return held


def _v2(name: str) -> tuple[str, dict[str, Any]]:
    data = probe(WIDTHS)
    return f"/v2/models/{name}/infer", {"inputs": [
        {"name": "data", "datatype": "FP32", "shape": list(data.shape),
         "data": data.ravel().tolist()}]}


def test_requests_load_their_model_and_evict_the_least_recently_used(tmp_path: Path) -> None:
    expected = _repository(tmp_path)

    async def main() -> None:
        budget = int(1.5 * await _one_model_bytes(tmp_path))
        settings = settings_for(tmp_path, model_control_mode="explicit", load_on_demand=True,
                                memory_budget_bytes=budget)
        async with serving(settings, models=()) as (client, runtime):
            assert runtime.repository.index()[0].state == "UNAVAILABLE"
            # /predict names its model inside the body.
            reply = await client.post("/predict", json={
                "model": "m1", "inputs": {"data": probe(WIDTHS).tolist()}})
            assert reply.status_code == 200, reply.text
            got = np.array(next(iter(reply.json()["outputs"].values())))
            np.testing.assert_allclose(got, expected["m1"], rtol=1e-4, atol=1e-4)
            # Concurrent first requests: one load, all served.
            path, body = _v2("m2")
            replies = await asyncio.gather(*[client.post(path, json=body) for _ in range(5)])
            for reply in replies:
                assert reply.status_code == 200, reply.text
                got = np.array(reply.json()["outputs"][0]["data"]).reshape(2, WIDTHS[-1])
                np.testing.assert_allclose(got, expected["m2"], rtol=1e-4, atol=1e-4)
            metrics = (await client.get("/metrics")).text
        assert re.search(r'^hybridserve_model_evictions_total\{model="m1"\} 1\.0$', metrics,
                         re.M), metrics
        assert re.search(r'^hybridserve_model_loads_total\{model="m2"\} 1\.0$', metrics, re.M)
        assert re.search(rf"^hybridserve_memory_budget_bytes {budget}\.0$", metrics, re.M)

    run(main())


def test_no_room_for_a_load_on_demand_is_503_naming_the_budget(tmp_path: Path) -> None:
    _repository(tmp_path, pinned={"m0"})

    async def main() -> None:
        budget = int(1.5 * await _one_model_bytes(tmp_path))
        settings = settings_for(tmp_path, model_control_mode="explicit", load_model=("m0",),
                                load_on_demand=True, memory_budget_bytes=budget)
        async with serving(settings, models=()) as (client, runtime):
            path, body = _v2("m1")
            reply = await client.post(path, content=json.dumps(body))
            assert reply.status_code == 503, reply.text
            assert "Retry-After" in reply.headers
            message = reply.json()["error"]
            assert "model 'm1' could not be loaded on demand" in message
            assert f"of the {budget}-byte memory budget are held by 'm0' version 1" in message
            assert "(pinned)" in message
            assert runtime.ready  # a request's failed load is no failing model

    run(main())
