"""End to end: a real uvicorn process, every conformance model uploaded and served four ways."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest

from engine.serving.config import DATATYPES, datatype_of
from tests.conformance.fixtures import assert_close, model_io_sets, model_meta, model_names
from tests.e2e.server import TOKEN, Server, running_server
from tests.service.helpers import config_for, files_for

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TOLERANCE = {"rtol": 1e-3, "atol": 1e-5}  # RNN models need 1e-3 (see tests/conformance)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("e2e") / "repository"
    with running_server(root) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        yield http


def _upload(client: httpx.Client, name: str, **overrides: bytes) -> httpx.Response:
    symbol, params = files_for(name)
    files = {"symbol": ("s.json", overrides.get("symbol", symbol)),
             "params": ("p.params", overrides.get("params", params)),
             "config": ("config.json", json.dumps(config_for(name)).encode())}
    return client.post(f"/models/{name}", files=files, headers=AUTH)


def _matching_sets(name: str) -> list[tuple[dict[str, np.ndarray], list[np.ndarray]]]:
    """io sets whose input dtypes are the model's (text_lstm's float tokens are not)."""
    declared = {spec["name"]: spec["dtype"] for spec in model_meta(name)["inputs"]}
    return [(inputs, expected) for inputs, expected in model_io_sets(name)
            if all(str(array.dtype) == declared[key] for key, array in inputs.items())]


@pytest.mark.parametrize("name", model_names())
def test_conformance_model_served_four_ways(server: Server, client: httpx.Client,
                                            name: str) -> None:
    import tritonclient.http as triton

    response = _upload(client, name)
    assert response.status_code == 201, response.text
    output_names = [tensor["name"] for tensor in response.json()["outputs"]]
    url = f"/v2/models/{name}/infer"
    with triton.InferenceServerClient(server.url.removeprefix("http://")) as tclient:
        assert tclient.is_server_live() and tclient.is_server_ready()
        assert tclient.is_model_ready(name)
        metadata = tclient.get_model_metadata(name)
        assert [tensor["name"] for tensor in metadata["outputs"]] == output_names
        for inputs, expected in _matching_sets(name):
            predicted = client.post("/predict", json={
                "model": name, "inputs": {key: array.tolist() for key, array in inputs.items()}})
            assert predicted.status_code == 200, predicted.text
            outputs = predicted.json()["outputs"]
            for output, reference in zip(output_names, expected):
                assert_close(np.array(outputs[output]), reference, TOLERANCE, f"{name} predict")

            tensors = [{"name": key, "datatype": datatype_of(array.dtype),
                        "shape": list(array.shape), "data": array.tolist()}
                       for key, array in inputs.items()]
            body = client.post(url, json={"id": "e2e", "inputs": tensors}).json()
            assert body["id"] == "e2e"
            for tensor, reference in zip(body["outputs"], expected):
                assert_close(np.array(tensor["data"]).reshape(tensor["shape"]), reference,
                             TOLERANCE, f"{name} v2 json")

            check_binary(client, url, inputs, expected, name)
            for binary in (False, True):
                triton_inputs = []
                for key, array in inputs.items():
                    tensor = triton.InferInput(key, list(array.shape), datatype_of(array.dtype))
                    tensor.set_data_from_numpy(array, binary_data=binary)
                    triton_inputs.append(tensor)
                requested = [triton.InferRequestedOutput(output, binary_data=binary)
                             for output in output_names]
                result = tclient.infer(name, triton_inputs, outputs=requested, request_id="t")
                assert result.get_response()["id"] == "t"
                for output, reference in zip(output_names, expected):
                    assert_close(result.as_numpy(output), reference, TOLERANCE,
                                 f"{name} tritonclient binary={binary}")


def check_binary(client: httpx.Client, url: str, inputs: dict[str, np.ndarray],
                 expected: list[np.ndarray], name: str) -> None:
    """Inputs and outputs as the binary-tensor extension carries them; outputs read by the
    datatype the response declares."""
    header = orjson.dumps({"inputs": [
        {"name": key, "datatype": datatype_of(array.dtype), "shape": list(array.shape),
         "parameters": {"binary_data_size": array.nbytes}} for key, array in inputs.items()],
        "parameters": {"binary_data_output": True}})
    body = header + b"".join(np.ascontiguousarray(array).tobytes() for array in inputs.values())
    response = client.post(url, content=body,
                           headers={"Inference-Header-Content-Length": str(len(header))})
    assert response.status_code == 200, response.text
    offset = length = int(response.headers["Inference-Header-Content-Length"])
    for tensor, reference in zip(orjson.loads(response.content[:length])["outputs"], expected):
        size = tensor["parameters"]["binary_data_size"]
        values = np.frombuffer(response.content[offset:offset + size],
                               DATATYPES[tensor["datatype"]])
        assert_close(values.reshape(tensor["shape"]), reference, TOLERANCE, f"{name} binary")
        offset += size


def _listing(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*")
                  if ".tmp" not in str(path))


def test_bad_input_is_refused_and_the_server_stays_healthy(server: Server,
                                                           client: httpx.Client) -> None:
    assert _upload(client, "seed_mlp").status_code == 201
    before = _listing(server.repository)
    zeros = np.zeros((1, 512), np.float32)
    symbol, params = files_for("seed_mlp")
    graph = json.loads(symbol)
    graph["nodes"][-1]["op"] = "NotAnOp"
    corrupted = bytearray(params)
    corrupted[:8] = b"\xee" * 8
    v2 = "/v2/models/seed_mlp/infer"
    tensor = {"name": "data", "datatype": "FP32", "shape": [1, 512], "data": zeros.tolist()}
    cases = [
        (lambda: client.post(v2, json={"inputs": [{**tensor, "datatype": "INT32"}]}), 400,
         "datatype INT32; expected FP32"),
        (lambda: client.post(v2, json={"inputs": [{**tensor, "shape": [2, 256]}]}), 400,
         "shape [2, 256]; expected [-1, 512]"),
        (lambda: client.post(v2, json={"inputs": [{**tensor, "shape": [1, 513]}]}), 400,
         "needs 513 elements, but data has 512"),
        (lambda: client.post(v2, json={"inputs": [{**tensor, "name": "x"}]}), 400,
         "has no input 'x'"),
        (lambda: client.post("/predict", json={"model": "multi_io", "inputs": {
            "data0": [[0.0] * 5]}}), 400, "missing input 'data1'"),
        (lambda: client.post(v2, content=b"\x00garbage"), 400, "not valid JSON"),
        (lambda: client.post(v2, content=b"0" * ((64 << 20) + 1)), 413, "max_request_bytes"),
        (lambda: client.post("/predict", json={"model": "nope", "inputs": {"x": [1]}}), 404,
         "'nope'"),
        (lambda: client.get("/v2/models/seed_mlp/versions/9"), 404, "no version 9"),
        (lambda: _upload(client, "seed_mlp", params=params[:1000]), 422, "seed_mlp"),
        (lambda: _upload(client, "seed_mlp", params=bytes(corrupted)), 422, "seed_mlp"),
        (lambda: _upload(client, "seed_mlp", symbol=json.dumps(graph).encode()), 422,
         "NotAnOp"),
        (lambda: client.delete("/models/seed_mlp"), 401, "Authorization: Bearer"),
        (lambda: client.delete("/models/seed_mlp", headers={"Authorization": "Bearer x"}), 403,
         "not the server's admin token"),
        (lambda: client.post("/predict", json={"model": "../x", "inputs": {"x": [1]}}), 400,
         "'../x' is not allowed"),
        (lambda: client.post("/models/..x", files={"symbol": b"{}", "params": b""},
                             headers=AUTH), 400, "not allowed"),
    ]
    for request, status, message in cases:
        response = request()
        assert response.status_code == status, (message, response.text)
        assert message in response.json()["error"], response.text
        assert client.get("/v2/health/ready").status_code == 200
    assert _listing(server.repository) == before
    ok = client.post("/predict", json={"model": "seed_mlp", "inputs": {"data": zeros.tolist()}})
    assert ok.status_code == 200
    metrics = client.get("/metrics").text
    assert 'hybridserve_http_errors_total{status="400"}' in metrics


def test_admin_port_serves_management_only(tmp_path: Path) -> None:
    with running_server(tmp_path / "repository", admin_port=True) as split:
        with httpx.Client(timeout=30) as http:
            symbol, params = files_for("hybridnet")
            files = {"symbol": ("s", symbol), "params": ("p", params),
                     "config": ("c", json.dumps(config_for("hybridnet")).encode())}
            assert http.post(f"{split.url}/models/hn", files=files,
                             headers=AUTH).status_code == 404
            response = http.post(f"{split.admin_url}/models/hn", files=files, headers=AUTH)
            assert response.status_code == 201, response.text
            predicted = http.post(f"{split.url}/predict", json={
                "model": "hn", "inputs": {"data": [[0.5, 1, 2, 3]]}})
            assert predicted.status_code == 200
            assert http.post(f"{split.admin_url}/predict", json={}).status_code == 404
            assert http.get(f"{split.admin_url}/v2/health/ready").status_code == 200
