"""The hot routes: ASGI routes of the app's one router, behind the same layers as every route,
implemented once, and described in the OpenAPI document."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from fastapi.routing import APIRoute
from starlette.routing import Match

from service.rest import routers
from service.rest.app import HybridServeApp, create_app
from service.rest.routes import AsgiRoute, Router
from service.runtime import Runtime
from tests.service.helpers import MLP, config_for, files_for, first_io, run, settings_for

HOT = {("POST", "/predict"), ("POST", "/v2/models/{name}/infer"),
       ("POST", "/v2/models/{name}/versions/{version}/infer"), ("GET", "/v2/health/live"),
       ("GET", "/v2/health/ready")}


async def call(app: Any, method: str, path: str, chunks: list[bytes],
               headers: list[tuple[bytes, bytes]] = (), disconnect: bool = False) -> dict:
    """Drive the app with raw ASGI messages; the reply's status, headers and body."""
    incoming = [{"type": "http.request", "body": chunk, "more_body": index < len(chunks) - 1}
                for index, chunk in enumerate(chunks)]
    if disconnect:
        incoming = [{"type": "http.disconnect"}]
    sent: list[dict] = []

    async def receive() -> dict:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "root_path": "",
             "query_string": b"", "headers": list(headers)}
    await app(scope, receive, send)
    if not sent:
        return {}
    return {"status": sent[0]["status"], "headers": dict(sent[0]["headers"]),
            "body": b"".join(message.get("body", b"") for message in sent[1:])}


def predict_body() -> bytes:
    inputs, _ = first_io(MLP)
    return orjson.dumps({"model": MLP, "inputs": {"data": inputs["data"].tolist()}})


def on_app(tmp_path: Path, scenario: Any, **settings: Any) -> None:
    """Run ``scenario(app, runtime)`` on a started app serving the seed MLP."""
    async def wrapped() -> None:
        runtime = Runtime.create(settings_for(tmp_path, **settings))
        app = create_app(runtime)
        async with app.router.lifespan_context(app):
            symbol, params = files_for(MLP)
            await runtime.repository.add_version(MLP, symbol, params, config=config_for(MLP))
            await scenario(app, runtime)

    run(wrapped())


def test_each_hot_route_is_one_asgi_route_and_no_fastapi_route() -> None:
    asgi = [(route.method, route.path) for route in routers.INFERENCE_ASGI]
    assert sorted(asgi) == sorted(HOT)
    declared = {(method, route.path) for router in routers.INFERENCE + routers.MANAGEMENT
                for route in router.routes if isinstance(route, APIRoute)
                for method in route.methods}
    assert not declared & HOT
    assert not hasattr(routers.predict, "router")  # /predict has no FastAPI twin any more


def test_the_hot_routes_come_first_in_the_one_router(tmp_path: Path) -> None:
    app = create_app(Runtime.create(settings_for(tmp_path)))
    first = app.router.routes[:len(HOT)]
    assert all(isinstance(route, AsgiRoute) for route in first)
    assert not any(isinstance(route, AsgiRoute) for route in app.router.routes[len(HOT):])
    health_only = create_app(Runtime.create(settings_for(tmp_path)), inference=False)
    assert {(route.method, route.path) for route in health_only.router.routes
            if isinstance(route, AsgiRoute)} == {("GET", "/v2/health/live"),
                                                 ("GET", "/v2/health/ready")}


def test_openapi_describes_the_asgi_routes(tmp_path: Path) -> None:
    app = create_app(Runtime.create(settings_for(tmp_path)))
    document = app.openapi()
    paths, schemas = document["paths"], document["components"]["schemas"]
    ids = []
    for method, path in HOT:
        operation = paths[path][method.lower()]
        ids.append(operation["operationId"])
        reply = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        assert reply.rpartition("/")[2] in schemas
        assert operation["description"] and operation["tags"]
    assert len(set(ids)) == len(ids)
    infer = paths["/v2/models/{name}/versions/{version}/infer"]["post"]
    assert [parameter["name"] for parameter in infer["parameters"]] == ["name", "version"]
    assert {"application/json", "application/octet-stream"} <= set(
        infer["requestBody"]["content"])
    assert "413" in infer["responses"] and "503" in paths["/v2/health/ready"]["get"]["responses"]
    predict = paths["/predict"]["post"]
    assert {"image/*", "multipart/form-data"} <= set(predict["requestBody"]["content"])
    assert [parameter["name"] for parameter in predict["parameters"]] == ["model", "version"]


