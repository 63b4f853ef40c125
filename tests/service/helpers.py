"""An app over a temporary repository holding real conformance models, driven through httpx."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np

from engine.serving.config import datatype_of
from service.rest.app import create_app
from service.runtime import Runtime
from service.settings import Settings
from tests.conformance.fixtures import model_files, model_io_sets, model_meta

T = TypeVar("T")
TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MLP = "seed_mlp"


def config_for(name: str) -> dict[str, Any]:
    """A config.json for a conformance model: its inputs from meta.json, batch dimension -1."""
    return {"inputs": [{"name": spec["name"], "datatype": datatype_of(spec["dtype"]),
                        "shape": [-1, *spec["shape"][1:]]} for spec in model_meta(name)["inputs"]]}


def files_for(name: str) -> tuple[bytes, bytes]:
    """(symbol bytes, params bytes) of a conformance model."""
    symbol, params = model_files(name)
    return symbol.read_bytes(), params.read_bytes()


def first_io(name: str) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """The first (inputs, expected outputs) set of a conformance model."""
    return model_io_sets(name)[0]


def settings_for(root: Path, **overrides: Any) -> Settings:
    """Settings over `root` with the test admin token."""
    return Settings(**{"model_repository": root, "admin_token": TOKEN, **overrides})


@asynccontextmanager
async def serving(settings: Settings, models: Sequence[str] = (MLP,)
                  ) -> AsyncIterator[tuple[httpx.AsyncClient, Runtime]]:
    """The app started (lifespan) with `models` added, and a client talking to it in-process."""
    runtime = Runtime.create(settings)
    app = create_app(runtime)
    async with app.router.lifespan_context(app):
        for name in models:
            symbol, params = files_for(name)
            await runtime.repository.add_version(name, symbol, params, config=config_for(name))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client, runtime


def run(coroutine: Awaitable[T], timeout: float = 60.0) -> T:
    """Run a coroutine to completion on a fresh event loop."""
    async def bounded() -> T:
        return await asyncio.wait_for(coroutine, timeout)

    return asyncio.run(bounded())
