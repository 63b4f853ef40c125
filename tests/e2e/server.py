"""Start `python -m service` as a real process on a free loopback port, and always stop it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "e2e-token"


def free_port(*taken: int) -> int:
    """A loopback port nobody listens on right now, none of ``taken``."""
    return _unused_port(*taken)


def _unused_port(*taken: int) -> int:
    """A port the kernel hands out for a probe bound and closed, none of ``taken``: two
    probes in a row can be handed the same port, and a server whose HTTP and gRPC ports
    came out equal exited, its second listener refused."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port not in taken:
            return port


@dataclass(frozen=True)
class Server:
    """A running server: its URLs and repository."""

    url: str
    admin_url: str
    repository: Path
    process: subprocess.Popen[bytes]
    log: Path  # the server's stdout and stderr
    grpc: str = ""  # host:port of its gRPC server ("" when switched off by `extra`)


@contextmanager
def running_server(repository: Path, extra: Sequence[str] = (), *, admin_port: bool = False,
                   startup_s: float = 60.0, token: str | None = TOKEN,
                   variables: Mapping[str, str] | None = None,
                   wait_for: str = "ready") -> Iterator[Server]:
    """Start the server, wait until /v2/health/ready answers (`wait_for` "live": until
    /v2/health/live does), stop it (SIGTERM, then kill).

    `token` None starts it with no admin token configured (it then generates one);
    `variables` are added to its environment. The repository directory is created first where
    it is missing (the server refuses a missing one).
    """
    repository.mkdir(parents=True, exist_ok=True)
    port = free_port()
    args = [sys.executable, "-m", "service", "--model-repository", str(repository),
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", *extra]
    grpc = ""
    if "--grpc-port" not in extra:  # never the default 8001: servers run side by side
        # Not `free_port`: a test pins that one to restart a replica on its old HTTP port.
        grpc = f"127.0.0.1:{_unused_port(port)}"
        args += ["--grpc-port", grpc.rsplit(":", 1)[1]]
    admin = port
    if admin_port:
        admin = _unused_port(port, *([int(grpc.rsplit(":", 1)[1])] if grpc else []))
        args += ["--admin-port", str(admin)]
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith("HYBRIDSERVE_")}
    if token is not None:
        environment["HYBRIDSERVE_ADMIN_TOKEN"] = token
    environment.update(variables or {})
    log = (repository.parent / f"server-{port}.log").open("wb")
    process = subprocess.Popen(args, cwd=ROOT, env=environment, stdout=log,
                               stderr=subprocess.STDOUT)
    try:
        server = Server(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}", repository,
                        process, Path(log.name), grpc)
        _wait_ready(server, startup_s, log.name, wait_for)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        log.close()


def _wait_ready(server: Server, timeout: float, log_path: str, probe: str = "ready") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}: "
                               f"{Path(log_path).read_text()[-3000:]}")
        try:
            if httpx.get(f"{server.url}/v2/health/{probe}", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server not ready after {timeout} s: {Path(log_path).read_text()[-3000:]}")
