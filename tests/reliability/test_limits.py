"""Security limits, each checked as a client would hit it: sizes, names, tokens, memory, pickle."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import numpy as np
import pytest

from engine import nd, sym
from engine.graph.json_format import MAX_NODES
from tests.e2e.server import TOKEN as E2E_TOKEN
from tests.e2e.server import running_server
from tests.reliability.inprocess import AppClient, app_client
from tests.service.helpers import AUTH, files_for, first_io

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppClient]:
    root = tmp_path_factory.mktemp("limits") / "repository"
    with app_client(root, ("seed_mlp",), max_request_bytes=64 * 1024,
                    max_upload_bytes=2 * MIB, max_tensor_elements=4096) as running:
        yield running


def _error(response: httpx.Response, status: int, *words: str) -> str:
    assert response.status_code == status, response.text
    message = response.json()["error"]
    assert isinstance(message, str)
    for word in words:
        assert word in message, message
    return message


def _entries(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*")}


def test_request_body_over_limit_is_413_with_or_without_content_length(client: AppClient) -> None:
    body = b"[" + b"0," * 40_000 + b"0]"
    response = client.request("POST", "/predict", content=body)
    _error(response, 413, "max_request_bytes")

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 4096):
            yield body[start:start + 4096]

    streamed = client.request("POST", "/v2/models/seed_mlp/infer", content=chunks())
    _error(streamed, 413, "max_request_bytes")


def test_upload_over_its_own_limit_is_413_and_leaves_nothing(client: AppClient) -> None:
    root = client.runtime.settings.model_repository
    before = _entries(root)
    symbol, _ = files_for("seed_mlp")
    response = client.upload("too_big", symbol, b"\0" * (3 * MIB))
    _error(response, 413, "max_upload_bytes")
    assert _entries(root) == before


def test_tensor_over_element_limit_is_413_on_both_apis(client: AppClient) -> None:
    rows = np.zeros((9, 512), np.float32)  # 4608 elements > 4096
    predict = client.request("POST", "/predict",
                             json={"model": "seed_mlp", "inputs": {"data": rows.tolist()}})
    _error(predict, 413, "max_tensor_elements")
    v2 = client.request("POST", "/v2/models/seed_mlp/infer", json={"inputs": [
        {"name": "data", "datatype": "FP32", "shape": [9, 512], "data": [0.0] * 4608}]})
    _error(v2, 413, "max_tensor_elements")
    # The declared shape alone is enough: no data is read for a shape over the limit.
    declared = client.request("POST", "/v2/models/seed_mlp/infer", json={"inputs": [
        {"name": "data", "datatype": "FP32", "shape": [1 << 30, 1 << 30], "data": [0.0]}]})
    _error(declared, 413, "max_tensor_elements")


def test_graph_over_node_limit_is_422(client: AppClient) -> None:
    nodes = [{}] * (MAX_NODES + 1)  # the count is checked before any node is read
    symbol = json.dumps({"nodes": nodes, "arg_nodes": [0], "heads": [[0, 0, 0]]}).encode()
    response = client.upload("many_nodes", symbol, nd_params({}))
    _error(response, 422, "max_nodes")


def test_params_declaring_huge_arrays_are_refused_without_allocating(client: AppClient) -> None:
    symbol, params = files_for("seed_mlp")
    # First array record: V2 magic, storage 0, ndim 2 with dims patched to 2**40 x 2**8.
    patched = bytearray(params)
    header = 8 + 8 + 8 + 4 + 4  # file magic, reserved, count, array magic, storage type
    patched[header:header + 4] = (2).to_bytes(4, "little")
    patched[header + 4:header + 20] = (1 << 40).to_bytes(8, "little") + (256).to_bytes(8, "little")
    response = client.upload("huge_params", symbol, bytes(patched))
    _error(response, 422)


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "a/b", "a\\b", "-x", "x" * 65, "é",
                                  "%2e%2e", "a b", "a\x00b"])
def test_unsafe_model_names_are_refused(client: AppClient, name: str) -> None:
    root = client.runtime.settings.model_repository
    before = _entries(root)
    outside = set(root.parent.iterdir())
    # Files that fail validation: a name that got through would answer 422, not 400/404/405.
    response = client.upload(quote(name, safe=""), b"{}", b"x")
    assert response.status_code in (400, 404, 405), response.text
    assert "error" in response.json()
    assert _entries(root) == before
    assert set(root.parent.iterdir()) == outside


@pytest.mark.parametrize("path", ["/models/..%2F..%2Fetc", "/models/seed_mlp/versions/..%2F1",
                                  "/models/seed_mlp/versions/-1", "/models/seed_mlp/versions/01x",
                                  "/v2/models/..%2Fseed_mlp/versions/1/infer",
                                  "/v2/models/seed_mlp/versions/1%2F..%2F..%2F/infer"])
def test_traversal_attempts_never_leave_the_repository(client: AppClient, path: str) -> None:
    root = client.runtime.settings.model_repository
    before = _entries(root)
    for method in ("GET", "POST", "DELETE"):
        response = client.request(method, path, headers=AUTH, json={"inputs": []})
        assert response.status_code in (400, 404, 405), (method, path, response.text)
        assert "error" in response.json()
    assert _entries(root) == before


def test_management_needs_the_exact_token(client: AppClient) -> None:
    _error(client.request("DELETE", "/models/seed_mlp"), 401, "Authorization")
    _error(client.request("DELETE", "/models/seed_mlp",
                          headers={"Authorization": "Bearer " + "test-token"[:-1]}), 403)
    _error(client.request("DELETE", "/models/seed_mlp",
                          headers={"Authorization": "Basic dGVzdC10b2tlbg=="}), 401)
    assert client.request("GET", "/v2/models/seed_mlp/ready").status_code == 200


def test_management_is_off_without_a_configured_token(tmp_path: Path) -> None:
    with app_client(tmp_path / "repository", (), admin_token=None) as client:
        response = client.request("DELETE", "/models/any", headers=AUTH)
        _error(response, 403, "no admin token")


def test_no_pickle_anywhere_in_the_runtime() -> None:
    pattern = re.compile(r"^\s*(import|from)\s+(pickle|cPickle|dill|joblib|cloudpickle)\b|"
                         r"allow_pickle\s*=\s*True|\bmarshal\.loads\b", re.MULTILINE)
    offenders = [str(path.relative_to(ROOT)) for package in ("engine", "service")
                 for path in (ROOT / package).rglob("*.py") if pattern.search(path.read_text())]
    assert offenders == []


def nd_params(arrays: dict[str, np.ndarray]) -> bytes:
    """A .params file holding `arrays`, written by `engine.nd.save`."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "p.params"
        nd.save(str(path), {name: nd.array(value) for name, value in arrays.items()})
        return path.read_bytes()


