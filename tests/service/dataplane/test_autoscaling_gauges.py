"""The autoscaling gauges of ``/metrics``: queue depth, requests in flight and the oldest
queued request's age, read at scrape time for each loaded model version."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx

from tests.service.gated import gate_batches, mlp_body, wait_until
from tests.service.helpers import MLP, config_for, files_for, run, serving, settings_for

GAUGES = ("hybridserve_queue_depth", "hybridserve_requests_in_flight",
          "hybridserve_queue_oldest_seconds")


async def _gauges(client: httpx.AsyncClient) -> dict[str, float]:
    text = (await client.get("/metrics")).text
    values = {}
    for name in GAUGES:
        found = re.search(rf'^{name}{{model="{MLP}",version="1"}} (\S+)$', text, re.MULTILINE)
        assert found, f"{name} missing from /metrics"
        values[name] = float(found.group(1))
    return values


def test_gauges_show_queued_and_computing_requests_and_the_oldest_wait(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path), models=()) as (client, runtime):
            symbol, params = files_for(MLP)
            config = {**config_for(MLP), "max_batch_size": 1}
            await runtime.repository.add_version(MLP, symbol, params, config=config)
            handle = runtime.repository.get(MLP)
            assert await _gauges(client) == dict.fromkeys(GAUGES, 0.0)
            gate = gate_batches(handle)
            url = f"/v2/models/{MLP}/infer"
            try:
                requests = [asyncio.create_task(client.post(url, json=mlp_body({})))
                            for _ in range(3)]
                await wait_until(lambda: handle.batcher.computing == 1
                             and handle.batcher.queue_depth == 2)
                await asyncio.sleep(0.1)
                first = await _gauges(client)
                await asyncio.sleep(0.1)
                later = await _gauges(client)
                assert first["hybridserve_queue_depth"] == 2
                assert first["hybridserve_requests_in_flight"] == 3
                assert first["hybridserve_queue_oldest_seconds"] >= 0.1
                # The age is the wait so far, computed at each scrape.
                assert (later["hybridserve_queue_oldest_seconds"]
                        >= first["hybridserve_queue_oldest_seconds"] + 0.1)
                gate.set()
                for request in requests:
                    assert (await request).status_code == 200
            finally:
                gate.set()
            assert await _gauges(client) == dict.fromkeys(GAUGES, 0.0)

    run(scenario())
