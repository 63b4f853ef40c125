"""Uploads through the app: streamed into the staging directory, bounded in number, bad bodies."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from engine.serving.disk import TMP_PREFIX
from engine.serving.manifest import PARAMS_NAME, SYMBOL_NAME
from service.rest import uploads
from service.rest.app import create_app
from service.runtime import Runtime
from tests.service.helpers import AUTH, MLP, config_for, files_for, run, serving, settings_for


def _encoded(name: str = "hybridnet", **fields: str) -> tuple[dict[str, str], bytes]:
    """(headers, body) of a multipart upload of a conformance model, as httpx encodes it."""
    symbol, params = files_for(name)
    files = {"symbol": ("s.json", symbol), "params": ("p.params", params),
             "config": ("config.json", json.dumps(config_for(name)).encode())}
    request = httpx.Request("POST", "http://test/models/x", files=files, data=fields)
    return {**AUTH, "Content-Type": request.headers["Content-Type"]}, request.read()


async def _paused(body: bytes, split: int, resume: asyncio.Event) -> AsyncIterator[bytes]:
    """`body` in two chunks, the second sent only once `resume` is set."""
    yield body[:split]
    await resume.wait()
    yield body[split:]


def _staged(root: Path) -> list[Path]:
    return sorted(root.glob(TMP_PREFIX + "*"))


async def _wait_for(condition: object, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition never became true"
        await asyncio.sleep(0.01)


def test_parts_are_written_to_the_staging_directory_as_they_arrive(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uploads, "HANDOFF_BYTES", 1)  # hand every chunk over, however small
    headers, body = _encoded()
    symbol, _ = files_for("hybridnet")
    split = body.index(b'name="params"')  # symbol complete, params not started

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), []) as (client, _):
            resume = asyncio.Event()
            upload = asyncio.create_task(client.post(
                "/models/hn", headers=headers, content=_paused(body, split, resume)))
            await _wait_for(lambda: len(_staged(tmp_path)) == 1 and (
                _staged(tmp_path)[0] / SYMBOL_NAME).exists())
            staging = _staged(tmp_path)[0]
            await _wait_for(lambda: (staging / SYMBOL_NAME).read_bytes() == symbol)
            assert not (staging / PARAMS_NAME).exists()
            resume.set()
            response = await upload
            assert response.status_code == 201, response.text
            assert response.json()["version"] == 1
            assert _staged(tmp_path) == [] and (tmp_path / "hn" / "1" / SYMBOL_NAME).exists()

    run(scenario())


def test_concurrent_uploads_beyond_the_bound_are_503_with_retry_after(tmp_path: Path) -> None:
    headers, body = _encoded()

    async def scenario() -> None:
        async with serving(settings_for(tmp_path, max_concurrent_uploads=1), []) as (client, _):
            resume = asyncio.Event()
            first = asyncio.create_task(client.post(
                "/models/a", headers=headers, content=_paused(body, 100, resume)))
            await _wait_for(lambda: len(_staged(tmp_path)) == 1)
            refused = await client.post("/models/b", headers=headers, content=body)
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "5"
            assert "max_concurrent_uploads" in refused.json()["error"]
            resume.set()
            assert (await first).status_code == 201
            second = await client.post("/models/b", headers=headers, content=body)
            assert second.status_code == 201, second.text  # the slot was given back
            assert _staged(tmp_path) == []

    run(scenario())


def test_a_refused_upload_gives_its_slot_back(tmp_path: Path) -> None:
    headers, body = _encoded()

    async def scenario() -> None:
        async with serving(settings_for(tmp_path, max_concurrent_uploads=1), []) as (client, _):
            for _ in range(3):
                response = await client.post("/models/hn", headers=headers, content=body[:-100])
                assert response.status_code == 400, response.text
            assert (await client.post("/models/hn", headers=headers,
                                      content=body)).status_code == 201

    run(scenario())


def test_bad_bodies_are_400_naming_the_problem_and_leave_nothing(tmp_path: Path) -> None:
    headers, body = _encoded()
    symbol, params = files_for("hybridnet")
    multipart = headers["Content-Type"]
    cases: list[tuple[dict[str, object], int, str]] = [
        ({"json": {"symbol": "x"}}, 400, "must be multipart/form-data"),
        ({"content": body, "headers": {**AUTH, "Content-Type": "multipart/form-data"}}, 400,
         "must be multipart/form-data"),
        ({"content": body[:-100], "headers": headers}, 400, "ended before its closing boundary"),
        ({"content": b"garbage" * 10, "headers": headers}, 400, "malformed multipart body"),
        ({"files": {"symbol": ("s", symbol)}}, 400, "missing part 'params'"),
        ({"files": {"symbol": ("s", symbol), "params": ("p", params),
                    "weights": ("w", params)}}, 400, "unknown part 'weights'"),
        ({"files": [("symbol", ("s", symbol)), ("symbol", ("s", symbol)),
                    ("params", ("p", params))]}, 400, "'symbol' appears more than once"),
        ({"files": {"symbol": ("s", symbol), "params": ("p", params)},
          "data": {"replace": "maybe"}}, 400, "'replace' must be true or false"),
        ({"files": {"symbol": ("s", symbol), "params": ("p", params),
                    "config": ("c", b" " * (1 << 20) + b"{}")}}, 413, "'config'"),
        ({"files": {"symbol": ("s", symbol), "params": ("p", params)},
          "data": {"version": "0"}}, 400, "version"),
    ]
    assert multipart.startswith("multipart/form-data; boundary=")

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), []) as (client, _):
            for arguments, status, words in cases:
                arguments.setdefault("headers", AUTH)
                response = await client.post("/models/hn", **arguments)  # type: ignore[arg-type]
                assert response.status_code == status, (words, response.text)
                assert words in response.json()["error"], response.text
                assert sorted(path.name for path in tmp_path.iterdir()) == [], words

    run(scenario())


def test_replace_and_version_fields(tmp_path: Path) -> None:
    headers, body = _encoded(version="3")
    replacing_headers, replacing = _encoded(version="3", replace="true")

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), [MLP]) as (client, _):
            assert (await client.post("/models/hn", headers=headers,
                                      content=body)).json()["version"] == 3
            conflict = await client.post("/models/hn", headers=headers, content=body)
            assert conflict.status_code == 409, conflict.text
            replaced = await client.post("/models/hn", headers=replacing_headers,
                                         content=replacing)
            assert replaced.status_code == 201 and replaced.json()["version"] == 3
            assert sorted(path.name for path in (tmp_path / "hn").iterdir()) == [
                "3", "config.json"]

    run(scenario())


def test_the_token_is_checked_before_the_body_is_read(tmp_path: Path) -> None:
    headers, body = _encoded()
    sent: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 1024):
            sent.append(start)
            yield body[start:start + 1024]

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), []) as (client, _):
            unauthenticated = {"Content-Type": headers["Content-Type"]}
            response = await client.post("/models/hn", headers=unauthenticated, content=chunks())
            assert response.status_code == 401
            assert len(sent) <= 1 < len(body) // 1024
            assert list(tmp_path.iterdir()) == []

    run(scenario())


def test_a_client_gone_mid_upload_leaves_nothing_and_no_server_error(tmp_path: Path) -> None:
    headers, body = _encoded()
    runtime = Runtime.create(settings_for(tmp_path))
    app = create_app(runtime)
    messages = iter([{"type": "http.request", "body": body[:len(body) // 2], "more_body": True},
                     {"type": "http.disconnect"}])
    sent: list[dict] = []

    async def receive() -> dict:
        return next(messages)

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/models/hn", "raw_path": b"/models/hn",
             "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
             "server": ("test", 80), "client": ("127.0.0.1", 1234),
             "headers": [(key.lower().encode(), value.encode()) for key, value in headers.items()]}

    async def scenario() -> None:
        async with app.router.lifespan_context(app):
            await app(scope, receive, send)  # type: ignore[arg-type]
            assert runtime.uploads.active == 0

    run(scenario())
    assert sent[0]["status"] == 400 and b"disconnected" in sent[1]["body"]
    assert list(tmp_path.iterdir()) == []
