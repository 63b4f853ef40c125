"""The Open Inference Protocol as written (#17 point 4) and hostile request bodies (#26).

Every request goes through the whole app (the ``path`` parameter once named a second front end
for the hot routes; there is one now).
"""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from engine.serving.versions import Phase
from service.errors import BadRequest, RequestTimeout
from service.rest.app import create_app
from service.rest.limits import BodyDeadlines
from service.runtime import Runtime
from service.tensors import binary as codecs
from tests.service.helpers import (
    AUTH,
    MLP,
    config_for,
    files_for,
    first_io,
    run,
    serving,
    settings_for,
)

PATHS = ("app",)
MULTI = "multi_io"
PLAIN = {"Accept-Encoding": "identity"}


@asynccontextmanager
async def clients(tmp_path: Path, models: tuple[str, ...] = (MLP,), **settings: Any
                  ) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    """A client of the whole app, under the key "app"."""
    runtime = Runtime.create(settings_for(tmp_path, **settings))
    app = create_app(runtime)
    async with app.router.lifespan_context(app):
        for name in models:
            symbol, params = files_for(name)
            await runtime.repository.add_version(name, symbol, params, config=config_for(name))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://test") as client:
            yield {"app": client}


def scenario_on(tmp_path: Path, body: Any, models: tuple[str, ...] = (MLP,),
                **settings: Any) -> None:
    """Run ``body(clients)`` against a fresh app."""
    async def wrapped() -> None:
        async with clients(tmp_path, models, **settings) as both:
            await body(both)

    run(wrapped())


def mlp_input() -> np.ndarray:
    return first_io(MLP)[0]["data"]


def v2_json(data: Any, **extra: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 512], "data": data}],
            **extra}


def binary_outputs(response: httpx.Response) -> dict[str, np.ndarray]:
    """The binary outputs of a V2 response, by name."""
    length = int(response.headers[codecs.HEADER_LENGTH])
    header = orjson.loads(response.content[:length])
    outputs, offset = {}, length
    for output in header["outputs"]:
        size = output["parameters"]["binary_data_size"]
        array = np.frombuffer(response.content[offset:offset + size], np.float32)
        outputs[output["name"]] = array.reshape(output["shape"])
        offset += size
    return outputs


def assert_error(response: httpx.Response, status: int, *fragments: str) -> str:
    assert response.status_code == status, response.text
    message = response.json()["error"]
    for fragment in fragments:
        assert fragment in message, message
    return message


# ----- #17 point 4: the protocol as written ------------------------------------------------

def test_model_metadata_names_the_platform_mxnet_mxnet(tmp_path: Path) -> None:
    async def body(both: dict[str, httpx.AsyncClient]) -> None:
        response = await both["app"].get(f"/v2/models/{MLP}")
        assert response.status_code == 200 and response.json()["platform"] == "mxnet_mxnet"

    scenario_on(tmp_path, body)


def test_server_metadata_at_the_protocols_literal_path(tmp_path: Path) -> None:
    async def body(both: dict[str, httpx.AsyncClient]) -> None:
        for path in ("/v2/", "/v2"):
            response = await both["app"].get(path)
            assert response.status_code == 200, (path, response.status_code)
            assert response.json()["name"] == "hybridserve"
            assert "binary_tensor_data" in response.json()["extensions"]

    scenario_on(tmp_path, body)


