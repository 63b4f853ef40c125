"""Postprocessed outputs through the app in-process: tensors in (no images, so no geometry),
V2 tensors and /predict objects out, checked against MXNet's reference outputs filtered with
NumPy here; the classification extension on a softmax output; the metadata shown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from service.grpc import inference_pb2 as pb
from tests.service.grpc_inprocess import grpc_client
from tests.service.helpers import AUTH, files_for, first_io, run, serving, settings_for

SSD = ("ssd0_slice_axis7_output", "ssd0_slice_axis8_output", "ssd0_slice_axis9_output")
ARCFACE = ("arcfacenet0_batchnorm3_fwd_output", "arcfacenet0_fullyconnected0_output")
THRESHOLD = 0.355


def _files(name: str, config: dict[str, Any], labels: bytes | None = None) -> list[Any]:
    symbol, params = files_for(name)
    files = [("symbol", ("s.json", symbol)), ("params", ("p.params", params)),
             ("config", ("config.json", json.dumps(config).encode()))]
    return files + ([("labels", ("names.txt", labels))] if labels is not None else [])


DETECTOR = {"outputs": [
    {"name": "ids", "source": SSD[0], "labels": "names.txt", "postprocess": {"detection": {
        "score_threshold": THRESHOLD, "coordinates": "input", "max_detections": 4}}},
    {"name": "scores", "source": SSD[1]}, {"name": "boxes", "source": SSD[2]}]}
FACES = {"outputs": [
    {"name": "embedding", "source": ARCFACE[0], "postprocess": "embedding"},
    {"name": "logits", "source": ARCFACE[1], "labels": "names.txt", "postprocess": "softmax"}]}


def _expected_detections(outputs: list[np.ndarray]) -> list[list[int]]:
    """Per row, the indices of the rows kept: id >= 0, score >= threshold, best 4."""
    ids, scores = outputs[0][..., 0], outputs[1][..., 0]
    return [[index for index in np.argsort(-scores[row], kind="stable")
             if ids[row, index] >= 0 and scores[row, index] >= THRESHOLD][:4]
            for row in range(ids.shape[0])]


def test_a_detector_fed_tensors_answers_rows_in_input_pixels(tmp_path: Path) -> None:
    inputs, outputs = first_io("gluoncv_ssd_tiny")
    kept = _expected_detections(outputs)
    assert kept[0], "the reference has rows over the threshold"

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), models=()) as (client, _):
            upload = await client.post("/models/ssd", headers=AUTH, files=_files(
                "gluoncv_ssd_tiny", DETECTOR, b"cat\ndog\n"))
            assert upload.status_code == 201, upload.text
            body = {"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 3, 64, 64],
                                "data": inputs["data"].reshape(-1).tolist()}],
                    "outputs": [{"name": "scores"}, {"name": "ids"}, {"name": "ids_label"}]}
            answer = (await client.post("/v2/models/ssd/infer", json=body)).json()
            tensors = {tensor["name"]: tensor for tensor in answer["outputs"]}
            assert list(tensors) == ["scores", "ids", "ids_label"]
            count = len(kept[0])
            assert tensors["ids"]["shape"] == [1, count]
            assert tensors["ids"]["data"] == outputs[0][0, kept[0], 0].astype(int).tolist()
            np.testing.assert_allclose(tensors["scores"]["data"], outputs[1][0, kept[0], 0],
                                       rtol=1e-4)
            # Class 2 is past the two-line labels file: its label is "".
            assert tensors["ids_label"]["data"] == [["cat", "dog", ""][int(class_id)] for
                                                    class_id in outputs[0][0, kept[0], 0]]
            predict = await client.post("/predict", json={
                "model": "ssd", "inputs": {"data": inputs["data"].tolist()}})
            [rows] = predict.json()["outputs"]["ids"]
            np.testing.assert_allclose([row["box"] for row in rows], outputs[2][0, kept[0]],
                                       rtol=1e-4, atol=1e-4)

    run(scenario())


def test_softmax_embedding_and_classification_on_probabilities(tmp_path: Path) -> None:
    inputs, outputs = first_io("arcface_tiny")
    logits = outputs[1].astype(np.float64)
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), models=()) as (client, _):
            upload = await client.post("/models/face", headers=AUTH, files=_files(
                "arcface_tiny", FACES, "\n".join("abcdef").encode()))
            assert upload.status_code == 201, upload.text
            assert upload.json()["checks"]["postprocess"]["outputs"] == {
                "embedding": "embedding", "logits": "softmax"}
            metadata = (await client.get("/v2/models/face")).json()["outputs"]
            assert metadata == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 16]},
                                {"name": "logits", "datatype": "FP32", "shape": [-1, 6]}]
            body = {"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 3, 32, 32],
                                "data": inputs["data"].reshape(-1).tolist()}],
                    "outputs": [{"name": "embedding"},
                                {"name": "logits", "parameters": {"classification": 2}}]}
            answer = (await client.post("/v2/models/face/infer", json=body)).json()
            embedding, classes = answer["outputs"]
            unit = outputs[0] / np.linalg.norm(outputs[0].astype(np.float64))
            np.testing.assert_allclose(embedding["data"], unit.reshape(-1), rtol=1e-4,
                                       atol=1e-6)
            top = np.argsort(-probabilities[0], kind="stable")[:2]
            shown = probabilities[0].astype(np.float32)
            assert classes["data"] == [f"{shown[index]:f}:{index}:{'abcdef'[index]}"
                                       for index in top]

    run(scenario())


TOPK = {"outputs": [
    {"name": "embedding", "source": ARCFACE[0]},
    {"name": "who", "source": ARCFACE[1], "labels": "names.txt",
     "postprocess": {"topk": {"k": 3, "softmax": True}}}]}


def _faces_request(inputs: dict[str, np.ndarray], *names: str,
                   classified: str | None = None) -> dict[str, Any]:
    outputs = [{"name": name} for name in names]
    if classified is not None:
        outputs.append({"name": classified, "parameters": {"classification": 2}})
    return {"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 3, 32, 32],
                        "data": inputs["data"].reshape(-1).tolist()}], "outputs": outputs}


def test_v2_answers_exactly_the_tensors_requested_extra_ones_included(tmp_path: Path) -> None:
    inputs, outputs = first_io("arcface_tiny")
    top = np.argsort(-outputs[1][0], kind="stable")[:3]
    where = "model 'face' version 1"

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), models=()) as (client, _):
            upload = await client.post("/models/face", headers=AUTH, files=_files(
                "arcface_tiny", TOPK, "\n".join("abcdef").encode()))
            assert upload.status_code == 201, upload.text
            listed = [tensor["name"] for tensor in
                      (await client.get("/v2/models/face")).json()["outputs"]]
            assert listed == ["embedding", "who", "who_index", "who_label"]

            async def answered(body: dict[str, Any]) -> dict[str, Any]:
                response = await client.post("/v2/models/face/infer", json=body)
                assert response.status_code == 200, response.text
                return {tensor["name"]: tensor for tensor in response.json()["outputs"]}

            every = await answered({"inputs": _faces_request(inputs)["inputs"]})
            assert list(every) == listed  # none named: everything metadata lists
            label = await answered(_faces_request(inputs, "who_label"))
            assert list(label) == ["who_label"]
            assert (label["who_label"]["datatype"], label["who_label"]["shape"]) == (
                "BYTES", [1, 3])
            assert label["who_label"]["data"] == ["abcdef"[index] for index in top]
            picked = await answered(_faces_request(inputs, "who_index", "who"))
            assert list(picked) == ["who_index", "who"]  # the request's order, nothing more
            assert picked["who_index"]["data"] == top.tolist()
            both = await answered(_faces_request(inputs, "who_label", classified="who"))
            assert list(both) == ["who_label", "who"]
            assert both["who"]["datatype"] == "BYTES" and both["who"]["shape"] == [1, 2]
            for body, message in [
                    (_faces_request(inputs, "who_labels"), f"{where} has no output "
                     "'who_labels'; its outputs are 'embedding', 'who', 'who_index', "
                     "'who_label'"),
                    (_faces_request(inputs, classified="who_index"), f"{where}: output "
                     "'who_index' is computed by a postprocess; the classification extension "
                     "applies to the model's outputs 'embedding', 'who'")]:
                refused = await client.post("/v2/models/face/infer", json=body)
                assert refused.status_code == 400 and refused.json()["error"] == message

    run(scenario())


def test_grpc_answers_a_postprocess_s_extra_tensor_alone(tmp_path: Path) -> None:
    inputs, outputs = first_io("arcface_tiny")
    top = np.argsort(-outputs[1][0], kind="stable")[:3]
    with grpc_client(tmp_path, models=()) as client:
        upload = client.app.request("POST", "/models/face", headers=AUTH, files=_files(
            "arcface_tiny", TOPK, "\n".join("abcdef").encode()))
        assert upload.status_code == 201, upload.text
        request = pb.ModelInferRequest(model_name="face", raw_input_contents=[
            inputs["data"].astype("<f4").tobytes()])
        request.inputs.add(name="data", datatype="FP32", shape=[1, 3, 32, 32])
        request.outputs.add(name="who_index")
        response = client.call("ModelInfer", request)
        assert [(tensor.name, tensor.datatype, list(tensor.shape))
                for tensor in response.outputs] == [("who_index", "INT32", [1, 3])]
        assert np.frombuffer(response.raw_output_contents[0], "<i4").tolist() == top.tolist()
        unknown = pb.ModelInferRequest(model_name="face", raw_input_contents=[
            inputs["data"].astype("<f4").tobytes()])
        unknown.inputs.add(name="data", datatype="FP32", shape=[1, 3, 32, 32])
        unknown.outputs.add(name="who_labels")
        code, details = client.code("ModelInfer", unknown)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "has no output 'who_labels'; its outputs are 'embedding', 'who'" in details
