"""`make serve`: the command it runs takes the HTTP and the gRPC port from the make variables."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

import pytest

from tests.deploy.helpers import ROOT


def _serve_command(*assignments: str) -> list[str]:
    """The server command line `make serve` would run (`make -n`: nothing is run)."""
    make = shutil.which("make")
    if make is None:
        pytest.fail("make is not installed; `make serve` and `make test` need it")
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("HOST", "PORT", "GRPC_PORT", "MAKEFLAGS")}
    result = subprocess.run([make, "-n", "serve", *assignments], cwd=ROOT, env=environment,
                            capture_output=True, text=True, timeout=60, check=True)
    text = result.stdout.replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if " -m service " in line]
    return shlex.split(line)


def _option(command: list[str], flag: str) -> str:
    assert flag in command, f"`make serve` passes no {flag}: {shlex.join(command)}"
    return command[command.index(flag) + 1]


def test_make_serve_passes_both_ports() -> None:
    default = _serve_command()
    assert (_option(default, "--port"), _option(default, "--grpc-port")) == ("8000", "8001")
    chosen = _serve_command("PORT=9100", "GRPC_PORT=9101")
    assert (_option(chosen, "--port"), _option(chosen, "--grpc-port")) == ("9100", "9101")
