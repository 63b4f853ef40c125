"""Texts to a model whose input has a text pipeline, through the app in-process: V2 BYTES
(JSON strings, binary UTF-8), /predict JSON, and the refusals naming input and row."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from service.grpc import inference_pb2 as pb
from tests.service.grpc_inprocess import grpc_client
from tests.service.helpers import AUTH, run, serving, settings_for
from tests.service.text_model import CONFIG, NAME, reference, singles_and_pairs, upload_files

URL = f"/v2/models/{NAME}/infer"
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
SINGLES, PAIRS = singles_and_pairs()


@asynccontextmanager
async def text_app(root: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The app serving the tiny BERT with its text pipeline, uploaded with its vocab part."""
    async with serving(settings_for(root), models=()) as (client, _):
        answer = await client.post(f"/models/{NAME}", files=upload_files(), headers=AUTH)
        assert answer.status_code == 201, answer.text
        yield client


def _outputs(response: httpx.Response) -> dict[str, np.ndarray]:
    assert response.status_code == 200, response.text
    return {output["name"]: np.asarray(output["data"], np.float32).reshape(output["shape"])
            for output in response.json()["outputs"]}


def _assert_reference(outputs: dict[str, Any], cases: list[dict[str, Any]]) -> None:
    expected = reference(cases)
    for name in ("sequence", "pooled"):
        np.testing.assert_allclose(np.asarray(outputs[name], np.float32), expected[name],
                                   **TOLERANCE, err_msg=name)


def _binary(texts: list[bytes], shape: list[int]) -> tuple[bytes, dict[str, str]]:
    data = b"".join(len(text).to_bytes(4, "little") + text for text in texts)
    header = orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": shape,
                                       "parameters": {"binary_data_size": len(data)}}]})
    return header + data, {"Inference-Header-Content-Length": str(len(header))}


def test_texts_through_v2_json_and_binary_and_predict(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with text_app(tmp_path) as client:
            body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(SINGLES)],
                                "data": [case["texts"][0] for case in SINGLES]}]}
            _assert_reference(_outputs(await client.post(URL, json=body)), SINGLES)
            content, headers = _binary([text.encode() for case in PAIRS
                                        for text in case["texts"]], [len(PAIRS), 2])
            binary = await client.post(URL, content=content, headers=headers)
            _assert_reference(_outputs(binary), PAIRS)
            predict = await client.post("/predict", json={
                "model": NAME, "inputs": {"text": [case["texts"] for case in PAIRS]}})
            assert predict.status_code == 200, predict.text
            _assert_reference(predict.json()["outputs"], PAIRS)
            one = await client.post("/predict", json={"model": NAME,
                                                      "inputs": {"text": SINGLES[0]["texts"][0]}})
            assert one.status_code == 200, one.text
            _assert_reference(one.json()["outputs"], SINGLES[:1])

    run(scenario())


def test_token_ids_as_tensors_still_serve(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with text_app(tmp_path) as client:
            inputs = {"text": [case["ids"] for case in PAIRS],
                      "data1": [case["types"] for case in PAIRS],
                      "data2": [case["valid_length"] for case in PAIRS]}
            response = await client.post("/predict", json={"model": NAME, "inputs": inputs})
            assert response.status_code == 200, response.text
            _assert_reference(response.json()["outputs"], PAIRS)

    run(scenario())


async def _refused(client: httpx.AsyncClient, **request: Any) -> str:
    response = await client.post(URL, **request)
    assert response.status_code == 400, response.text
    return str(response.json()["error"])


def test_bad_texts_are_refused_naming_the_input_and_row(tmp_path: Path) -> None:
    where = f"model '{NAME}' version 1: input 'text'"

    async def scenario() -> None:
        async with text_app(tmp_path) as client:
            content, headers = _binary([b"the cat", b"\xff\xfe bad", b"a dog"], [3])
            assert (f"{where}, batch row 1: the text is not UTF-8"
                    in await _refused(client, content=content, headers=headers))
            content, headers = _binary([b"a", b"b", b"c"], [1, 3])
            assert (f"{where} has BYTES shape [1, 3]; expected [N] or [N, 1]"
                    in await _refused(client, content=content, headers=headers))
            content, headers = _binary([b"the"] * 9, [9])
            assert (f"{where} has 9 rows of text; max_batch_size is 8"
                    in await _refused(client, content=content, headers=headers))
            both = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                "data": ["the cat"]},
                               {"name": "data1", "datatype": "FP32", "shape": [1, 16],
                                "data": [0.0] * 16}]}
            assert ("input 'data1' is filled from the texts of input 'text'"
                    in await _refused(client, json=both))
            mixed = await client.post("/predict", json={"model": NAME, "inputs": {
                "text": ["the cat", ["a", "b"]]}})
            assert mixed.status_code == 400 and "mixes single texts and pairs" in mixed.text

    run(scenario())