def test_an_unloaded_model_is_not_ready_with_400(tmp_path: Path) -> None:
    async def body(both: dict[str, httpx.AsyncClient]) -> None:
        client = both["app"]
        assert (await client.get(f"/v2/models/{MLP}/ready")).status_code == 200
        unloaded = await client.post(f"/v2/repository/models/{MLP}/unload", headers=AUTH)
        assert unloaded.status_code == 200
        for path in (f"/v2/models/{MLP}/ready", f"/v2/models/{MLP}/versions/1/ready"):
            assert_error(await client.get(path), 400, "not ready", MLP)
        assert_error(await client.get("/v2/models/nope/ready"), 404, "nope")
        # It stays unloaded until someone loads it: inference and metadata answer 400 as
        # /ready does, without a Retry-After that retrying could not honour.
        for response in (await client.post(f"/v2/models/{MLP}/infer", json=v2_json([0.0] * 512)),
                         await client.post("/predict", json={
                             "model": MLP, "inputs": {"data": [[0.0] * 512]}}),
                         await client.get(f"/v2/models/{MLP}"),
                         await client.get(f"/v2/models/{MLP}/versions/1")):
            assert_error(response, 400, "no version ready" if "versions" not in
                         str(response.request.url) else "version 1 is not ready",
                         "it serves once loaded")
            assert "Retry-After" not in response.headers

    scenario_on(tmp_path, body)


def test_a_version_the_policy_stopped_is_400_and_a_loading_one_503(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path)) as (client, runtime):
            await body(client, runtime)

    async def body(client: httpx.AsyncClient, runtime: Runtime) -> None:
        symbol, params = files_for(MLP)
        upload = await client.post(f"/models/{MLP}", headers=AUTH, files={
            "symbol": symbol, "params": params})
        assert upload.status_code == 201, upload.text
        response = await client.post(f"/v2/models/{MLP}/versions/1/infer",
                                     json=v2_json([0.0] * 512))
        assert_error(response, 400, "version 1 is not ready", "not selected by version_policy")
        assert "Retry-After" not in response.headers
        assert (await client.post(f"/v2/models/{MLP}/versions/2/infer",
                                  json=v2_json([0.0] * 512))).status_code == 200
        record = runtime.repository.records(MLP)[1]
        record.phase = Phase.LOADING  # as while a load of version 1 runs
        response = await client.post(f"/v2/models/{MLP}/versions/1/infer",
                                     json=v2_json([0.0] * 512))
        assert_error(response, 503, "version 1 is not ready")
        assert response.headers["Retry-After"] == "1"
        record.phase = Phase.UNAVAILABLE

    run(scenario())


@pytest.mark.parametrize("path", PATHS)
def test_raw_binary_request_is_one_row_of_the_only_input(tmp_path: Path, path: str) -> None:
    inputs, expected = first_io(MLP)

    async def body(both: dict[str, httpx.AsyncClient]) -> None:
        response = await both[path].post(
            f"/v2/models/{MLP}/infer", content=inputs["data"].astype("<f4").tobytes(),
            headers={codecs.HEADER_LENGTH: "0", "Content-Type": "application/octet-stream"})
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "application/octet-stream"
        (output,) = binary_outputs(response).values()
        np.testing.assert_allclose(output, expected[0], rtol=1e-4, atol=1e-5)
        short = await both[path].post(f"/v2/models/{MLP}/infer", content=b"\0" * 100,
                                      headers={codecs.HEADER_LENGTH: "0"})
        assert_error(short, 400, "raw binary request of 100 bytes", "2048 bytes")

    scenario_on(tmp_path, body)


def test_raw_binary_request_to_a_model_of_two_inputs_is_400(tmp_path: Path) -> None:
    async def body(both: dict[str, httpx.AsyncClient]) -> None:
        response = await both["app"].post(f"/v2/models/{MULTI}/infer", content=b"\0" * 80,
                                           headers={codecs.HEADER_LENGTH: "0"})
        assert_error(response, 400, "has 2 inputs", "'data0'", "one input only")

    scenario_on(tmp_path, body, models=(MULTI,))


def test_raw_binary_shape_follows_from_the_byte_count() -> None:
    assert codecs.raw_shape((-1, 3, -1), 24, 4, "input 'x'") == (1, 3, 2)
    assert codecs.raw_shape((-1, 4), 16, 4, "input 'x'") == (1, 4)
    with pytest.raises(BadRequest, match="has 2 variable dimensions besides the batch"):
        codecs.raw_shape((-1, -1, -1), 16, 4, "input 'x'")
    with pytest.raises(BadRequest, match="does not fill whole tensors"):
        codecs.raw_shape((-1, 3, -1), 20, 4, "input 'x'")


