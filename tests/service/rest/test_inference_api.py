"""Inference through the app: /predict, V2 JSON and binary tensors, and every bad-input answer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.conformance.fixtures import DEFAULT_TOLERANCE, assert_close, model_io_sets
from tests.service.helpers import MLP, first_io, run, serving, settings_for

URL = f"/v2/models/{MLP}/infer"
OUTPUT = "seed_mlp_dense2_fwd_output"


def _v2_json(data: np.ndarray, **extra: object) -> dict:
    return {"inputs": [{"name": "data", "datatype": "FP32", "shape": list(data.shape),
                        "data": data.tolist()}], **extra}


def test_predict_and_v2_json_and_binary_match_mxnet(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path)) as (client, _):
            for inputs, expected in model_io_sets(MLP):
                data = inputs["data"]
                response = await client.post("/predict", json={
                    "model": MLP, "inputs": {"data": data.tolist()}})
                assert response.status_code == 200, response.text
                body = response.json()
                assert (body["model"], body["version"]) == (MLP, 1)
                assert_close(np.array(body["outputs"][OUTPUT]), expected[0], DEFAULT_TOLERANCE)

                response = await client.post(URL, json=_v2_json(data, id="req-9"))
                body = response.json()
                assert body["id"] == "req-9" and body["model_version"] == "1"
                output = body["outputs"][0]
                assert output["shape"] == list(expected[0].shape)
                assert_close(np.array(output["data"]).reshape(output["shape"]), expected[0],
                             DEFAULT_TOLERANCE)

                header = orjson.dumps({"inputs": [{
                    "name": "data", "datatype": "FP32", "shape": list(data.shape),
                    "parameters": {"binary_data_size": data.nbytes}}],
                    "outputs": [{"name": OUTPUT, "parameters": {"binary_data": True}}]})
                response = await client.post(
                    f"/v2/models/{MLP}/versions/1/infer", content=header + data.tobytes(),
                    headers={"Inference-Header-Content-Length": str(len(header))})
                assert response.status_code == 200, response.text
                length = int(response.headers["Inference-Header-Content-Length"])
                meta = orjson.loads(response.content[:length])["outputs"][0]
                values = np.frombuffer(response.content[length:], np.float32)
                assert meta["parameters"]["binary_data_size"] == values.nbytes
                assert_close(values.reshape(meta["shape"]), expected[0], DEFAULT_TOLERANCE)

    run(scenario())


def test_multi_input_model_and_requested_outputs(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path), ["multi_io"]) as (client, _):
            inputs, expected = first_io("multi_io")
            tensors = [{"name": name, "datatype": "FP32", "shape": list(array.shape),
                        "data": array.ravel().tolist()} for name, array in inputs.items()]
            response = await client.post("/v2/models/multi_io/infer", json={
                "inputs": tensors, "outputs": [{"name": "multi_io_concat0_output"}]})
            outputs = response.json()["outputs"]
            assert [output["name"] for output in outputs] == ["multi_io_concat0_output"]
            assert_close(np.array(outputs[0]["data"]).reshape(outputs[0]["shape"]), expected[1],
                         DEFAULT_TOLERANCE)
            response = await client.post("/v2/models/multi_io/infer", json={
                "inputs": tensors, "outputs": [{"name": "nope"}]})
            assert response.status_code == 400
            assert "has no output 'nope'" in response.json()["error"]

    run(scenario())


BAD_REQUESTS = [
    ("wrong datatype", {"inputs": [{"name": "data", "datatype": "FP64", "shape": [1, 512],
                                    "data": [0.0] * 512}]}, 400, "datatype FP64; expected FP32"),
    ("wrong shape", {"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 500],
                                 "data": [0.0] * 500}]}, 400, "shape [1, 500]; expected [-1, 512]"),
    ("count", {"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 512],
                           "data": [0.0] * 511}]}, 400, "needs 512 elements, but data has 511"),
    ("unknown input", {"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 512],
                                   "data": [0.0] * 512},
                                  {"name": "extra", "datatype": "FP32", "shape": [1],
                                   "data": [0.0]}]}, 400, "has no input 'extra'"),
    ("missing input", {"inputs": [{"name": "other", "datatype": "FP32", "shape": [1],
                                   "data": [0.0]}]}, 400, "no input 'other'"),
    # The name is checked before the tensor's size, datatype or data: the message names it.
    ("unknown input of the wrong size", {"inputs": [
        {"name": "dat", "datatype": "FP32", "shape": [1, 512], "data": [0.0] * 500}]}, 400,
     "model 'seed_mlp' version 1 has no input 'dat'; its inputs are 'data'"),
    ("unknown input of a wrong datatype", {"inputs": [
        {"name": "dat", "datatype": "FP33", "shape": [1, 512], "data": [None]}]}, 400,
     "has no input 'dat'"),
    ("BYTES", {"inputs": [{"name": "data", "datatype": "BYTES", "shape": [1], "data": ["x"]}]},
     400, "datatype BYTES; expected FP32 (BYTES is for inputs with a preprocess pipeline"),
    ("too many rows", {"inputs": [{"name": "data", "datatype": "FP32", "shape": [33, 512],
                                   "data": [0.0] * 33 * 512}]}, 400, "max_batch_size is 32"),
    ("timeout", {**_v2_json(np.zeros((1, 512), np.float32)), "parameters": {"timeout": 1}},
     504, "no result within"),
    ("negative timeout", {**_v2_json(np.zeros((1, 512), np.float32)),
                          "parameters": {"timeout": -1}}, 400,
     "parameters.timeout must be a non-negative integer (microseconds; 0: none), got -1"),
]


def test_a_timeout_of_0_is_none_as_triton_reads_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path)) as (client, _):
            response = await client.post(URL, json={**_v2_json(np.zeros((1, 512), np.float32)),
                                                    "parameters": {"timeout": 0}})
            assert response.status_code == 200, response.text

    run(scenario())


@pytest.mark.parametrize(("case", "body", "status", "message"), BAD_REQUESTS,
                         ids=[case[0] for case in BAD_REQUESTS])
def test_bad_v2_requests(tmp_path: Path, case: str, body: dict, status: int,
                         message: str) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path)) as (client, _):
            response = await client.post(URL, json=body)
            assert response.status_code == status, response.text
            assert message in response.json()["error"]
            assert (await client.get("/v2/health/ready")).status_code == 200
            good = await client.post(URL, json=_v2_json(np.zeros((1, 512), np.float32)))
            assert good.status_code == 200

    run(scenario())


def test_bad_requests_outside_tensors(tmp_path: Path) -> None:
    async def scenario() -> None:
        settings = settings_for(tmp_path, max_request_bytes=4096, max_tensor_elements=600)
        async with serving(settings) as (client, _):
            cases = [
                (client.post(URL, content=b"not json"), 400, "not valid JSON"),
                (client.post("/predict", content=b"[1, 2"), 400, "not valid JSON"),
                (client.post(URL, content=b"x" * 5000), 413, "limit of 4096 bytes"),
                (client.post("/predict", json={"model": MLP, "inputs": {
                    "data": [[0] * 512] * 2}}), 413, "limit of 600 elements"),
                (client.post("/predict", json={"model": "nope", "inputs": {"data": [1]}}),
                 404, "model 'nope' is not in the repository"),
                (client.post(f"/v2/models/{MLP}/versions/7/infer", json={"inputs": [
                    {"name": "data", "datatype": "FP32", "shape": [1], "data": [1]}]}),
                 404, "has no version 7"),
                (client.get("/v2/models/nope"), 404, "'nope'"),
                (client.get("/v2/models/..x/ready"), 400, "not allowed"),
                (client.post("/predict", json={"model": MLP, "inputs": {"data": [[1, 2]]}}),
                 400, "shape [1, 2]; expected [-1, 512]"),
            ]
            for request, status, message in cases:
                response = await request
                assert response.status_code == status, response.text
                assert message in response.json()["error"], response.text
            assert (await client.get("/v2/health/live")).json() == {"live": True}

    run(scenario())


def test_overloaded_queue_answers_503_with_retry_after(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path)) as (client, runtime):
            handle = runtime.repository.get(MLP)
            handle.batcher._queued = handle.batcher.policy.max_queue_size  # simulate a full queue
            try:
                response = await client.post(URL, json=_v2_json(np.zeros((1, 512), np.float32)))
            finally:
                handle.batcher._queued = 0
            assert response.status_code == 503
            assert int(response.headers["Retry-After"]) >= 1
            assert "queue is full" in response.json()["error"]

    run(scenario())


def test_null_is_refused_and_nan_literals_are_read_and_written(tmp_path: Path) -> None:
    data: list[list[float | None]] = [[0.5] * 512]

    async def scenario() -> None:
        async with serving(settings_for(tmp_path)) as (client, _):
            data[0][7] = None
            for path, body in (("/predict", {"model": MLP, "inputs": {"data": data}}),
                               (URL, {"inputs": [{"name": "data", "datatype": "FP32",
                                                  "shape": [1, 512], "data": data}]})):
                response = await client.post(path, json=body)
                assert response.status_code == 400, response.text
                assert ("input 'data': data must hold only numbers, got null at element 7 "
                        "(data[0][7])") in response.json()["error"]
            data[0][7] = float("nan")  # json.dumps writes the bare literal NaN
            for path, body in (("/predict", {"model": MLP, "inputs": {"data": data}}),
                               (URL, {"inputs": [{"name": "data", "datatype": "FP32",
                                                  "shape": [1, 512], "data": data}]})):
                response = await client.post(path, content=json.dumps(body),
                                             headers={"Content-Type": "application/json"})
                assert response.status_code == 200, response.text
                assert b"null" not in response.content and b"NaN" in response.content
                answer = json.loads(response.content)  # Python reads the literals back
                values = (answer["outputs"][OUTPUT] if path == "/predict"
                          else answer["outputs"][0]["data"])
                assert np.isnan(np.array(values, np.float64)).all()

    run(scenario())
