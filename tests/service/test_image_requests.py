"""Images to a model whose input has a preprocess pipeline, through the app in-process: V2
BYTES (base64 JSON, binary), /predict raw bodies and multipart, and the refusals."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import httpx
import numpy as np
import orjson

from service.grpc import inference_pb2 as pb
from service.runtime import Runtime
from tests.service import image_model
from tests.service.grpc_inprocess import grpc_client
from tests.service.helpers import run, serving, settings_for
from tests.service.image_model import NAME, encode, photo, reference_scores

URL = f"/v2/models/{NAME}/infer"
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
JPEG = encode(photo(300, 400, seed=1), "JPEG")
PNG = encode(photo(257, 240, seed=2), "PNG")


@asynccontextmanager
async def image_app(root: Path) -> AsyncIterator[tuple[httpx.AsyncClient, bytes, bytes]]:
    """The app serving the tiny classifier; also its symbol and params for the reference."""
    symbol, params = image_model.model_files()
    async with serving(settings_for(root, image_threads=2), models=()) as (client, runtime):
        await _add(runtime, symbol, params)
        yield client, symbol, params


async def _add(runtime: Runtime, symbol: bytes, params: bytes) -> None:
    await runtime.repository.add_version(NAME, symbol, params, config=image_model.CONFIG)


def _scores(response: httpx.Response, rows: int) -> np.ndarray:
    assert response.status_code == 200, response.text
    output = response.json()["outputs"][0]
    assert (output["name"], output["datatype"], output["shape"]) == ("scores", "FP32", [rows, 5])
    return np.asarray(output["data"], np.float32).reshape(rows, 5)


def _json_body(*images: bytes) -> dict:
    return {"inputs": [{"name": "data", "datatype": "BYTES", "shape": [len(images)],
                        "data": [base64.b64encode(image).decode() for image in images]}]}


def _binary_body(*images: bytes) -> tuple[bytes, int]:
    data = b"".join(len(image).to_bytes(4, "little") + image for image in images)
    header = orjson.dumps({"inputs": [{"name": "data", "datatype": "BYTES",
                                       "shape": [len(images), 1],
                                       "parameters": {"binary_data_size": len(data)}}]})
    return header + data, len(header)


def test_metadata_shows_bytes_and_the_config_the_models_tensor(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with image_app(tmp_path) as (client, _, _):
            metadata = (await client.get(f"/v2/models/{NAME}")).json()
            assert metadata["inputs"] == [{"name": "data", "datatype": "BYTES", "shape": [-1]}]
            detail = (await client.get(f"/models/{NAME}")).json()
            assert detail["config"]["inputs"][0]["shape"] == [-1, 3, -1, -1]  # the graph's
            assert detail["config"]["inputs"][0]["datatype"] == "FP32"

    run(scenario())


def test_every_transport_gives_the_reference_outputs(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with image_app(tmp_path) as (client, symbol, params):
            expected = reference_scores(symbol, params, [JPEG, PNG])
            json_answer = await client.post(URL, json=_json_body(JPEG, PNG))
            np.testing.assert_allclose(_scores(json_answer, 2), expected, **TOLERANCE)
            body, length = _binary_body(JPEG, PNG)
            binary = await client.post(URL, content=body, headers={
                "Inference-Header-Content-Length": str(length)})
            np.testing.assert_allclose(_scores(binary, 2), expected, **TOLERANCE)
            raw = await client.post(f"/predict?model={NAME}&version=1", content=PNG,
                                    headers={"Content-Type": "image/png"})
            assert raw.status_code == 200, raw.text
            assert raw.json()["model"] == NAME and raw.json()["version"] == 1
            np.testing.assert_allclose(raw.json()["outputs"]["scores"], expected[1:],
                                       **TOLERANCE)
            files = [("data", ("a.jpg", JPEG, "image/jpeg")), ("data", ("b.png", PNG, "image/png"))]
            form = await client.post(f"/predict?model={NAME}", files=files)
            assert form.status_code == 200, form.text
            np.testing.assert_allclose(form.json()["outputs"]["scores"], expected, **TOLERANCE)

    run(scenario())


def test_float_tensors_still_serve_a_pipeline_input(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with image_app(tmp_path) as (client, symbol, params):
            rows = np.stack([image_model.reference_row(JPEG)]).astype(np.float32)
            body = {"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 3, 224, 224],
                                "data": rows.reshape(-1).tolist()}]}
            answer = await client.post(URL, json=body)
            np.testing.assert_allclose(_scores(answer, 1), reference_scores(symbol, params, [JPEG]),
                                       **TOLERANCE)

    run(scenario())


BAD = [
    (_json_body(JPEG, b"GIF89a not really"),
     "input 'data', batch row 1: image format GIF is not accepted; send JPEG, PNG, WEBP"),
    (_json_body(JPEG[: len(JPEG) // 3]),
     "input 'data', batch row 0: JPEG image cannot be decoded (corrupt or truncated)"),
    ({"inputs": [{"name": "data", "datatype": "BYTES", "shape": [1], "data": ["%%%"]}]},
     "input 'data', batch row 0: the string is not base64"),
    ({"inputs": [{"name": "data", "datatype": "BYTES", "shape": [1, 2], "data": ["a", "b"]}]},
     "input 'data' has BYTES shape [1, 2]; expected [N] or [N, 1]"),
    ({"inputs": [{"name": "data", "datatype": "BYTES", "shape": [9], "data": ["a"] * 9}]},
     "input 'data' has 9 images; max_batch_size is 8"),
    ({"inputs": [{"name": "data", "datatype": "INT32", "shape": [1], "data": [1]}]},
     "input 'data' has datatype INT32; expected BYTES (encoded images, one a row) or FP32 "
     "[-1, 3, -1, -1]"),
]


def test_bad_images_are_400_naming_the_input_and_row(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with image_app(tmp_path) as (client, _, _):
            for body, message in BAD:
                response = await client.post(URL, json=body)
                assert response.status_code == 400, response.text
                assert f"model '{NAME}' version 1: " in response.json()["error"]
                assert message in response.json()["error"]

    run(scenario())


PREDICT_BAD = [
    ("", {"Content-Type": "image/jpeg"}, JPEG, "needs the model in the query string"),
    (f"model={NAME}&size=3", {"Content-Type": "image/jpeg"}, JPEG,
     "unknown parameters ['size']"),
    (f"model={NAME}", {"Content-Type": "image/jpeg"}, b"",
     "input 'data', batch row 0: image is empty (0 bytes)"),
    (f"model={NAME}", {"Content-Type": "multipart/form-data; boundary=xyz"}, b"--xyz\r\nbroken",
     "the multipart body ended before its closing boundary"),
    (f"model={NAME}", {"Content-Type": "multipart/form-data"}, b"", "has no boundary"),
]


def test_bad_predict_image_bodies_are_400(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with image_app(tmp_path) as (client, _, _):
            for query, headers, body, message in PREDICT_BAD:
                response = await client.post(f"/predict?{query}", content=body, headers=headers)
                assert response.status_code == 400, (query, response.text)
                assert message in response.json()["error"], response.text
            wrong = await client.post(f"/predict?model={NAME}",
                                      files=[("image", ("a.jpg", JPEG, "image/jpeg"))])
            assert wrong.status_code == 400
            assert "has no input 'image'; its inputs are 'data'" in wrong.json()["error"]
            plain = await client.post("/predict?model=nonexistent", content=JPEG,
                                      headers={"Content-Type": "image/jpeg"})
            assert plain.status_code == 404, plain.text

    run(scenario())


def test_a_bad_image_fails_only_its_own_request(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with image_app(tmp_path) as (client, symbol, params):
            expected = reference_scores(symbol, params, [JPEG])
            bodies = [_json_body(JPEG)] * 6 + [_json_body(b"\xff\xd8\xff broken")]
            answers = await asyncio.gather(*(client.post(URL, json=body) for body in bodies))
            for answer in answers[:-1]:
                np.testing.assert_allclose(_scores(answer, 1), expected, **TOLERANCE)
            assert answers[-1].status_code == 400
            assert "batch row 0: JPEG image" in answers[-1].json()["error"]

    run(scenario())


def test_grpc_takes_images_as_raw_or_bytes_contents(tmp_path: Path) -> None:
    symbol, params = image_model.model_files()
    expected = reference_scores(symbol, params, [JPEG, PNG])
    with grpc_client(tmp_path, models=()) as client:
        upload = client.app.upload(NAME, symbol, params, json.dumps(image_model.CONFIG).encode())
        assert upload.status_code == 201, upload.text
        metadata = client.call("ModelMetadata", pb.ModelMetadataRequest(name=NAME))
        assert [(tensor.datatype, list(tensor.shape)) for tensor in metadata.inputs] == [
            ("BYTES", [-1])]
        raw = pb.ModelInferRequest(model_name=NAME, raw_input_contents=[
            b"".join(len(image).to_bytes(4, "little") + image for image in (JPEG, PNG))])
        raw.inputs.add(name="data", datatype="BYTES", shape=[2])
        typed = pb.ModelInferRequest(model_name=NAME)
        typed.inputs.add(name="data", datatype="BYTES", shape=[2, 1],
                         contents=pb.InferTensorContents(bytes_contents=[JPEG, PNG]))
        for request in (raw, typed):
            response = client.call("ModelInfer", request)
            scores = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(2, 5)
            np.testing.assert_allclose(scores, expected, **TOLERANCE)
        bad = pb.ModelInferRequest(model_name=NAME)
        bad.inputs.add(name="data", datatype="BYTES", shape=[2],
                       contents=pb.InferTensorContents(bytes_contents=[JPEG, b"%PDF-1.4"]))
        code, details = client.code("ModelInfer", bad)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "input 'data', batch row 1: image format PDF is not accepted" in details
