"""Three server processes sharing one repository behind a real nginx, on loopback.

nginx runs deploy/nginx/nginx.conf itself, with only what cannot work outside compose changed:
the DNS-resolved upstream becomes the three loopback replicas, and the listen port, pid, logs
and temp paths move into the test's directory. Its retry policy is the deployed one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest

from engine.serving.config import datatype_of
from tests.conformance.fixtures import assert_close, model_io_sets
from tests.deploy.helpers import NGINX_CONF, nginx_test_config
from tests.e2e import server as server_module
from tests.e2e.nginx import nginx_or_skip
from tests.e2e.server import TOKEN, Server, free_port, running_server
from tests.service.helpers import MLP, config_for, files_for

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
REPLICAS = 3
POLL_S = 0.5
# How long a replica may take to serve an upload made through another: the next poll, then
# reading, validating and planning the model. Beside two busy processes on 2 cores, the slowest
# replica served 3 to 11 s after the upload (the test prints the times). Only polling brings the
# model to the other two replicas, so a generous bound proves what a tight one would.
CONVERGE_LIMIT_S = 60.0
NGINX_START_LIMIT_S = 60.0
# After the upstream's fail_timeout, nginx tries the restarted replica again with the next
# request for it; the requests themselves may be slow on a busy machine.
REJOIN_SLACK_S = 30.0
LOAD_REQUESTS = 240
LOAD_THREADS = 4
KILL_AFTER = 60  # requests completed before one replica is killed


@dataclass
class Nginx:
    """A running nginx: its URL, process, access log and upstream fail_timeout, and the
    address (host:port) of its gRPC server."""

    url: str
    process: subprocess.Popen[bytes]
    access_log: Path
    fail_timeout_s: float
    grpc: str

    def upstreams(self) -> list[tuple[str, int]]:
        """(upstream addresses tried, final status) per request logged so far."""
        rows = []
        for line in self.access_log.read_text().splitlines():
            addresses, _, status = line.rpartition(" ")
            rows.append((addresses, int(status)))
        return rows


def replica_config(prefix: Path, listen: int, grpc_listen: int, ports: list[int],
                   grpc_ports: list[int]) -> tuple[str, float]:
    """deploy/nginx/nginx.conf for loopback replicas under `prefix`; and its fail_timeout (s)."""
    text = nginx_test_config(NGINX_CONF.read_text(), prefix, loopback_ports=ports,
                             grpc_ports=grpc_ports)
    substitutions = [
        (r"^pid [^;]+;", f"pid {prefix / 'nginx.pid'};"),
        (r"^error_log [^;]+;", f"error_log {prefix / 'error.log'} warn;"),
        (r"^(\s*)access_log /dev/stdout;",
         rf"\1log_format upstreams '$upstream_addr $status';\n"
         rf"\1access_log {prefix / 'access.log'} upstreams;"),
        (r"^(\s*)listen 80;", rf"\1listen 127.0.0.1:{listen};"),
        (r"^(\s*)listen 8001 http2;", rf"\1listen 127.0.0.1:{grpc_listen} http2;"),
    ]
    for pattern, replacement in substitutions:
        text, count = re.subn(pattern, replacement, text, count=1, flags=re.MULTILINE)
        assert count == 1, f"deploy/nginx/nginx.conf: no line matches {pattern!r}"
    if os.geteuid() == 0:  # workers of a root master run as nobody, who cannot enter tmp_path
        text = "user root;\n" + text
    timeout = re.search(r"fail_timeout=(\d+)s", text)
    assert timeout is not None, "nginx.conf: expected `fail_timeout=<N>s` on the upstream servers"
    return text, float(timeout.group(1))


@pytest.fixture
def nginx_binary() -> str:
    """nginx, installed if missing (requested first, so a skip starts no replica)."""
    return nginx_or_skip("THE MULTI-REPLICA END-TO-END TEST")


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """The repository directory every replica shares."""
    root = tmp_path / "repository"
    root.mkdir()
    return root


@pytest.fixture
def replicas(repository: Path) -> Iterator[tuple[list[Server], ExitStack]]:
    """Three replicas over `repository` polling every POLL_S; the stack that stops them."""
    with ExitStack() as stack:
        servers = [stack.enter_context(running_server(
            repository, ["--poll-interval", str(POLL_S)]))
            for _ in range(REPLICAS)]
        yield servers, stack


@pytest.fixture
def nginx(nginx_binary: str, tmp_path: Path, replicas: tuple[list[Server], ExitStack]
          ) -> Iterator[Nginx]:
    """nginx in front of the replicas, stopped (its process group) at the end."""
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    ports = [int(server.url.rsplit(":", 1)[1]) for server in replicas[0]]
    grpc_ports = [int(server.grpc.rsplit(":", 1)[1]) for server in replicas[0]]
    listen = free_port()
    grpc_listen = free_port(listen)
    config, fail_timeout = replica_config(prefix, listen, grpc_listen, ports, grpc_ports)
    (prefix / "nginx.conf").write_text(config)
    output = (prefix / "stdout.log").open("wb")
    process = subprocess.Popen(
        [nginx_binary, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e", "stderr",
         "-g", "daemon off;"], stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    running = Nginx(f"http://127.0.0.1:{listen}", process, prefix / "access.log", fail_timeout,
                    f"127.0.0.1:{grpc_listen}")
    try:
        _wait_nginx(running, prefix)
        yield running
    finally:
        _stop_group(process)
        output.close()


def _wait_nginx(running: Nginx, prefix: Path) -> None:
    deadline = time.monotonic() + NGINX_START_LIMIT_S
    while time.monotonic() < deadline:
        if running.process.poll() is not None:
            break
        try:
            if httpx.get(running.url + "/nginx-health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    logs = "".join(path.read_text() for path in (prefix / "stdout.log", prefix / "error.log")
                   if path.exists())
    raise RuntimeError(f"nginx did not start (exit {running.process.poll()}): {logs[-3000:]}")


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM nginx's master (its workers follow), SIGKILL the group if it lingers."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)


def _predict(client: httpx.Client, url: str, inputs: np.ndarray) -> httpx.Response:
    return client.post(url + "/predict", json={"model": MLP, "inputs": {"data": inputs.tolist()}})


def _infer_v2(client: httpx.Client, url: str, inputs: np.ndarray) -> httpx.Response:
    tensor = {"name": "data", "datatype": datatype_of(inputs.dtype), "shape": list(inputs.shape),
              "data": inputs.ravel().tolist()}
    return client.post(f"{url}/v2/models/{MLP}/infer", json={"inputs": [tensor]})


def _check_serves_grpc(address: str, inputs: np.ndarray, expected: np.ndarray) -> None:
    """ModelInfer through `address` (the server's own stubs; see tests/e2e/grpc_clients.py)."""
    import grpc

    from service.grpc import inference_pb2 as pb
    from service.grpc import inference_pb2_grpc as pb_grpc

    request = pb.ModelInferRequest(model_name=MLP)
    request.inputs.add(name="data", datatype=datatype_of(inputs.dtype), shape=inputs.shape)
    request.raw_input_contents.append(np.ascontiguousarray(inputs).tobytes())
    with grpc.insecure_channel(address) as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    (output,) = response.outputs
    assert output.datatype == datatype_of(expected.dtype), output
    values = np.frombuffer(response.raw_output_contents[0], expected.dtype)
    assert_close(values.reshape(tuple(output.shape)), expected, TOLERANCE, "gRPC through nginx")


def _outputs(response: httpx.Response) -> np.ndarray:
    """The one output of a /predict or V2 infer answer."""
    body = response.json()
    if isinstance(body["outputs"], dict):
        (values,) = body["outputs"].values()
        return np.asarray(values)
    (tensor,) = body["outputs"]
    return np.asarray(tensor["data"]).reshape(tensor["shape"])


def _check_serves(client: httpx.Client, url: str, where: str) -> None:
    inputs, (expected,) = model_io_sets(MLP)[-1]
    for call in (_predict, _infer_v2):
        response = call(client, url, inputs["data"])
        assert response.status_code == 200, f"{where} {call.__name__}: {response.text}"
        assert_close(_outputs(response), expected, TOLERANCE, f"{where} {call.__name__}")


def _serves_within(client: httpx.Client, url: str, inputs: np.ndarray, since: float,
                   limit_s: float) -> float:
    """Seconds from `since` until `url` answers a prediction; fail after `limit_s`."""
    last = ""
    while True:
        response = _predict(client, url, inputs)
        elapsed = time.monotonic() - since
        if response.status_code == 200:
            return elapsed
        last = f"{response.status_code} {response.text[:300]}"
        if elapsed > limit_s:
            raise AssertionError(f"{url} does not serve {MLP} {limit_s:.1f} s after the "
                                 f"upload through nginx; last answer: {last}")
        time.sleep(0.02)


@dataclass
class Load:
    """A bounded load through nginx: counts, failures, and an event set at KILL_AFTER."""

    url: str
    inputs: np.ndarray
    expected: np.ndarray
    done: int = 0
    failures: list[str] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)
    halfway: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def worker(self, count: int) -> None:
        """Send `count` requests, alternating /predict and V2 infer, checking every answer.

        A response whose body the kill cut off is sent again, as a client retries an
        idempotent inference: nginx retries a request on another replica only until the
        replica's first bytes reach the client (uvicorn writes the headers and the body
        separately), so a kill between the two leaves that one response cut short. Each such
        cut is counted in `cut`; at most one request per thread is in flight at the kill."""
        with httpx.Client(timeout=30) as client:
            for index in range(count):
                call = _predict if index % 2 == 0 else _infer_v2
                try:
                    try:
                        response = call(client, self.url, self.inputs)
                    except httpx.RemoteProtocolError as error:
                        with self.lock:
                            self.cut.append(f"{call.__name__}: {error}")
                        response = call(client, self.url, self.inputs)
                    problem = "" if response.status_code == 200 else (
                        f"{call.__name__}: {response.status_code} {response.text[:200]}")
                    if not problem:
                        assert_close(_outputs(response), self.expected, TOLERANCE,
                                     call.__name__)
                except (httpx.HTTPError, AssertionError, ValueError, KeyError) as error:
                    problem = f"{call.__name__}: {type(error).__name__}: {error}"
                with self.lock:
                    self.done += 1
                    if problem:
                        self.failures.append(problem)
                    if self.done >= KILL_AFTER:
                        self.halfway.set()


