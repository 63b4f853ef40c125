"""Pipelines through the management API: the upload's answer, its refusal, the served config."""

from __future__ import annotations

import json
from pathlib import Path

from tests.service.helpers import AUTH, files_for, run, serving, settings_for


def _upload_files(name: str, config: dict) -> dict:
    symbol, params = files_for(name)
    return {"symbol": ("s.json", symbol), "params": ("p.params", params),
            "config": ("config.json", json.dumps(config).encode())}


def test_upload_answers_the_preprocess_check_and_serves_the_completed_pipeline(
        tmp_path: Path) -> None:
    config = {"inputs": [{"name": "data", "preprocess": "imagenet"}]}

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), models=()) as (client, _):
            response = await client.post("/models/pre", files=_upload_files("resblock", config),
                                         headers=AUTH)
            assert response.status_code in (200, 201), response.text
            check = response.json()["checks"]["preprocess"]
            assert check["ran"] and check["inputs"] == {"data": [3, 224, 224]}
            assert check["warnings"] == []
            detail = (await client.get("/models/pre", headers=AUTH)).json()
            assert detail["checks"]["preprocess"] == check
            image = detail["config"]["inputs"][0]["preprocess"]["image"]
            assert image["center_crop"] == [224, 224] and image["resize"]["shorter_side"] == 256
            refused = await client.post("/models/gray", files=_upload_files("lenet", config),
                                        headers=AUTH)
            assert refused.status_code == 422
            assert "1 channel(s) at dimension 1" in refused.json()["error"]
            unknown = await client.post("/models/bad", headers=AUTH, files=_upload_files(
                "resblock", {"inputs": [{"name": "data", "preprocess": {
                    "image": {"center_crop": 32, "normalise": True}}}]}))
            assert unknown.status_code == 422
            assert "inputs.0.preprocess.image.normalise" in unknown.json()["error"]

    run(scenario())