def test_raw_binary_row_lies_at_the_batch_axis() -> None:
    """A time-major model's tokens ``[steps, batch]``: the steps follow from the byte count and
    the one row is the second dimension; without a batch the shape is the config's own."""
    assert codecs.raw_shape((-1, -1), 24, 4, "input 'x'", batch_axis=1) == (6, 1)
    assert codecs.raw_shape((2, -1, 32), 256, 4, "input 'x'", batch_axis=1) == (2, 1, 32)
    assert codecs.raw_shape((2, -1), 24, 4, "input 'x'", batch_axis=None) == (2, 3)
    with pytest.raises(BadRequest, match=r"one row of 256 bytes \(shape \[2, 1, 32\]\)"):
        codecs.raw_shape((2, -1, 32), 512, 4, "input 'x'", batch_axis=1)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("extra", "fragment"), [
    ({"parameters": {"binary_data_output": "false"}},
     "parameters.binary_data_output must be a JSON boolean (true or false), got 'false'"),
    ({"outputs": [{"name": "seed_mlp_dense2_fwd_output", "parameters": {"binary_data": 1}}]},
     "parameters.binary_data must be a JSON boolean"),
    ({"outputs": [{"name": "y"}, {"name": "y"}]}, "output 'y' is requested twice"),
])
def test_wrongly_typed_parameters_and_repeated_outputs_are_400(tmp_path: Path, path: str,
                                                              extra: dict, fragment: str) -> None:
    async def body(both: dict[str, httpx.AsyncClient]) -> None:
        response = await both[path].post(f"/v2/models/{MLP}/infer",
                                         json=v2_json(mlp_input().tolist(), **extra))
        assert_error(response, 400, fragment)

    scenario_on(tmp_path, body)


def test_the_same_input_twice_is_400(tmp_path: Path) -> None:
    async def body(both: dict[str, httpx.AsyncClient]) -> None:
        request = v2_json(mlp_input().tolist())
        request["inputs"] *= 2
        response = await both["app"].post(f"/v2/models/{MLP}/infer", json=request)
        assert_error(response, 400, "input 'data' is given twice")

    scenario_on(tmp_path, body)


# ----- #26: hostile JSON --------------------------------------------------------------------

def nested(depth: int) -> bytes:
    return b"[" * depth + b"0.5" + b"]" * depth


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("depth", [3, 65, 200, 1000])
def test_tensor_data_nested_past_its_rank_is_400(tmp_path: Path, path: str, depth: int) -> None:
    padding = b" " * 1100  # the simdjson path
    v2 = (b'{"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 512], "data": '
          + nested(depth) + b"}]}" + padding)
    predict = b'{"model": "seed_mlp", "inputs": {"data": ' + nested(depth) + b"}}" + padding

    async def body(both: dict[str, httpx.AsyncClient]) -> None:
        client = both[path]
        for url, content in ((f"/v2/models/{MLP}/infer", v2), ("/predict", predict)):
            response = await client.post(url, content=content)
            assert_error(response, 400, "input 'data'", "nested more than 2 arrays deep")

    scenario_on(tmp_path, body)


def test_deeply_nested_header_fields_are_400(tmp_path: Path) -> None:
    async def body(both: dict[str, httpx.AsyncClient]) -> None:
        request = orjson.dumps(v2_json(mlp_input().tolist()))[:-1] + b', "outputs": ' + nested(
            900) + b"}"
        response = await both["app"].post(f"/v2/models/{MLP}/infer", content=request)
        assert_error(response, 400, "outputs[0] must be a JSON object")
        too_deep = await both["app"].post("/predict", content=b'{"model": ' + nested(1100)
                                           + b"}" + b" " * 1100)
        assert_error(too_deep, 400, "not valid JSON")

    scenario_on(tmp_path, body)


