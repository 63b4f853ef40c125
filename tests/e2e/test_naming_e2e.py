"""End to end: a model whose config.json renames its inputs and outputs and labels one, uploaded
to a real uvicorn process, answers under the new names through tritonclient (binary and
JSON), V2 JSON, /predict and model metadata; classification as Triton answers it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.conformance.fixtures import assert_close, model_io_sets
from tests.e2e.server import TOKEN, Server, running_server
from tests.service.helpers import files_for

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
SOFTMAX, CONCAT = "multi_io_softmax0_output", "multi_io_concat0_output"
CONFIG = {"inputs": [{"name": "vector", "source": "data0"}, {"name": "image", "source": "data1"}],
          "outputs": [{"name": "probabilities", "source": SOFTMAX, "labels": "classes.txt"},
                      {"name": "features", "source": CONCAT}]}
LABELS = ["cat", "dog", "bird"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("naming") / "repository") as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        yield http


def _upload(client: httpx.Client, name: str, config: dict, labels: str | None,
            labels_file: str = "classes.txt") -> httpx.Response:
    symbol, params = files_for("multi_io")
    files = [("symbol", ("s.json", symbol)), ("params", ("p.params", params)),
             ("config", ("config.json", json.dumps(config).encode()))]
    if labels is not None:
        files.append(("labels", (labels_file, labels.encode())))
    return client.post(f"/models/{name}", headers=AUTH, files=files)


@pytest.fixture(scope="module")
def renamed(client: httpx.Client) -> dict:
    response = _upload(client, "renamed", CONFIG, "\n".join(LABELS) + "\n")
    assert response.status_code == 201, response.text
    return response.json()


def _io() -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    inputs, expected = model_io_sets("multi_io")[0]
    return {"vector": inputs["data0"], "image": inputs["data1"]}, expected


def _expected_classes(values: np.ndarray, count: int,
                      labels: list[str] | None = None) -> list[list[str]]:
    """What Triton answers, from the raw outputs: top `count` per row, C's "%f" values."""
    rows = []
    for row in values.reshape(values.shape[0], -1):
        order = sorted(range(row.size), key=lambda index: (-row[index], index))[:count]
        rows.append([f"{float(row[index]):f}:{index}" + (f":{labels[index]}" if labels else "")
                     for index in order])
    return rows


def test_metadata_and_the_upload_answer_use_the_new_names(server: Server, client: httpx.Client,
                                                          renamed: dict) -> None:
    import tritonclient.http as triton

    assert [t["name"] for t in renamed["outputs"]] == ["probabilities", "features"]
    with triton.InferenceServerClient(server.url.removeprefix("http://")) as tclient:
        metadata = tclient.get_model_metadata("renamed")
        assert "classification" in tclient.get_server_metadata()["extensions"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
        ("vector", "FP32", [-1, 5]), ("image", "FP32", [-1, 3, -1, -1])]
    assert [(t["name"], t["shape"]) for t in metadata["outputs"]] == [
        ("probabilities", [-1, 3]), ("features", [-1, 12])]


def test_tritonclient_infers_and_classifies_under_the_new_names(server: Server,
                                                                renamed: dict) -> None:
    import tritonclient.http as triton

    inputs, expected = _io()
    with triton.InferenceServerClient(server.url.removeprefix("http://")) as tclient:
        for binary in (True, False):
            tensors = []
            for name, array in inputs.items():
                tensor = triton.InferInput(name, list(array.shape), "FP32")
                tensor.set_data_from_numpy(array, binary_data=binary)
                tensors.append(tensor)
            raw = tclient.infer("renamed", tensors, outputs=[
                triton.InferRequestedOutput("probabilities", binary_data=binary),
                triton.InferRequestedOutput("features", binary_data=binary)])
            probabilities = raw.as_numpy("probabilities")
            assert_close(probabilities, expected[0], TOLERANCE, "probabilities")
            assert_close(raw.as_numpy("features"), expected[1], TOLERANCE, "features")
            classified = tclient.infer("renamed", tensors, outputs=[
                triton.InferRequestedOutput("probabilities", binary_data=binary, class_count=2)])
            classes = classified.as_numpy("probabilities")
            assert classes.shape == (2, 2)
            assert classified.get_output("probabilities")["datatype"] == "BYTES"
            # As with Triton, tritonclient gives bytes from binary data and str from JSON.
            assert [[element.decode() if binary else element for element in row]
                    for row in classes] == _expected_classes(probabilities, 2, LABELS)


