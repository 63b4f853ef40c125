"""End to end: one model of every family uploaded WITHOUT config.json to one real uvicorn
process, answering MXNet 1.9.1's outputs through Open Inference Protocol V2 (binary tensors),
including BERT's three inputs and the detectors' three outputs (compared as sets of rows)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import orjson
import pytest

from engine.serving.config import DATATYPES, datatype_of
from tests.conformance.families import DETECTORS, FAMILIES, assert_same_rows, detection_rows
from tests.conformance.fixtures import assert_close, model_io_sets, model_meta
from tests.e2e.server import TOKEN, running_server
from tests.service.helpers import files_for

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RNN_TOLERANCE = {"rtol": 1e-3, "atol": 1e-5}  # as in tests/conformance/test_models.py


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """One server holding every family's models, uploaded as bare symbol + params."""
    root = tmp_path_factory.mktemp("families") / "repository"
    with running_server(root) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        for names in FAMILIES.values():
            for name in names:
                _upload(http, name)
        yield http


def _upload(client: httpx.Client, name: str) -> None:
    symbol, params = files_for(name)
    response = client.post(f"/models/{name}", headers=AUTH,
                           files={"symbol": ("s.json", symbol), "params": ("p.params", params)})
    assert response.status_code == 201, f"{name}: {response.text}"


def _infer(client: httpx.Client, name: str, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """A binary-tensor V2 request; the outputs in the order the server lists them."""
    header = orjson.dumps({"inputs": [
        {"name": key, "datatype": datatype_of(array.dtype), "shape": list(array.shape),
         "parameters": {"binary_data_size": array.nbytes}} for key, array in inputs.items()],
        "parameters": {"binary_data_output": True}})
    body = header + b"".join(np.ascontiguousarray(array).tobytes() for array in inputs.values())
    response = client.post(f"/v2/models/{name}/infer", content=body,
                           headers={"Inference-Header-Content-Length": str(len(header))})
    assert response.status_code == 200, f"{name}: {response.text}"
    offset = length = int(response.headers["Inference-Header-Content-Length"])
    outputs = []
    for tensor in orjson.loads(response.content[:length])["outputs"]:
        size = tensor["parameters"]["binary_data_size"]
        values = np.frombuffer(response.content[offset:offset + size],
                               DATATYPES[tensor["datatype"]])
        outputs.append(values.reshape(tensor["shape"]))
        offset += size
    return outputs


def _check_metadata(client: httpx.Client, name: str, output_count: int) -> None:
    """Inputs in MXNet's order with the batch axis open; every output listed."""
    metadata = client.get(f"/v2/models/{name}")
    assert metadata.status_code == 200, metadata.text
    inputs = metadata.json()["inputs"]
    assert [tensor["name"] for tensor in inputs] == [
        spec["name"] for spec in model_meta(name)["inputs"]]
    assert all(tensor["shape"][0] == -1 for tensor in inputs), inputs
    assert len(metadata.json()["outputs"]) == output_count


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_is_served_with_mxnets_outputs(client: httpx.Client, family: str) -> None:
    for name in FAMILIES[family]:
        meta = model_meta(name)
        tolerance = RNN_TOLERANCE if "RNN" in meta["ops"] else meta["tolerance"]
        sets = model_io_sets(name)
        _check_metadata(client, name, len(sets[0][1]))
        for number, (inputs, expected) in enumerate(sets):
            actual = _infer(client, name, inputs)
            what = f"{name} io set {number}"
            assert len(actual) == len(expected), what
            if name in DETECTORS:
                assert_same_rows(detection_rows(actual), detection_rows(expected), tolerance,
                                 what)
                continue
            for index, (got, want) in enumerate(zip(actual, expected)):
                assert got.dtype == want.dtype, what
                assert_close(got, want, tolerance, f"{what} output {index}")


def test_bert_needs_all_three_inputs(client: httpx.Client) -> None:
    inputs, _ = model_io_sets("gluonnlp_bert_tiny")[0]
    partial = {key: inputs[key] for key in ("data0", "data1")}
    response = client.post("/v2/models/gluonnlp_bert_tiny/infer", json={"inputs": [
        {"name": key, "datatype": "FP32", "shape": list(array.shape),
         "data": array.ravel().tolist()} for key, array in partial.items()]})
    assert response.status_code == 400, response.text
    assert "data2" in response.json()["error"], response.text
