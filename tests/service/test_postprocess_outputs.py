"""Postprocessed outputs through the app in-process: tensors in (no images, so no geometry),
V2 tensors and /predict objects out, checked against MXNet's reference outputs filtered with
NumPy here; the classification extension on a softmax output; the metadata shown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

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