# ----- #26: compressed bodies and responses -------------------------------------------------

def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush()


ENCODERS = {"gzip": ("gzip", gzip.compress), "deflate": ("deflate", zlib.compress),
            "raw deflate": ("deflate", raw_deflate)}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("encoder", sorted(ENCODERS))
def test_compressed_request_bodies_are_inflated(tmp_path: Path, path: str, encoder: str) -> None:
    coding, encode = ENCODERS[encoder]
    inputs, expected = first_io(MLP)

    async def body(both: dict[str, httpx.AsyncClient]) -> None:
        client = both[path]
        predict = orjson.dumps({"model": MLP, "inputs": {"data": inputs["data"].tolist()}})
        response = await client.post("/predict", content=encode(predict),
                                     headers={"Content-Encoding": coding})
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(np.asarray(next(iter(response.json()["outputs"].values()))),
                                   expected[0], rtol=1e-4, atol=1e-5)
        v2 = orjson.dumps(v2_json(inputs["data"].ravel().tolist()))
        response = await client.post(f"/v2/models/{MLP}/infer", content=encode(v2),
                                     headers={"Content-Encoding": coding})
        assert response.status_code == 200, response.text
        data = response.json()["outputs"][0]["data"]
        np.testing.assert_allclose(np.asarray(data).reshape(expected[0].shape), expected[0],
                                   rtol=1e-4, atol=1e-5)

    scenario_on(tmp_path, body)


@pytest.mark.parametrize("path", PATHS)
def test_bad_compressed_bodies_are_refused_by_name(tmp_path: Path, path: str) -> None:
    good = gzip.compress(orjson.dumps(v2_json(mlp_input().tolist())))

    async def body(both: dict[str, httpx.AsyncClient]) -> None:
        client = both[path]
        url = f"/v2/models/{MLP}/infer"
        assert_error(await client.post(url, content=good, headers={"Content-Encoding": "br"}),
                     415, "Content-Encoding 'br' is not supported")
        assert_error(await client.post(url, content=good[:-20],
                                       headers={"Content-Encoding": "gzip"}), 400, "truncated")
        assert_error(await client.post(url, content=b"not gzip at all",
                                       headers={"Content-Encoding": "gzip"}),
                     400, "not valid gzip data")
        bomb = gzip.compress(b"\0" * (4 << 20))  # 4 MiB inflated, the limit is 1 MiB
        assert_error(await client.post(url, content=bomb, headers={"Content-Encoding": "gzip"}),
                     413, "max_request_bytes", "once decompressed")

    scenario_on(tmp_path, body, max_request_bytes=1 << 20)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_large_responses_are_compressed_when_asked(tmp_path: Path, path: str,
                                                   coding: str) -> None:
    model = "concurrent_cnn"  # five outputs a row: 32 rows make a 2 KB response
    rows = np.random.default_rng(3).standard_normal((32, 3, 15, 15)).astype(np.float32)

    async def body(both: dict[str, httpx.AsyncClient]) -> None:
        client = both[path]
        for url, request in (("/predict", {"model": model, "inputs": {"data": rows.tolist()}}),
                             (f"/v2/models/{model}/infer", {"inputs": [{
                                 "name": "data", "datatype": "FP32", "shape": list(rows.shape),
                                 "data": rows.ravel().tolist()}]})):
            asked = await client.post(url, json=request, headers={"Accept-Encoding": coding})
            plain = await client.post(url, json=request, headers=PLAIN)
            assert asked.status_code == plain.status_code == 200, asked.text
            assert asked.headers["content-encoding"] == coding
            assert "content-encoding" not in plain.headers
            assert int(asked.headers["content-length"]) < len(plain.content) * 0.8
            assert asked.json() == plain.json()  # httpx inflated it
        small = await client.get("/v2/health/live", headers={"Accept-Encoding": coding})
        assert "content-encoding" not in small.headers

    scenario_on(tmp_path, body, models=(model,))