def test_replicas_behind_nginx(nginx_binary: str, repository: Path,
                               replicas: tuple[list[Server], ExitStack], nginx: Nginx,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    servers, stack = replicas
    (inputs, (expected,)), (batch, (batch_expected,)) = model_io_sets(MLP)[:2]
    client = stack.enter_context(httpx.Client(timeout=30))

    # Upload through nginx: one replica writes the shared repository, the others poll it.
    symbol, params = files_for(MLP)
    files = {"symbol": ("symbol.json", symbol), "params": ("model.params", params),
             "config": ("config.json", json.dumps(config_for(MLP)).encode())}
    response = client.post(f"{nginx.url}/models/{MLP}", files=files, headers=AUTH)
    uploaded = time.monotonic()
    assert response.status_code == 201, response.text
    latencies = [_serves_within(client, server.url, inputs["data"], uploaded, CONVERGE_LIMIT_S)
                 for server in servers]
    print(f"replicas serve {MLP} {', '.join(f'{s:.2f}' for s in latencies)} s after upload")
    for server in servers:
        _check_serves(client, server.url, f"replica {server.url}")
    _check_serves(client, nginx.url, "through nginx")
    _check_serves_grpc(nginx.grpc, inputs["data"], expected)

    # kill -9 one replica while a bounded load runs through nginx: no request may fail.
    load = Load(nginx.url, batch["data"], batch_expected)
    per_thread = LOAD_REQUESTS // LOAD_THREADS
    threads = [threading.Thread(target=load.worker, args=(per_thread,), daemon=True)
               for _ in range(LOAD_THREADS)]
    for thread in threads:
        thread.start()
    victim = servers[1]
    victim_port = int(victim.url.rsplit(":", 1)[1])
    assert load.halfway.wait(60), f"the load did not reach {KILL_AFTER} requests"
    victim.process.send_signal(signal.SIGKILL)
    killed_at = load.done
    victim.process.wait(10)
    for thread in threads:
        thread.join(90)
    assert not any(thread.is_alive() for thread in threads), "the load did not finish"
    assert load.done == per_thread * LOAD_THREADS and killed_at < load.done, (
        f"the kill came after {killed_at} of {load.done} requests, not during the load")
    assert load.failures == [], f"{len(load.failures)} failed: {load.failures[:5]}"
    assert len(load.cut) <= LOAD_THREADS, f"more responses cut than were in flight: {load.cut}"
    victim_address = f"127.0.0.1:{victim_port}"
    retried = [addresses for addresses, status in nginx.upstreams()
               if "," in addresses and victim_address in addresses.split(",")[0]]
    assert retried, "no request was retried away from the killed replica"

    # Restart it on the same port: it serves the model from the shared repository again.
    monkeypatch.setattr(server_module, "free_port", lambda: victim_port)
    restarted = stack.enter_context(running_server(
        repository, ["--poll-interval", str(POLL_S)]))
    monkeypatch.undo()
    assert restarted.url == victim.url
    _check_serves(client, restarted.url, "restarted replica")

    # nginx sends it traffic again once the upstream's fail_timeout has passed.
    logged = len(nginx.upstreams())
    rejoin_limit_s = nginx.fail_timeout_s + REJOIN_SLACK_S
    deadline = time.monotonic() + rejoin_limit_s
    while time.monotonic() < deadline:
        response = _predict(client, nginx.url, inputs["data"])
        assert response.status_code == 200, response.text
        if any(addresses == victim_address and status == 200
               for addresses, status in nginx.upstreams()[logged:]):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"nginx did not route to the restarted replica {victim_address} "
                             f"within {rejoin_limit_s:.0f} s")