def test_predict_in_chunks_through_the_whole_app(tmp_path: Path) -> None:
    async def scenario(app: HybridServeApp, runtime: Runtime) -> None:
        body = predict_body()
        reply = await call(app, "POST", "/predict", [body[:10], body[10:99], body[99:]])
        assert reply["status"] == 200 and reply["headers"][b"content-type"] == b"application/json"
        _, expected = first_io(MLP)
        output = np.array(next(iter(orjson.loads(reply["body"])["outputs"].values())))
        np.testing.assert_allclose(output, expected[0], rtol=1e-4, atol=1e-5)
        assert runtime.drain.in_flight == 0

    on_app(tmp_path, scenario)


def test_hot_routes_pass_the_apps_middleware(tmp_path: Path) -> None:
    """What every route passes, the hot routes pass too: a middleware added to the app sees
    them."""
    reached: list[str] = []

    class Spy:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
            reached.append(scope["path"])
            await self.app(scope, receive, send)

    async def scenario() -> None:
        runtime = Runtime.create(settings_for(tmp_path))
        app = create_app(runtime)
        app.add_middleware(Spy)
        async with app.router.lifespan_context(app):
            await call(app, "GET", "/v2/health/live", [b""])
            await call(app, "POST", "/predict", [b"{}"])
        assert reached == ["/v2/health/live", "/predict"]

    run(scenario())


def test_bodies_over_the_limit_get_413_declared_or_streamed(tmp_path: Path) -> None:
    async def scenario(app: HybridServeApp, runtime: Runtime) -> None:
        declared = await call(app, "POST", "/predict", [b"x"], [(b"content-length", b"5000")])
        streamed = await call(app, "POST", f"/v2/models/{MLP}/infer", [b"x" * 600] * 5)
        for reply in (declared, streamed):
            assert reply["status"] == 413
            assert "max_request_bytes" in orjson.loads(reply["body"])["error"]
        assert runtime.drain.in_flight == 0

    on_app(tmp_path, scenario, max_request_bytes=2048)


def test_errors_are_json_and_counted(tmp_path: Path) -> None:
    async def scenario(app: HybridServeApp, runtime: Runtime) -> None:
        tensor = {"name": "data", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}
        unknown = await call(app, "POST", "/v2/models/nope/infer",
                             [orjson.dumps({"inputs": [tensor]})])
        assert unknown["status"] == 404 and "nope" in orjson.loads(unknown["body"])["error"]
        garbage = await call(app, "POST", "/predict", [b"not json"])
        assert garbage["status"] == 400 and "JSON" in orjson.loads(garbage["body"])["error"]
        wrong_method = await call(app, "GET", "/predict", [b""])
        assert wrong_method["status"] == 405
        assert orjson.loads(wrong_method["body"]) == {
            "error": "method GET is not allowed on /predict"}
        assert (await call(app, "HEAD", "/v2/health/live", [b""]))["status"] == 405
        assert (await call(app, "POST", "/v2/models//infer", [b"{}"]))["status"] == 404

        async def broken(*request: object) -> dict:
            raise RuntimeError("a bug")

        runtime.inference.predict = broken  # type: ignore[method-assign]
        failed = await call(app, "POST", "/predict", [predict_body()])
        assert failed["status"] == 500
        assert orjson.loads(failed["body"])["error"].startswith("internal error (RuntimeError)")
        assert "a bug" not in failed["body"].decode()
        metrics = runtime.metrics.render().decode()
        for status in (400, 404, 500):
            assert f'hybridserve_http_errors_total{{status="{status}"}} 1.0' in metrics

    on_app(tmp_path, scenario)


def test_draining_refuses_inference_but_answers_probes(tmp_path: Path) -> None:
    async def scenario(app: HybridServeApp, runtime: Runtime) -> None:
        runtime.drain.draining = True
        refused = await call(app, "POST", "/predict", [predict_body()])
        assert refused["status"] == 503 and refused["headers"][b"retry-after"] == b"1"
        assert (await call(app, "GET", "/v2/health/live", [b""]))["status"] == 200
        runtime.ready = False
        not_ready = await call(app, "GET", "/v2/health/ready", [b""])
        assert not_ready["status"] == 503 and b"retry-after" in not_ready["headers"]

    on_app(tmp_path, scenario)


