"""The app over a temporary repository, driven synchronously on its own event loop (for fuzzing)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from service.rest.app import create_app
from service.runtime import Runtime
from tests.service.helpers import AUTH, config_for, files_for, settings_for


class AppClient:
    """Synchronous calls into the ASGI app; the app's lifespan runs on `loop`."""

    def __init__(self, app: FastAPI, runtime: Runtime, loop: asyncio.AbstractEventLoop,
                 client: httpx.AsyncClient) -> None:
        self.app = app
        self.runtime = runtime
        self.loop = loop
        self.client = client

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One request, run to completion on the app's loop."""
        return self.loop.run_until_complete(
            asyncio.wait_for(self.client.request(method, url, **kwargs), 60))

    def upload(self, name: str, symbol: bytes, params: bytes, config: bytes | None = None,
               **form: str) -> httpx.Response:
        """``POST /models/{name}`` with the admin token."""
        files = {"symbol": ("s.json", symbol), "params": ("p.params", params)}
        if config is not None:
            files["config"] = ("config.json", config)
        return self.request("POST", f"/models/{name}", files=files, data=form, headers=AUTH)


@contextmanager
def app_client(root: Path, models: Sequence[str] = ("seed_mlp",),
               **overrides: Any) -> Iterator[AppClient]:
    """An `AppClient` over a fresh repository at `root` holding the named conformance models."""
    loop = asyncio.new_event_loop()
    runtime = Runtime.create(settings_for(root, **overrides))
    app = create_app(runtime)
    stack = AsyncExitStack()

    async def enter() -> httpx.AsyncClient:
        await stack.enter_async_context(app.router.lifespan_context(app))
        transport = httpx.ASGITransport(app=app)
        return await stack.enter_async_context(
            httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1"))

    try:
        client = AppClient(app, runtime, loop, loop.run_until_complete(enter()))
        for name in models:
            symbol, params = files_for(name)
            response = client.upload(name, symbol, params, json.dumps(config_for(name)).encode())
            assert response.status_code == 201, response.text
        yield client
    finally:
        loop.run_until_complete(stack.aclose())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
