"""Management through the app: auth, uploads (good and bad), delete, load, unload, index."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orjson

from tests.service.helpers import (
    AUTH,
    MLP,
    config_for,
    files_for,
    first_io,
    run,
    serving,
    settings_for,
)


def _files(name: str, *, symbol: bytes | None = None, params: bytes | None = None,
           config: dict | None = None) -> dict:
    original_symbol, original_params = files_for(name)
    files = {"symbol": ("s.json", symbol or original_symbol),
             "params": ("p.params", params or original_params)}
    files["config"] = ("config.json", json.dumps(config or config_for(name)).encode())
    return files


def _listing(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


def test_mutations_need_the_token(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path), []) as (client, _):
            response = await client.post("/models/m", files=_files("hybridnet"))
            assert response.status_code == 401 and response.headers["WWW-Authenticate"] == "Bearer"
            response = await client.delete("/models/m", headers={"Authorization": "Bearer bad"})
            assert response.status_code == 403
            assert "not the server's admin token" in response.json()["error"]
            response = await client.post("/v2/repository/models/m/load",
                                         headers={"Authorization": "Basic eDp5"})
            assert response.status_code == 401
        async with serving(settings_for(tmp_path, admin_token=None), []) as (client, _):
            response = await client.post("/models/m", files=_files("hybridnet"), headers=AUTH)
            assert response.status_code == 403
            assert "HYBRIDSERVE_ADMIN_TOKEN" in response.json()["error"]

    run(scenario())


def test_upload_infer_list_describe_delete(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path), []) as (client, _):
            response = await client.post("/models/hn", files=_files("hybridnet"), headers=AUTH)
            assert response.status_code == 201, response.text
            created = response.json()
            assert (created["version"], created["state"]) == (1, "READY")
            assert created["inputs"] == [{"name": "data", "datatype": "FP32", "shape": [-1, 4]}]
            inputs, expected = first_io("hybridnet")
            response = await client.post("/predict", json={
                "model": "hn", "inputs": {"data": inputs["data"].tolist()}})
            np.testing.assert_allclose(list(response.json()["outputs"].values())[0],
                                       expected[0], rtol=1e-4, atol=1e-5)
            response = await client.post("/models/hn", files=_files("hybridnet"),
                                         data={"version": "5"}, headers=AUTH)
            assert response.json()["version"] == 5
            response = await client.post("/models/hn", files=_files("hybridnet"),
                                         data={"version": "5"}, headers=AUTH)
            assert response.status_code == 409 and "already exists" in response.json()["error"]
            listing = (await client.get("/models")).json()
            assert listing[0]["name"] == "hn"
            assert [row["version"] for row in listing[0]["versions"]] == [1, 5]
            detail = (await client.get("/models/hn")).json()
            assert detail["ready_version"] == 5 and detail["config"]["max_batch_size"] == 32
            response = await client.delete("/models/hn/versions/5", headers=AUTH)
            assert response.status_code == 200
            # A version is an integer in every management answer, as in the upload's.
            assert response.json() == {"name": "hn", "version": 5, "action": "deleted"}
            assert (await client.get("/models/hn")).json()["versions"][-1]["version"] == 1
            assert (await client.delete("/models/hn", headers=AUTH)).status_code == 200
            assert (await client.get("/models/hn")).status_code == 404
            assert (await client.post("/models/hn/load", headers=AUTH)).status_code == 404

    run(scenario())


def test_bad_uploads_leave_the_repository_unchanged(tmp_path: Path) -> None:
    symbol, params = files_for("hybridnet")
    graph = json.loads(symbol)
    graph["nodes"][-1]["op"] = "NoSuchOp"
    corrupted = bytearray(params)
    corrupted[:8] = b"\xff" * 8
    cases = [
        ("hybridnet", {"params": params[: len(params) // 2]}, 422),
        ("hybridnet", {"params": bytes(corrupted)}, 422),
        ("hybridnet", {"symbol": json.dumps(graph).encode()}, 422),
        ("hybridnet", {"symbol": b"{not json"}, 422),
    ]

    async def scenario() -> None:
        async with serving(settings_for(tmp_path)) as (client, _):
            before = _listing(tmp_path)
            for name, override, status in cases:
                response = await client.post("/models/hn", files=_files(name, **override),
                                             headers=AUTH)
                assert response.status_code == status, response.text
                assert "hn" in response.json()["error"]
                assert _listing(tmp_path) == before
            response = await client.post("/models/hn", files=_files(
                "hybridnet", symbol=json.dumps(graph).encode()), headers=AUTH)
            assert "NoSuchOp" in response.json()["error"]
            response = await client.post("/models/..%2Fx", files=_files("hybridnet"),
                                         headers=AUTH)
            assert response.status_code in (400, 404)
            response = await client.post("/models/.x", files=_files("hybridnet"), headers=AUTH)
            assert response.status_code == 400 and "not allowed" in response.json()["error"]
            response = await client.post("/models/hn", files={"symbol": ("s", b"{}")},
                                         headers=AUTH)
            assert response.status_code == 400 and "params" in response.json()["error"]
            response = await client.post("/models/hn", files=_files("hybridnet"),
                                         data={"version": "0"}, headers=AUTH)
            assert response.status_code == 400
            assert _listing(tmp_path) == before
            assert (await client.get(f"/v2/models/{MLP}/ready")).status_code == 200

    run(scenario())


def test_load_unload_and_repository_index(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path)) as (client, _):
            index = (await client.post("/v2/repository/index")).json()
            assert index == [{"name": MLP, "version": "1", "state": "READY", "reason": ""}]
            response = await client.post(f"/v2/repository/models/{MLP}/unload", headers=AUTH)
            assert response.status_code == 200
            response = await client.get(f"/v2/models/{MLP}/ready")
            # Not ready is the protocol's 4xx, and Triton's 400.
            assert response.status_code == 400 and "not ready" in response.json()["error"]
            index = (await client.post("/v2/repository/index", json={"ready": False})).json()
            assert index[0]["state"] in ("UNLOADING", "UNAVAILABLE")  # draining, then gone
            assert (await client.post(f"/models/{MLP}/load", headers=AUTH)).status_code == 200
            assert (await client.get(f"/v2/models/{MLP}/ready")).json()["ready"] is True
            response = await client.post(f"/models/{MLP}/unload", params={"version": "1"},
                                         headers=AUTH)
            assert response.json() == {"name": MLP, "version": 1, "action": "unloaded"}
            response = await client.post(f"/models/{MLP}/load", params={"version": "1"},
                                         headers=AUTH)
            assert response.json() == {"name": MLP, "version": 1, "action": "loaded"}

    run(scenario())


def test_metrics_and_openapi(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path)) as (client, _):
            inputs, _ = first_io(MLP)
            await client.post("/predict", json={"model": MLP, "inputs": {
                "data": inputs["data"].tolist()}})
            await client.post("/predict", json={"model": MLP, "inputs": {"data": [[1]]}})
            text = (await client.get("/metrics")).text
            for line in ('hybridserve_requests_total{model="seed_mlp",outcome="success",'
                         'version="1"} 1.0', 'hybridserve_http_errors_total{status="400"} 1.0',
                         "hybridserve_models_loaded 1.0",
                         'hybridserve_batch_size_count{model="seed_mlp",version="1"}',
                         'hybridserve_queue_time_seconds_bucket{le="+Inf",model="seed_mlp"',
                         'hybridserve_compute_time_seconds_sum{model="seed_mlp",version="1"}',
                         'hybridserve_model_memory_bytes{model="seed_mlp",version="1"}',
                         'hybridserve_request_latency_seconds_count{model="seed_mlp",'):
                assert line in text, line
            document = orjson.loads((await client.get("/openapi.json")).content)
            paths = document["paths"]
            for path in ("/v2", "/v2/health/live", "/v2/models/{name}/infer", "/predict",
                         "/models/{name}", "/v2/repository/index", "/metrics"):
                assert path in paths, path
            body = paths["/predict"]["post"]["requestBody"]["content"]["application/json"]
            assert body["schema"]["$ref"].endswith("/PredictRequest")
            schemas = document["components"]["schemas"]
            assert {"PredictRequest", "V2InferRequest", "V2InputTensor"} <= set(schemas)
            upload = paths["/models/{name}"]["post"]["requestBody"]["content"]
            assert "multipart/form-data" in upload
            assert (await client.get("/docs")).status_code == 200

    run(scenario())


def test_the_upload_answer_and_the_details_show_what_the_load_compiled(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path), []) as (client, _):
            config = {**config_for("hybridnet"), "batch_buckets": [2, 8]}
            response = await client.post("/models/hn", files=_files("hybridnet", config=config),
                                         headers=AUTH)
            assert response.status_code == 201, response.text
            compiled = response.json()["checks"]["compile"]
            assert compiled["ran"] is True and compiled["seconds"] >= 0
            purposes = [purpose for plan in compiled["plans"] for purpose in plan["purposes"]]
            assert "test inference" in purposes
            assert {"batch bucket 2", "batch bucket 8"} <= set(purposes)
            assert all(plan["inputs"]["data"][1:] == [4] and plan["planned_bytes"] >= 0
                       for plan in compiled["plans"])
            detail = (await client.get("/models/hn")).json()
            assert detail["checks"]["compile"] == compiled

    run(scenario())


def test_an_upload_says_which_versions_stopped_serving_and_what_changed(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path), []) as (client, _):
            first = (await client.post("/models/m", files=_files(MLP), headers=AUTH)).json()
            assert (first["version"], first["previous_version"]) == (1, None)
            assert first["stopped_serving"] == [] and first["tensor_changes"] == []
            # Other files under the same name: version 2, and the default version policy
            # (latest 1) stops version 1, whose clients now reach another interface.
            second = (await client.post("/models/m", files=_files("hybridnet"),
                                        headers=AUTH)).json()
            assert (second["version"], second["previous_version"]) == (2, 1)
            assert second["stopped_serving"] == [1]
            assert second["inputs_changed"] and second["outputs_changed"]
            changes = {(change["kind"], change["name"]): change
                       for change in second["tensor_changes"]}
            assert changes[("input", "data")]["before"]["shape"] == [-1, 512]
            assert changes[("input", "data")]["after"]["shape"] == [-1, 4]
            assert changes[("output", "seed_mlp_dense2_fwd_output")]["after"] is None
            added = [change for change in second["tensor_changes"] if change["before"] is None]
            assert [change["kind"] for change in added] == ["output"]
            # The same interface again: version 2 stops, nothing changes for clients.
            third = (await client.post("/models/m", files=_files("hybridnet"),
                                       headers=AUTH)).json()
            assert (third["previous_version"], third["stopped_serving"]) == (2, [2])
            assert not third["inputs_changed"] and not third["outputs_changed"]
            assert third["tensor_changes"] == []
            # An explicit existing version is a 409 saying how to replace it.
            refused = await client.post("/models/m", files=_files("hybridnet"),
                                        data={"version": "3"}, headers=AUTH)
            assert refused.status_code == 409
            assert "upload again with replace=true" in refused.json()["error"]
            replaced = await client.post("/models/m", files=_files("hybridnet"),
                                         data={"version": "3", "replace": "true"}, headers=AUTH)
            assert replaced.status_code == 201, replaced.text
            assert (replaced.json()["previous_version"], replaced.json()["stopped_serving"]) == (
                3, [])

    run(scenario())