def test_v2_json_and_predict_answer_under_the_new_names(client: httpx.Client,
                                                        renamed: dict) -> None:
    inputs, expected = _io()
    tensors = [{"name": name, "datatype": "FP32", "shape": list(array.shape),
                "data": array.ravel().tolist()} for name, array in inputs.items()]
    body = client.post("/v2/models/renamed/infer", json={"inputs": tensors}).json()
    assert [tensor["name"] for tensor in body["outputs"]] == ["probabilities", "features"]
    features = np.array(body["outputs"][1]["data"], np.float32).reshape(2, 12)
    assert_close(features, expected[1], TOLERANCE, "v2 features")
    classified = client.post("/v2/models/renamed/infer", json={"inputs": tensors, "outputs": [
        {"name": "features", "parameters": {"classification": 20}}]}).json()
    (output,) = classified["outputs"]
    assert (output["datatype"], output["shape"]) == ("BYTES", [2, 12])  # capped at 12 classes
    want = _expected_classes(features, 12)
    assert output["data"] == [element for row in want for element in row]
    assert any(element.startswith("-") for element in output["data"])  # negatives sort last
    predicted = client.post("/predict", json={
        "model": "renamed", "inputs": {name: array.tolist() for name, array in inputs.items()}})
    assert predicted.status_code == 200, predicted.text
    assert sorted(predicted.json()["outputs"]) == ["features", "probabilities"]
    assert_close(np.array(predicted.json()["outputs"]["probabilities"]), expected[0],
                 TOLERANCE, "predict")


def test_requests_naming_the_graph_names_are_refused_with_the_new_ones(
        client: httpx.Client, renamed: dict) -> None:
    inputs, _ = _io()
    answer = client.post("/predict", json={"model": "renamed", "inputs": {
        "data0": inputs["vector"].tolist(), "image": inputs["image"].tolist()}})
    assert answer.status_code == 400
    assert ("has no input 'data0'; its inputs are 'vector', 'image' ('data0' is the graph's "
            "name of input 'vector', which config.json renames)") in answer.json()["error"]
    tensors = [{"name": name, "datatype": "FP32", "shape": list(array.shape),
                "data": array.ravel().tolist()} for name, array in inputs.items()]
    answer = client.post("/v2/models/renamed/infer", json={"inputs": tensors, "outputs": [
        {"name": SOFTMAX}]})
    assert answer.status_code == 400
    assert (f"has no output '{SOFTMAX}'; its outputs are 'probabilities', 'features' "
            f"('{SOFTMAX}' is the graph's name of output 'probabilities'") in (
        answer.json()["error"])
    answer = client.post("/v2/models/renamed/infer", json={"inputs": tensors, "outputs": [
        {"name": "features", "parameters": {"classification": -1}}]})
    assert answer.status_code == 400
    assert "parameters.classification must be a non-negative integer" in answer.json()["error"]


@pytest.mark.parametrize(("config", "labels", "labels_file", "message"), [
    (CONFIG, "cat\ndog\n", "classes.txt",
     "'classes.txt' has 2 labels; output 'probabilities' (shape [-1, 3]) has 3 classes"),
    (CONFIG, "cat\ndog\nbird\n", "other.txt", "no file 'classes.txt' for output 'probabilities'"),
    ({**CONFIG, "outputs": [{"name": "probabilities", "source": "softmax0"},
                            {"name": "features", "source": CONCAT}]}, None, "",
     "outputs.0 'probabilities' (source 'softmax0') is not one of the model's outputs"),
    ({**CONFIG, "outputs": [{"name": "p", "source": SOFTMAX}, {"name": "p", "source": CONCAT}]},
     None, "", "outputs: names must be unique; ['p'] repeated"),
])
def test_configs_that_do_not_fit_are_a_422_naming_the_fault(
        client: httpx.Client, config: dict, labels: str | None, labels_file: str,
        message: str) -> None:
    response = _upload(client, "refused", config, labels, labels_file)
    assert response.status_code == 422, response.text
    assert message in response.json()["error"]


def test_a_labels_part_must_have_a_plain_file_name(client: httpx.Client) -> None:
    response = _upload(client, "refused", CONFIG, "a\nb\nc\n", "config.json")
    assert response.status_code == 400
    assert "part 'labels' has file name 'config.json'" in response.json()["error"]
