"""Each request: its model looked up once, its inputs checked once (`check_inputs`), and the
batcher handed them with their batch size, so that it takes them as they are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.serving.batcher import DynamicBatcher
from tests.service.helpers import MLP, first_io, run, serving, settings_for

MULTI = "multi_io"


def _v2(inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    return {"inputs": [{"name": name, "datatype": "FP32", "shape": list(array.shape),
                        "data": array.ravel().tolist()} for name, array in inputs.items()]}


@pytest.mark.parametrize("route", ["predict", "v2"])
def test_one_look_up_and_the_batch_size_handed_on(tmp_path: Path, route: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    submitted: list[int | None] = []
    submit = DynamicBatcher.submit

    async def spy(self: DynamicBatcher, inputs: Any, **options: Any) -> Any:
        submitted.append(options.get("rows"))
        return await submit(self, inputs, **options)

    monkeypatch.setattr(DynamicBatcher, "submit", spy)

    async def scenario() -> None:
        async with serving(settings_for(tmp_path)) as (client, runtime):
            looked_up: list[tuple[str, object]] = []
            get = runtime.repository.get

            def counting_get(name: str, version: object = None) -> Any:
                looked_up.append((name, version))
                return get(name, version)

            runtime.repository.get = counting_get  # type: ignore[method-assign]
            data = np.repeat(first_io(MLP)[0]["data"], 3, axis=0)
            if route == "predict":
                response = await client.post("/predict", json={
                    "model": MLP, "inputs": {"data": data.tolist()}})
            else:
                response = await client.post(f"/v2/models/{MLP}/infer", json=_v2({"data": data}))
            assert response.status_code == 200, response.text
            assert looked_up == [(MLP, None)]
            assert submitted == [3]

    run(scenario())


@pytest.mark.parametrize(("rows", "message"), [
    ((2, 3), "inputs disagree on the batch size (first dimension): data0 2, data1 3"),
    ((0, 0), "batch size 0 is outside 1..max_batch_size 32; send at least one row"),
])
def test_inputs_of_no_rows_or_of_disagreeing_rows_are_400(tmp_path: Path, rows: tuple[int, int],
                                                           message: str) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path), [MULTI]) as (client, _):
            inputs, _ = first_io(MULTI)
            sized = {name: np.zeros((count, *array.shape[1:]), np.float32)
                     for (name, array), count in zip(inputs.items(), rows)}
            response = await client.post(f"/v2/models/{MULTI}/infer", json=_v2(sized))
            assert response.status_code == 400
            assert response.json()["error"] == f"model {MULTI!r} version 1: {message}"

    run(scenario())
