"""`FastLane`: which requests it answers itself, and that its answers match the FastAPI app's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from service.app import create_app
from service.fast_lane import FastLane
from service.runtime import Runtime
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


class Inner:
    """The app behind the lane: records what reaches it and answers 299."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def call(lane: FastLane, method: str, path: str, chunks: list[bytes],
               headers: list[tuple[bytes, bytes]] = (), disconnect: bool = False) -> dict:
    """Drive the lane with raw ASGI messages; the reply's status, headers and body."""
    incoming = [{"type": "http.request", "body": chunk, "more_body": index < len(chunks) - 1}
                for index, chunk in enumerate(chunks)]
    if disconnect:
        incoming = [{"type": "http.disconnect"}]
    sent: list[dict] = []

    async def receive() -> dict:
        return incoming.pop(0)

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": list(headers)}
    await lane(scope, receive, send)
    if not sent:
        return {}
    return {"status": sent[0]["status"], "headers": dict(sent[0]["headers"]),
            "body": b"".join(message.get("body", b"") for message in sent[1:])}


def predict_body() -> bytes:
    inputs, _ = first_io(MLP)
    return orjson.dumps({"model": MLP, "inputs": {"data": inputs["data"].tolist()}})


def with_lane(tmp_path: Path, scenario: Any, **settings: Any) -> None:
    async def wrapped() -> None:
        async with serving(settings_for(tmp_path, **settings)) as (_, runtime):
            inner = Inner()
            await scenario(FastLane(inner, runtime=runtime), inner, runtime)

    run(wrapped())


@pytest.mark.parametrize("method, path, hot", [
    ("POST", "/predict", True),
    ("GET", "/v2/health/live", True),
    ("GET", "/v2/health/ready", True),
    ("POST", f"/v2/models/{MLP}/infer", True),
    ("POST", f"/v2/models/{MLP}/versions/1/infer", True),
    ("GET", "/predict", False),
    ("GET", f"/v2/models/{MLP}", False),
    ("POST", "/v2/models//infer", False),
    ("POST", f"/v2/models/{MLP}/versions//infer", False),
    ("POST", f"/v2/models/{MLP}/versions/1/infer/more", False),
    ("POST", f"/models/{MLP}", False),
    ("GET", "/metrics", False),
])
def test_only_the_hot_routes_are_answered_here(tmp_path: Path, method: str, path: str,
                                               hot: bool) -> None:
    async def scenario(lane: FastLane, inner: Inner, runtime: Runtime) -> None:
        reply = await call(lane, method, path, [b"{}"])
        assert (inner.paths == []) is hot
        assert (reply["status"] != 299) is hot

    with_lane(tmp_path, scenario)


def test_predict_through_the_lane(tmp_path: Path) -> None:
    async def scenario(lane: FastLane, inner: Inner, runtime: Runtime) -> None:
        body = predict_body()
        # The body in three chunks, as a client streaming it would send it.
        reply = await call(lane, "POST", "/predict", [body[:10], body[10:99], body[99:]])
        assert reply["status"] == 200 and reply["headers"][b"content-type"] == b"application/json"
        answer = orjson.loads(reply["body"])
        _, expected = first_io(MLP)
        output = np.array(next(iter(answer["outputs"].values())))
        np.testing.assert_allclose(output, expected[0], rtol=1e-4, atol=1e-5)
        assert runtime.drain.in_flight == 0

    with_lane(tmp_path, scenario)


def test_bodies_over_the_limit_get_413_declared_or_streamed(tmp_path: Path) -> None:
    async def scenario(lane: FastLane, inner: Inner, runtime: Runtime) -> None:
        declared = await call(lane, "POST", "/predict", [b"x"],
                              [(b"content-length", b"5000")])
        streamed = await call(lane, "POST", "/predict", [b"x" * 600] * 5)
        for reply in (declared, streamed):
            assert reply["status"] == 413
            assert "max_request_bytes" in orjson.loads(reply["body"])["error"]
        assert runtime.drain.in_flight == 0

    with_lane(tmp_path, scenario, max_request_bytes=2048)


def test_errors_are_json_with_the_app_statuses(tmp_path: Path) -> None:
    async def scenario(lane: FastLane, inner: Inner, runtime: Runtime) -> None:
        tensor = {"name": "data", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}
        unknown = await call(lane, "POST", "/v2/models/nope/infer",
                             [orjson.dumps({"inputs": [tensor]})])
        assert unknown["status"] == 404 and "nope" in orjson.loads(unknown["body"])["error"]
        garbage = await call(lane, "POST", "/predict", [b"not json"])
        assert garbage["status"] == 400 and "JSON" in orjson.loads(garbage["body"])["error"]

        async def broken(*request: object) -> dict:
            raise RuntimeError("a bug")

        runtime.inference.predict = broken  # an unexpected failure: 500 without internals
        failed = await call(lane, "POST", "/predict", [predict_body()])
        assert failed["status"] == 500
        assert orjson.loads(failed["body"])["error"].startswith("internal error (RuntimeError)")
        assert "a bug" not in failed["body"].decode()

    with_lane(tmp_path, scenario)


def test_draining_refuses_inference_but_answers_probes(tmp_path: Path) -> None:
    async def scenario(lane: FastLane, inner: Inner, runtime: Runtime) -> None:
        runtime.drain.draining = True
        refused = await call(lane, "POST", "/predict", [predict_body()])
        assert refused["status"] == 503 and refused["headers"][b"retry-after"] == b"1"
        assert (await call(lane, "GET", "/v2/health/live", [b""]))["status"] == 200
        runtime.ready = False
        not_ready = await call(lane, "GET", "/v2/health/ready", [b""])
        assert not_ready["status"] == 503 and b"retry-after" in not_ready["headers"]

    with_lane(tmp_path, scenario)


def test_a_client_gone_before_its_body_gets_no_reply(tmp_path: Path) -> None:
    async def scenario(lane: FastLane, inner: Inner, runtime: Runtime) -> None:
        assert await call(lane, "POST", "/predict", [], disconnect=True) == {}
        assert runtime.drain.in_flight == 0

    with_lane(tmp_path, scenario)


def test_the_app_answers_hot_routes_before_any_fastapi_middleware(tmp_path: Path) -> None:
    reached: list[str] = []

    class Spy:
        """A middleware in FastAPI's stack: records the paths that reach it."""

        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
            reached.append(scope.get("path", scope["type"]))
            await self.app(scope, receive, send)

    async def scenario() -> None:
        runtime = Runtime.create(settings_for(tmp_path))
        app = create_app(runtime)
        app.add_middleware(Spy)
        async with app.router.lifespan_context(app):
            symbol, params = files_for(MLP)
            await runtime.repository.add_version(MLP, symbol, params, config=config_for(MLP))
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                predicted = await client.post("/predict", content=predict_body())
                listed = await client.get("/models", headers=AUTH)
        assert predicted.status_code == 200 and listed.status_code == 200
        assert reached == ["/models"]

    run(scenario())