# ----- #17 point 5: slow bodies -------------------------------------------------------------

@pytest.mark.parametrize(("path", "url"), [("app", f"/v2/models/{MLP}/infer"),
                                           ("app", "/v2/repository/index")])
def test_a_body_slower_than_body_timeout_is_408(tmp_path: Path, path: str, url: str) -> None:
    async def body(both: dict[str, httpx.AsyncClient]) -> None:
        async def trickle() -> AsyncIterator[bytes]:
            yield b"{"
            await asyncio.sleep(5)
            yield b"}"

        started = asyncio.get_running_loop().time()
        response = await both[path].post(url, content=trickle())
        assert_error(response, 408, "within 0.3 s (body_timeout)")
        assert response.headers["connection"] == "close"
        assert asyncio.get_running_loop().time() - started < 3

    scenario_on(tmp_path, body, body_timeout=0.3)


# ----- #26 point 5: repository bodies name the field ---------------------------------------

@pytest.mark.parametrize(("url", "content", "status", "fragment"), [
    ("/v2/repository/index", b'{"ready": "yes"}', 400,
     "repository index request: ready must be a JSON boolean (true or false), got 'yes'"),
    ("/v2/repository/index", b'{"ready": [true]}', 400, "ready must be a JSON boolean"),
    ("/v2/repository/index", b"[1]", 400, "must be a JSON object, got list"),
    ("/v2/repository/index", b'{"ready": tru', 400, "is not valid JSON"),
    (f"/v2/repository/models/{MLP}/load", b'{"parameters": {"config": "{}"}}', 400,
     "parameter 'config' is not supported"),
    (f"/v2/repository/models/{MLP}/load", b'{"parameters": 7}', 400,
     "'parameters' must be a JSON object, got int"),
    (f"/v2/repository/models/{MLP}/unload", b'{"parameters": {"unload_dependents": "no"}}',
     400, "parameters.unload_dependents must be a JSON boolean"),
    (f"/v2/repository/models/{MLP}/unload", b'{"parameters": {"unload_dependents": false}}',
     200, ""),
    ("/v2/repository/index", b'{"ready": true}', 200, ""),
])
def test_repository_bodies_name_the_wrong_field(tmp_path: Path, url: str, content: bytes,
                                                status: int, fragment: str) -> None:
    async def body(both: dict[str, httpx.AsyncClient]) -> None:
        response = await both["app"].post(url, content=content, headers=AUTH)
        if status == 200:
            assert response.status_code == 200, response.text
        else:
            assert_error(response, status, fragment)

    scenario_on(tmp_path, body)


def test_body_deadlines_cancel_only_reads_that_wait_past_them() -> None:
    async def scenario() -> None:
        deadlines = BodyDeadlines(0.2)
        forever = asyncio.Event()

        async def stalled() -> dict:
            await forever.wait()
            return {}

        async def prompt() -> dict:
            return {"type": "http.request", "body": b"x"}

        async def slow_reader() -> None:
            await deadlines.receive(stalled, deadlines.deadline())

        async def slow_worker() -> str:
            message = await deadlines.receive(prompt, deadlines.deadline())
            await asyncio.sleep(0.5)  # past the deadline, but no longer reading the body
            return message["body"].decode()

        reader, worker = asyncio.create_task(slow_reader()), asyncio.create_task(slow_worker())
        with pytest.raises(RequestTimeout, match="within 0.2 s"):
            await reader
        assert await worker == "x"

    run(scenario(), timeout=10)


def test_a_repository_load_that_leaves_nothing_serving_is_400(tmp_path: Path) -> None:
    async def body(both: dict[str, httpx.AsyncClient]) -> None:
        (tmp_path / "empty").mkdir()  # a model of no version
        for path in ("/v2/repository/models/empty/load", "/models/empty/load"):
            assert_error(await both["app"].post(path, headers=AUTH), 400,
                         "model 'empty' did not load: it has no version on disk")

    scenario_on(tmp_path, body)
