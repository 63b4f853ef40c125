"""End to end: a real server warms a model up from its ``model_warmup`` before serving it (a
sample read from a .npy file in the version's folder, a random one), shows the samples in the
checks and in Triton's config, and leaves a model whose sample cannot be made UNAVAILABLE,
naming the sample."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from engine.serving.manifest import PARAMS_NAME, SYMBOL_NAME, write_manifest
from tests.e2e.server import TOKEN, running_server
from tests.service.helpers import files_for

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WIDTH = 512  # seed_mlp's input width


def _model(root: Path, name: str, warmup: list[dict], files: dict[str, np.ndarray]) -> None:
    symbol, params = files_for("seed_mlp")
    version = root / name / "1"
    version.mkdir(parents=True)
    (version / SYMBOL_NAME).write_bytes(symbol)
    (version / PARAMS_NAME).write_bytes(params)
    for relative, array in files.items():
        (version / relative).parent.mkdir(parents=True, exist_ok=True)
        np.save(version / relative, array)
    write_manifest(version)
    (root / name / "config.json").write_text(json.dumps(
        {"max_batch_size": 8, "warmup": warmup}))


def _settled(client: httpx.Client, names: set[str], timeout_s: float = 120) -> dict[str, dict]:
    """The repository index's rows of `names` once none is LOADING (generous on a busy
    machine: each load compiles and warms up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = {row["name"]: row for row in client.post("/v2/repository/index", json={}).json()}
        if names <= rows.keys() and all(rows[n].get("state") != "LOADING" for n in names):
            return rows
        assert time.monotonic() < deadline, f"still loading after {timeout_s} s: {rows}"
        time.sleep(0.2)


def test_a_server_warms_up_before_serving_and_refuses_a_sample_it_cannot_make(
        tmp_path: Path) -> None:
    root = tmp_path / "repository"
    _model(root, "warm", [
        {"name": "a row from a file", "batch_size": 4,
         "inputs": {"data": {"data_type": "TYPE_FP32", "dims": [WIDTH],
                             "input_data_file": "warmup/row.npy"}}},
        {"name": "noise", "batch_size": 8, "count": 2,
         "inputs": {"data": {"random_data": True}}}],
        {"warmup/row.npy": np.linspace(0, 1, WIDTH, dtype=np.float32)})
    _model(root, "cold", [{"name": "missing", "inputs": {
        "data": {"input_data_file": "warmup/absent.npy"}}}], {})
    with running_server(root, wait_for="live") as server, \
            httpx.Client(base_url=server.url, timeout=60) as client:
        rows = _settled(client, {"warm", "cold"})
        assert rows["warm"]["state"] == "READY"
        assert rows["cold"]["state"] == "UNAVAILABLE"
        assert ("warm-up sample 'missing' (model_warmup.0): input 'data': input_data_file "
                "'warmup/absent.npy' is not a file in the model version's folder"
                in rows["cold"]["reason"])

        checks = client.get("/models/warm", headers=AUTH).json()["checks"]
        assert [(s["name"], s["batch_size"], s["runs"]) for s in checks["warmup"]["samples"]] \
            == [("a row from a file", 4, 1), ("noise", 8, 2)]
        triton = client.get("/v2/models/warm/config").json()
        assert triton["model_warmup"][0] == {
            "name": "a row from a file", "batch_size": 4, "count": 1,
            "inputs": {"data": {"data_type": "TYPE_FP32", "dims": [WIDTH],
                                "input_data_file": "warmup/row.npy"}}}

        data = np.ones((3, WIDTH), np.float32)
        answer = client.post("/v2/models/warm/infer", json={"inputs": [
            {"name": "data", "datatype": "FP32", "shape": [3, WIDTH],
             "data": data.ravel().tolist()}]})
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["shape"][0] == 3
