"""The ``hybridserve`` console script: its help lists every command it runs; its HTTP servers
listen once their app has started."""

from __future__ import annotations

import asyncio
import importlib
import socket
import tomllib
from typing import Any

import pytest
import uvloop

from service.settings import Settings
from service.startup import StartError, bind_http
from tests.e2e.server import ROOT


def test_the_console_scripts_help_lists_every_command(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["hybridserve"].partition(":")
    main = getattr(importlib.import_module(module), function)
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    help_text = capsys.readouterr().out
    assert "--model-repository" in help_text  # the server's options
    assert "hybridserve export-onnx" in help_text and "ONNX" in help_text


async def _lifespan_only_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An ASGI app that only starts and stops."""
    assert scope["type"] == "lifespan"
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        else:
            await send({"type": "lifespan.shutdown.complete"})
            return


def test_a_port_taken_while_the_app_starts_stops_the_start_naming_its_option() -> None:
    from service import __main__ as entry

    sock = bind_http("127.0.0.1", 0, "admin_port")  # bound, not listening: the models load
    port = sock.getsockname()[1]
    with socket.socket() as thief:  # another process takes the port meanwhile
        thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        thief.bind(("127.0.0.1", port))
        thief.listen()
        server = entry._Server(entry._config(_lifespan_only_app, Settings()), sock, "admin_port")
        with pytest.raises(StartError) as refused:
            uvloop.run(asyncio.wait_for(server.serve(sockets=[sock]), 30))  # as `main` runs it
    assert f"cannot listen for HTTP on 127.0.0.1:{port}" in str(refused.value)
    assert "--admin-port / HYBRIDSERVE_ADMIN_PORT" in str(refused.value)