@pytest.mark.parametrize("path", ["/predict", f"/v2/models/{MLP}/infer"])
def test_a_client_gone_before_its_body_gets_no_reply(tmp_path: Path, path: str) -> None:
    async def scenario(app: HybridServeApp, runtime: Runtime) -> None:
        assert await call(app, "POST", path, [], [(b"content-length", b"10")],
                          disconnect=True) == {}
        assert runtime.drain.in_flight == 0

    on_app(tmp_path, scenario)


def test_replies_are_compressed_on_request(tmp_path: Path) -> None:
    async def scenario(app: HybridServeApp, runtime: Runtime) -> None:
        symbol, params = files_for(MLP)
        await runtime.repository.add_version("wide", symbol, params,
                                             config={**config_for(MLP), "max_batch_size": 128})
        inputs, _ = first_io(MLP)
        rows = np.repeat(inputs["data"], 128, axis=0)  # a reply over MIN_COMPRESS_BYTES
        body = orjson.dumps({"model": "wide", "inputs": {"data": rows.tolist()}})
        reply = await call(app, "POST", "/predict", [body], [(b"accept-encoding", b"gzip")])
        assert reply["status"] == 200 and reply["headers"][b"content-encoding"] == b"gzip"
        assert int(reply["headers"][b"content-length"]) == len(reply["body"])
        answer = orjson.loads(gzip.decompress(reply["body"]))
        assert len(next(iter(answer["outputs"].values()))) == 128

    on_app(tmp_path, scenario)


def scanned(app: HybridServeApp, scope: dict) -> tuple[Any, dict]:
    """The route Starlette's scan of the router picks for `scope` (first full match), and its
    path parameters."""
    for route in app.router.routes:
        match, child = route.matches(scope)
        if match is Match.FULL:
            return route, child.get("path_params", {})
    return None, {}


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/predict"), ("GET", "/predict"), ("GET", "/v2/health/live"),
    ("HEAD", "/v2/health/live"), ("GET", "/v2/health/ready"), ("POST", "/v2/health/ready"),
    ("POST", "/v2/models/m/infer"), ("POST", "/v2/models/m/versions/3/infer"),
    ("POST", "/v2/models//infer"), ("POST", "/v2/models/a/b/infer"),
    ("POST", "/v2/models/m/versions//infer"), ("GET", "/v2/models/m/infer"),
    ("GET", "/v2/models/m"), ("GET", "/v2/models/m/ready"), ("GET", "/v2"),
    ("POST", "/v2/repository/index"), ("GET", "/metrics"), ("POST", "/models/m"),
    ("GET", "/nowhere")])
def test_the_lookup_finds_what_the_scan_finds(tmp_path: Path, method: str, path: str) -> None:
    """`Router` answers from its table only what the scan would give an ASGI route, with the
    same path parameters; everything else (other routes, 404, 405) is the scan's."""
    app = create_app(Runtime.create(settings_for(tmp_path)))
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}
    expected, parameters = scanned(app, dict(scope))
    found = Router(app.router).find(scope)
    if isinstance(expected, AsgiRoute):
        assert found is expected and scope["path_params"] == parameters
    else:
        assert found is None


def test_a_root_path_is_left_to_the_scan(tmp_path: Path) -> None:
    """Behind a proxy's prefix (uvicorn --root-path) the paths carry it: the scan strips it."""
    async def scenario(app: HybridServeApp, runtime: Runtime) -> None:
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": "/api/v2/health/live",
                 "root_path": "/api", "query_string": b"", "headers": []}
        await app(scope, receive, send)
        assert sent[0]["status"] == 200 and orjson.loads(sent[1]["body"]) == {"live": True}

    on_app(tmp_path, scenario)


def test_a_request_inside_is_counted_and_finishes_when_draining_begins(tmp_path: Path) -> None:
    """The gate counts a request from before its body is read until its reply is sent; draining
    that begins meanwhile refuses only requests that arrive after it."""
    async def scenario(app: HybridServeApp, runtime: Runtime) -> None:
        real = runtime.inference.predict
        seen: list[int] = []

        async def predict(*request: object) -> dict:
            seen.append(runtime.drain.in_flight)
            runtime.drain.draining = True  # SIGTERM while this request runs
            refused = await call(app, "POST", "/predict", [predict_body()])
            assert refused["status"] == 503
            return await real(*request)

        runtime.inference.predict = predict  # type: ignore[method-assign]
        reply = await call(app, "POST", "/predict", [predict_body()])
        assert reply["status"] == 200 and seen == [1]
        assert runtime.drain.in_flight == 0

    on_app(tmp_path, scenario)
