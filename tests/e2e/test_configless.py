"""End to end: every conformance model uploaded WITHOUT config.json to a real uvicorn process,
served four ways; a misfitting shape is a 400 naming input, node, op and shape; 1,000 requests
of random shapes keep the plan cache within its bound and the server's memory flat."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest

from engine.serving.config import datatype_of
from tests.conformance.fixtures import assert_close, model_io_sets, model_names
from tests.e2e.server import TOKEN, Server, running_server
from tests.e2e.test_server import check_binary
from tests.service.helpers import files_for

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TOLERANCE = {"rtol": 1e-3, "atol": 1e-5}  # RNN models need 1e-3 (see tests/conformance)
PLAN_CACHE_SIZE = 8
RANDOM_REQUESTS = 1000
# Growth of the server's resident memory allowed over the random-shape requests, once the
# caches are full: allocator slack and per-request bookkeeping, not a plan per shape (1,000
# resblock plans of up to 4x3x40x40 would hold hundreds of MiB).
RSS_MARGIN_BYTES = 24 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("configless") / "repository"
    with running_server(root, ["--plan-cache-size", str(PLAN_CACHE_SIZE)]) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        yield http


def _upload(client: httpx.Client, name: str) -> dict:
    symbol, params = files_for(name)
    response = client.post(f"/models/{name}", headers=AUTH,
                           files={"symbol": ("s.json", symbol), "params": ("p.params", params)})
    assert response.status_code == 201, response.text
    return response.json()


def _served_sets(name: str, answer: dict) -> list[tuple[dict[str, np.ndarray], list[np.ndarray]]]:
    """io sets in the datatypes the server chose (text_lstm's tokens: FP32, as in MXNet)."""
    datatypes = {tensor["name"]: tensor["datatype"] for tensor in answer["inputs"]}
    return [(inputs, expected) for inputs, expected in model_io_sets(name)
            if all(datatype_of(array.dtype) == datatypes[key] for key, array in inputs.items())]


def _check_answer(name: str, answer: dict) -> None:
    """Inputs keep the batch dimension first; the checks say the test inference ran."""
    checks = answer["checks"]
    assert checks["parsed"] and checks["ops_known"] and checks["params_match"], checks
    assert checks["shape_inference"]["ran"], checks
    assert checks["test_inference"]["ran"], checks
    sample = checks["test_inference"]["inputs"]
    for tensor in answer["inputs"]:
        assert tensor["shape"][0] == -1, (name, tensor)
        assert sample[tensor["name"]][0] == 1, (name, sample)
        variable = [axis for axis, dim in enumerate(tensor["shape"]) if axis and dim == -1]
        assert checks["shape_inference"]["variable_dims"][tensor["name"]] == variable


@pytest.mark.parametrize("name", model_names())
def test_model_without_config_is_served_four_ways(server: Server, client: httpx.Client,
                                                  name: str) -> None:
    import tritonclient.http as triton

    answer = _upload(client, name)
    _check_answer(name, answer)
    assert client.get(f"/models/{name}").json()["checks"] == answer["checks"]
    output_names = [tensor["name"] for tensor in answer["outputs"]]
    sets = _served_sets(name, answer)
    assert sets, f"{name}: no io set in the served datatypes"
    url = f"/v2/models/{name}/infer"
    with triton.InferenceServerClient(server.url.removeprefix("http://")) as tclient:
        metadata = tclient.get_model_metadata(name)
        assert [tensor["shape"] for tensor in metadata["inputs"]] == [
            [int(dim) for dim in tensor["shape"]] for tensor in answer["inputs"]]
        for inputs, expected in sets:
            predicted = client.post("/predict", json={
                "model": name, "inputs": {key: array.tolist() for key, array in inputs.items()}})
            assert predicted.status_code == 200, predicted.text
            for output, reference in zip(output_names, expected):
                assert_close(np.array(predicted.json()["outputs"][output]), reference,
                             TOLERANCE, f"{name} predict")
            tensors = [{"name": key, "datatype": datatype_of(array.dtype),
                        "shape": list(array.shape), "data": array.tolist()}
                       for key, array in inputs.items()]
            body = client.post(url, json={"inputs": tensors})
            assert body.status_code == 200, body.text
            for tensor, reference in zip(body.json()["outputs"], expected):
                assert_close(np.array(tensor["data"]).reshape(tensor["shape"]), reference,
                             TOLERANCE, f"{name} v2 json")
            check_binary(client, url, inputs, expected, name)
            _check_tritonclient(tclient, name, inputs, expected, output_names)



def _check_tritonclient(tclient: object, name: str, inputs: dict[str, np.ndarray],
                        expected: list[np.ndarray], output_names: list[str]) -> None:
    import tritonclient.http as triton

    assert isinstance(tclient, triton.InferenceServerClient)
    triton_inputs = []
    for key, array in inputs.items():
        tensor = triton.InferInput(key, list(array.shape), datatype_of(array.dtype))
        tensor.set_data_from_numpy(array, binary_data=True)
        triton_inputs.append(tensor)
    result = tclient.infer(name, triton_inputs, outputs=[
        triton.InferRequestedOutput(output, binary_data=True) for output in output_names])
    for output, reference in zip(output_names, expected):
        assert_close(result.as_numpy(output), reference, TOLERANCE, f"{name} tritonclient")


def test_misfitting_shape_is_a_400_naming_input_node_op_and_shapes(
        client: httpx.Client) -> None:
    import tritonclient.http as triton
    from tritonclient.utils import InferenceServerException

    _upload(client, "lenet")  # [-1, 1, -1, -1]: only 28x28 reaches its FullyConnected right
    data = np.zeros((1, 1, 27, 28), np.float32)
    response = client.post("/v2/models/lenet/infer", json={"inputs": [
        {"name": "data", "datatype": "FP32", "shape": [1, 1, 27, 28],
         "data": data.ravel().tolist()}]})
    assert response.status_code == 400, response.text
    message = response.json()["error"]
    for part in ("input 'data'", "[1, 1, 27, 28]", "node 'lenet_dense0_fwd'",
                 "(FullyConnected)", "weight disagree"):
        assert part in message, message
    predicted = client.post("/predict", json={"model": "lenet",
                                              "inputs": {"data": data.tolist()}})
    assert predicted.status_code == 400 and "node 'lenet_dense0_fwd'" in predicted.text
    known = client.post("/predict", json={"model": "lenet", "inputs": {
        "data": np.zeros((1, 2, 28, 28)).tolist()}})  # channels are fixed by the graph
    assert known.status_code == 400 and "expected [-1, 1, -1, -1]" in known.text, known.text
    host = client.base_url.netloc.decode()
    with triton.InferenceServerClient(host) as tclient:
        tensor = triton.InferInput("data", [1, 1, 27, 28], "FP32")
        tensor.set_data_from_numpy(data, binary_data=True)
        with pytest.raises(InferenceServerException, match="lenet_dense0_fwd"):
            tclient.infer("lenet", [tensor])
    good = client.post("/predict", json={"model": "lenet", "inputs": {
        "data": np.zeros((1, 1, 28, 28)).tolist()}})
    assert good.status_code == 200, good.text


def test_shape_folding_features_into_rows_is_a_400(client: httpx.Client) -> None:
    answer = _upload(client, "np_mlp")  # reshapes to (-1, 512): [-1, -1] in metadata
    assert answer["inputs"][0]["shape"] == [-1, -1]
    response = client.post("/predict", json={"model": "np_mlp", "inputs": {
        "data": np.zeros((1, 1024)).tolist()}})
    assert response.status_code == 400, response.text
    assert "'data' shape [1, 1024] would give output 'np_mlp_add0_output' shape [2, 2]" in (
        response.json()["error"])


def _rss_bytes(server: Server) -> int:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc status")


def _random_request(client: httpx.Client, rng: np.random.Generator) -> None:
    shape = [int(rng.integers(1, 5)), 3, int(rng.integers(4, 41)), int(rng.integers(4, 41))]
    data = rng.standard_normal(shape).astype(np.float32)
    header = orjson.dumps({"inputs": [{"name": "data", "datatype": "FP32", "shape": shape,
                                       "parameters": {"binary_data_size": data.nbytes}}]})
    response = client.post("/v2/models/resblock/infer", content=header + data.tobytes(),
                           headers={"Inference-Header-Content-Length": str(len(header))})
    assert response.status_code == 200, response.text
    assert orjson.loads(response.content)["outputs"][0]["shape"] == [shape[0], 10]


def test_random_shapes_keep_the_plan_cache_bounded_and_memory_flat(
        server: Server, client: httpx.Client) -> None:
    _upload(client, "resblock")
    rng = np.random.default_rng(17)
    for _ in range(100):  # fill the caches and let the allocator settle
        _random_request(client, rng)
    before = _rss_bytes(server)
    for _ in range(RANDOM_REQUESTS):
        _random_request(client, rng)
    grown = _rss_bytes(server) - before
    caches = client.get("/models/resblock").json()["caches"]
    for name, stats in caches.items():
        assert stats["capacity"] == PLAN_CACHE_SIZE, (name, stats)
        assert stats["entries"] <= PLAN_CACHE_SIZE, (name, stats)
    # ~1,100 requests over ~5,900 possible shapes: most were new, so plans were evicted.
    assert caches["plans"]["evictions"] >= RANDOM_REQUESTS - PLAN_CACHE_SIZE - 200, caches
    assert grown < RSS_MARGIN_BYTES, f"RSS grew {grown / 2**20:.1f} MiB over {RANDOM_REQUESTS}"
    metrics = client.get("/metrics")  # memory accounting over the cached plans only
    assert metrics.status_code == 200
