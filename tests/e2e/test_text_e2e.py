"""End to end, on a real uvicorn process: GluonNLP's tiny BERT uploaded with a text pipeline
and its vocab part takes sentences and pairs through V2 (JSON strings, binary BYTES) and
/predict, giving what the same model gives on GluonNLP's own token ids; a text that is not
UTF-8 is a 400 naming the input and the row, and the server keeps serving."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from tests.e2e.server import TOKEN, Server, running_server
from tests.service.text_model import CONFIG, NAME, reference, singles_and_pairs, upload_files

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
INFER = f"/v2/models/{NAME}/infer"
SINGLES, PAIRS = singles_and_pairs()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The server with the BERT fixture uploaded with config.json and vocab.txt."""
    root = tmp_path_factory.mktemp("text") / "repository"
    with running_server(root) as running:
        answer = httpx.post(f"{running.admin_url}/models/{NAME}", files=upload_files(),
                            headers=AUTH, timeout=60)
        assert answer.status_code == 201, answer.text
        assert (root / NAME / "1" / "vocab.txt").is_file()
        yield running


def _check(outputs: dict[str, Any], cases: list[dict[str, Any]]) -> None:
    expected = reference(cases)
    for name in ("sequence", "pooled"):
        np.testing.assert_allclose(np.asarray(outputs[name], np.float32), expected[name],
                                   **TOLERANCE, err_msg=name)


def _v2_outputs(response: httpx.Response) -> dict[str, np.ndarray]:
    assert response.status_code == 200, response.text
    return {output["name"]: np.asarray(output["data"], np.float32).reshape(output["shape"])
            for output in response.json()["outputs"]}


def _binary(texts: list[bytes], shape: list[int]) -> tuple[bytes, dict[str, str]]:
    data = b"".join(len(text).to_bytes(4, "little") + text for text in texts)
    header = orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": shape,
                                       "parameters": {"binary_data_size": len(data)}}]})
    return header + data, {"Inference-Header-Content-Length": str(len(header))}


def test_v2_json_strings_give_the_reference_outputs(server: Server) -> None:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(SINGLES), 1],
                        "data": [case["texts"][0] for case in SINGLES]}]}
    _check(_v2_outputs(httpx.post(server.url + INFER, json=body, timeout=30)), SINGLES)


def test_v2_binary_pairs_give_the_reference_outputs(server: Server) -> None:
    content, headers = _binary([text.encode() for case in PAIRS for text in case["texts"]],
                               [len(PAIRS), 2])
    response = httpx.post(server.url + INFER, content=content, headers=headers, timeout=30)
    _check(_v2_outputs(response), PAIRS)


def test_predict_json_texts_give_the_reference_outputs(server: Server) -> None:
    cases = SINGLES[:3]
    response = httpx.post(f"{server.url}/predict", timeout=30, json={
        "model": NAME, "inputs": {"text": [case["texts"][0] for case in cases]}})
    assert response.status_code == 200, response.text
    _check(response.json()["outputs"], cases)


def test_a_text_that_is_not_utf8_fails_alone(server: Server) -> None:
    content, headers = _binary([b"the cat", b"caf\xe9"], [2])
    response = httpx.post(server.url + INFER, content=content, headers=headers, timeout=30)
    assert response.status_code == 400, response.text
    assert ("input 'text', batch row 1: the text is not UTF-8" in response.json()["error"])
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                        "data": [SINGLES[0]["texts"][0]]}]}
    _check(_v2_outputs(httpx.post(server.url + INFER, json=body, timeout=30)), SINGLES[:1])


def test_metadata_lists_only_the_text_input_over_rest_and_grpc(server: Server) -> None:
    import grpc

    from service.grpc import inference_pb2 as pb
    from service.grpc import inference_pb2_grpc as pb_grpc

    metadata = httpx.get(f"{server.url}/v2/models/{NAME}", timeout=30).json()
    assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    with grpc.insecure_channel(server.grpc) as channel:
        found = pb_grpc.GRPCInferenceServiceStub(channel).ModelMetadata(
            pb.ModelMetadataRequest(name=NAME), timeout=30)
    assert [(tensor.name, tensor.datatype, list(tensor.shape)) for tensor in found.inputs] == [
        ("text", "BYTES", [-1])]
    missing = httpx.post(server.url + INFER, timeout=30, json={"inputs": [
        {"name": "data1", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}]})
    assert missing.status_code == 400
    assert "missing input 'text', which takes BYTES (texts: one a row" in missing.json()["error"]


def test_a_max_length_past_the_position_table_is_refused_at_upload(server: Server) -> None:
    config = copy.deepcopy(CONFIG)
    config["inputs"][0]["preprocess"]["text"]["max_length"] = 64
    files = {**upload_files(), "config": ("config.json", orjson.dumps(config))}
    answer = httpx.post(f"{server.admin_url}/models/too_long", files=files, headers=AUTH,
                        timeout=60)
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert ("inputs.0.preprocess.text.max_length: rows of 64 tokens take positions up to 63, "
            "but node 'bertencoder0_embedding0' (Embedding) looks positions up in a table of "
            "32 rows" in error)
    assert "set max_length to at most 32" in error
    assert httpx.get(f"{server.url}/v2/models/too_long", timeout=30).status_code == 404