def memory_bomb(reps: int) -> tuple[bytes, bytes, bytes]:
    """A valid graph whose only op, ``tile``, turns a 4-float row into ``4 * reps`` floats."""
    symbol = sym.tile(sym.var("data"), reps=(1, reps)).tojson().encode()
    config = {"inputs": [{"name": "data", "datatype": "FP32", "shape": [-1, 4]}],
              "max_batch_size": 1}
    return symbol, nd_params({}), json.dumps(config).encode()


def _peak_rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]


@pytest.mark.e2e
def test_planned_memory_over_the_cap_is_422_before_allocating(tmp_path: Path) -> None:
    """A 128 MiB activation against a 32 MiB budget: refused at upload, nothing allocated."""
    symbol, params, config = memory_bomb(1 << 23)
    cap = 32 * MIB
    extra = ["--memory-budget-bytes", str(cap), "--log-level", "debug", "--access-log"]
    with running_server(tmp_path / "repository", extra) as server:
        auth = {"Authorization": f"Bearer {E2E_TOKEN}"}
        files = {"symbol": ("s.json", symbol), "params": ("p.params", params),
                 "config": ("config.json", config)}
        peak_before = _peak_rss(server.process.pid)
        response = httpx.post(server.url + "/models/bomb", files=files, headers=auth, timeout=60)
        growth = _peak_rss(server.process.pid) - peak_before
        models = httpx.get(server.url + "/models", timeout=10).json()
        # Tokens never reach the log, right or wrong.
        httpx.delete(server.url + "/models/nothing", timeout=10,
                     headers={"Authorization": "Bearer wrong-secret-token"})
        log_text = next(tmp_path.glob("server-*.log")).read_text()
    assert E2E_TOKEN not in log_text and "wrong-secret-token" not in log_text
    assert [model["name"] for model in models] == []
    assert response.status_code == 422, (response.status_code, response.text)
    assert "memory" in response.json()["error"]
    assert growth < 64 * MIB, f"peak RSS grew by {growth / MIB:.0f} MiB while refusing the upload"


def test_first_io_of_seed_mlp_still_answers(client: AppClient) -> None:
    inputs, expected = first_io("seed_mlp")
    response = client.request("POST", "/predict", json={
        "model": "seed_mlp", "inputs": {name: array.tolist() for name, array in inputs.items()}})
    assert response.status_code == 200, response.text
    output = np.asarray(next(iter(response.json()["outputs"].values())), np.float32)
    np.testing.assert_allclose(output, expected[0], rtol=1e-4, atol=1e-5)
