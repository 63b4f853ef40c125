"""A real `python -m service` start: what it prints about its listeners, and what stops it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.e2e.server import ROOT, running_server

pytestmark = pytest.mark.e2e
START_TIMEOUT_S = 120  # a refused start exits before loading anything; generous for a busy box


def _clean_environment(**extra: str) -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith("HYBRIDSERVE_")}
    return {**environment, **extra}


def _start(args: Sequence[str], **environment: str) -> subprocess.CompletedProcess[str]:
    """Run the server with `args`, expecting it to refuse the start (it never gets a signal)."""
    return subprocess.run([sys.executable, "-m", "service", "--host", "127.0.0.1", *args],
                          cwd=ROOT, env=_clean_environment(**environment), capture_output=True,
                          text=True, timeout=START_TIMEOUT_S, check=False)


@contextmanager
def _taken_port() -> Iterator[int]:
    """A loopback port another socket listens on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


def test_the_start_prints_every_listener(tmp_path: Path) -> None:
    with running_server(tmp_path / "repository", admin_port=True) as server:
        log = server.log.read_text()
        assert f"HTTP: {server.url} (inference API; --port / HYBRIDSERVE_PORT)" in log, log
        assert (f"HTTP: {server.admin_url} (management API; --admin-port / "
                "HYBRIDSERVE_ADMIN_PORT)") in log, log
        assert (f"gRPC: {server.grpc} (Open Inference Protocol; --grpc-port / "
                "HYBRIDSERVE_GRPC_PORT)") in log, log
    with running_server(tmp_path / "repository", ["--grpc-port", "0"]) as server:
        log = server.log.read_text()
        assert f"HTTP: {server.url} (inference and management API; --port" in log, log
        assert "gRPC: off (--grpc-port / HYBRIDSERVE_GRPC_PORT is 0)" in log, log


def test_a_taken_grpc_port_names_its_option_and_variable(tmp_path: Path) -> None:
    with _taken_port() as port:
        result = _start(["--model-repository", str(tmp_path), "--port", "0",
                         "--grpc-port", str(port)])
    assert result.returncode == 2, result.stderr
    assert f"cannot listen for gRPC on 127.0.0.1:{port}" in result.stderr
    assert "--grpc-port / HYBRIDSERVE_GRPC_PORT" in result.stderr, result.stderr


def test_a_taken_http_port_names_its_option_and_variable(tmp_path: Path) -> None:
    with _taken_port() as port:
        result = _start(["--model-repository", str(tmp_path), "--port", str(port),
                         "--grpc-port", "0"])
        assert result.returncode == 2, result.stderr
        assert f"cannot listen for HTTP on 127.0.0.1:{port}" in result.stderr
        assert "--port / HYBRIDSERVE_PORT" in result.stderr, result.stderr
        admin = _start(["--model-repository", str(tmp_path), "--port", "0", "--grpc-port", "0"],
                       HYBRIDSERVE_ADMIN_PORT=str(port))
    assert admin.returncode == 2, admin.stderr
    assert "--admin-port / HYBRIDSERVE_ADMIN_PORT" in admin.stderr, admin.stderr


def test_a_missing_repository_stops_the_start_and_is_left_uncreated(tmp_path: Path) -> None:
    missing = tmp_path / "modles"
    result = _start(["--model-repository", str(missing), "--port", "0", "--grpc-port", "0"])
    assert result.returncode == 2, result.stderr
    assert f"model repository '{missing}'" in result.stderr and "does not exist" in result.stderr
    assert "--create-model-repository" in result.stderr, result.stderr
    assert not missing.exists(), "the misspelt repository was created (and a token written)"


def test_the_repository_is_created_when_asked(tmp_path: Path) -> None:
    created = tmp_path / "new" / "repository"
    with running_server(tmp_path / "unused", ["--model-repository", str(created),
                                              "--create-model-repository"],
                        token=None) as server:
        assert httpx.post(server.url + "/v2/repository/index", json={}, timeout=30).json() == []
        assert created.is_dir() and (created / ".admin-token").is_file()