def test_grpc_takes_texts_as_bytes_contents_and_raw(tmp_path: Path) -> None:
    with grpc_client(tmp_path, models=()) as client:
        upload = client.app.request("POST", f"/models/{NAME}", files=upload_files(), headers=AUTH)
        assert upload.status_code == 201, upload.text
        texts = [text.encode() for case in PAIRS for text in case["texts"]]
        typed = pb.ModelInferRequest(model_name=NAME)
        typed.inputs.add(name="text", datatype="BYTES", shape=[len(PAIRS), 2],
                         contents=pb.InferTensorContents(bytes_contents=texts))
        raw = pb.ModelInferRequest(model_name=NAME, raw_input_contents=[
            b"".join(len(text).to_bytes(4, "little") + text for text in texts)])
        raw.inputs.add(name="text", datatype="BYTES", shape=[len(PAIRS), 2])
        for request in (typed, raw):
            response = client.call("ModelInfer", request)
            outputs = {tensor.name: np.frombuffer(data, np.float32).reshape(tensor.shape)
                       for tensor, data in zip(response.outputs, response.raw_output_contents)}
            _assert_reference(outputs, PAIRS)


def test_concurrent_requests_are_answered_and_a_bad_text_fails_alone(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with text_app(tmp_path) as client:
            requests = []
            for case in SINGLES[:7]:
                content, headers = _binary([case["texts"][0].encode()], [1])
                requests.append(client.post(URL, content=content, headers=headers))
            content, headers = _binary([b"\xc3\x28"], [1])
            requests.insert(3, client.post(URL, content=content, headers=headers))
            responses = await asyncio.gather(*requests)
            assert responses[3].status_code == 400
            assert "input 'text', batch row 0: the text is not UTF-8" in responses[3].text
            good = [response for index, response in enumerate(responses) if index != 3]
            outputs = [_outputs(response) for response in good]
            _assert_reference({name: np.concatenate([output[name] for output in outputs])
                               for name in ("sequence", "pooled")}, SINGLES[:7])

    run(scenario())


def _pairs_files() -> dict[str, tuple[str, bytes]]:
    """The upload of `upload_files`, its text pipeline marked as taking pairs."""
    config = json.loads(json.dumps(CONFIG))
    config["inputs"][0]["preprocess"]["text"]["pairs"] = True
    return {**upload_files(), "config": ("config.json", json.dumps(config).encode())}


def test_metadata_shows_the_texts_a_client_sends_not_the_filled_inputs(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with text_app(tmp_path) as client:
            metadata = (await client.get(f"/v2/models/{NAME}")).json()
            assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
            # The completed config keeps the three tensors, for clients that tokenise.
            detail = (await client.get(f"/models/{NAME}")).json()
            assert detail["inputs"] == metadata["inputs"]
            assert [(tensor["name"], tensor["datatype"], tensor["shape"])
                    for tensor in detail["config"]["inputs"]] == [
                ("text", "FP32", [-1, -1]), ("data1", "FP32", [-1, -1]), ("data2", "FP32", [-1])]
            upload = await client.post("/models/pairs", files=_pairs_files(), headers=AUTH)
            assert upload.status_code == 201, upload.text
            metadata = (await client.get("/v2/models/pairs")).json()
            assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES",
                                           "shape": [-1, 2]}]
            # Single texts are still taken by a model marked for pairs.
            body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                "data": [SINGLES[0]["texts"][0]]}]}
            _assert_reference(_outputs(await client.post("/v2/models/pairs/infer", json=body)),
                              SINGLES[:1])

    run(scenario())


def test_a_missing_text_input_is_described_as_texts(tmp_path: Path) -> None:
    where = f"model '{NAME}' version 1"
    ids = [[0.0] * 16]

    async def scenario() -> None:
        async with text_app(tmp_path) as client:
            tensors = {"inputs": [
                {"name": "data1", "datatype": "FP32", "shape": [1, 16], "data": ids},
                {"name": "data2", "datatype": "FP32", "shape": [1], "data": [3.0]}]}
            refusal = await _refused(client, json=tensors)
            assert refusal == (f"{where}: missing input 'text', which takes BYTES (texts: one "
                               "a row, or [N, 2] for pairs) or FP32 [-1, -1] (token ids)")
            assert "image" not in refusal
            token_ids = {"inputs": [
                {"name": "text", "datatype": "FP32", "shape": [1, 16], "data": ids}]}
            assert (f"{where}: missing input 'data1', which takes FP32 [-1, -1]; it is filled "
                    "when input 'text' is sent as texts (BYTES)"
                    in await _refused(client, json=token_ids))
            wrong = {"inputs": [{"name": "text", "datatype": "INT32", "shape": [1, 16],
                                 "data": [[0] * 16]},
                                {"name": "data1", "datatype": "FP32", "shape": [1, 16],
                                 "data": ids},
                                {"name": "data2", "datatype": "FP32", "shape": [1],
                                 "data": [3.0]}]}
            assert (f"{where}: input 'text' has datatype INT32; expected BYTES (texts: one a "
                    "row, or [N, 2] for pairs) or FP32 [-1, -1] (token ids)"
                    in await _refused(client, json=wrong))

    run(scenario())
