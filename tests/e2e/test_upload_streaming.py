"""End to end: an upload never stalls other requests, and its body is never held in memory."""

from __future__ import annotations

import gc
import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from engine import nd, sym
from engine.gluon.model_zoo.vision import get_model
from engine.graph.params import save_params
from tests.e2e.server import TOKEN, Server, running_server
from tests.service.helpers import config_for, files_for

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MIB = 1 << 20
PROBE_INTERVAL_S = 0.02  # the client keeps up with this even on a busy machine
IDLE_PROBES_S = 2.0  # the baseline before each upload: 100 probes
UPLOAD_TRIES = 5  # a stall of the event loop's own shows in every one


def _resnet18(directory: Path) -> tuple[Path, Path, dict]:
    """ResNet-18 v1 exported at 64x64 (46 MB of parameters), and a max-batch-32 config."""
    net = get_model("resnet18_v1", classes=1000)
    net.initialize()
    net.hybridize()
    net(nd.zeros((1, 3, 64, 64)))
    net.export(str(directory / "resnet"))
    config = {"max_batch_size": 32, "inputs": [
        {"name": "data", "datatype": "FP32", "shape": [-1, 3, 64, 64]}]}
    return directory / "resnet-symbol.json", directory / "resnet-0000.params", config


def _wide_dense(directory: Path, param_bytes: int) -> tuple[Path, Path, dict]:
    """One FullyConnected layer whose weight alone is `param_bytes` (float32)."""
    width, hidden = 4096, param_bytes // (4096 * 4)
    graph = sym.FullyConnected(sym.var("data"), num_hidden=hidden, no_bias=True, name="fc")
    (directory / "wide-symbol.json").write_text(graph.tojson())
    save_params(directory / "wide-0000.params",
                {"arg:fc_weight": np.zeros((hidden, width), np.float32)})
    config = {"max_batch_size": 4, "inputs": [
        {"name": "data", "datatype": "FP32", "shape": [-1, width]}]}
    return directory / "wide-symbol.json", directory / "wide-0000.params", config


def _multipart(symbol: Path, params: Path, config: dict) -> tuple[str, bytes, bytes, Path]:
    """(content type, head, tail, params path): the body is head + params' bytes + tail."""
    boundary = "hybridserve-e2e-boundary"

    def part(name: str, filename: str) -> bytes:
        return (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; "
                f"filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                ).encode()

    head = (part("symbol", symbol.name) + symbol.read_bytes() + b"\r\n"
            + part("config", "config.json") + json.dumps(config).encode() + b"\r\n"
            + part("params", params.name))
    tail = f"\r\n--{boundary}--\r\n".encode()
    return f"multipart/form-data; boundary={boundary}", head, tail, params


def _rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _reset_peak_rss(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)


def _warm_up(server: Server) -> None:
    """One small upload first: what the first upload imports or allocates once is not counted."""
    symbol, params = files_for("hybridnet")
    response = httpx.post(server.url + "/models/warm", headers=AUTH, timeout=60, files={
        "symbol": ("s.json", symbol), "params": ("p.params", params),
        "config": ("config.json", json.dumps(config_for("hybridnet")).encode())})
    assert response.status_code == 201, response.text


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("streaming") / "repository"
    with running_server(root) as running:
        _warm_up(running)
        yield running


@contextmanager
def _own_collector_paused() -> Iterator[None]:
    """This process's garbage collector off while it probes: a full pass over the test
    process's heap (the ResNet built here, and in a whole run every module's objects) stops
    the probing thread too (0.57 s measured on the busy 2-core VM in a process that had built
    the ResNet), and would read as the server's stall. What probing allocates is freed by
    reference counting."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _probe(server: Server, busy: subprocess.Popen[bytes] | None = None,
           seconds: float = IDLE_PROBES_S) -> np.ndarray:
    """Latencies of /v2/health/live probes due every PROBE_INTERVAL_S while `busy` runs (or
    for `seconds` when there is none).

    Each probe is timed from when it was due: a stalled server then shows in every probe it
    delays, not only in the one it holds up.
    """
    latencies = []
    with _own_collector_paused(), httpx.Client(base_url=server.url, timeout=10) as client:
        due = started = time.perf_counter()
        while busy.poll() is None if busy is not None else due < started + seconds:
            time.sleep(max(0.0, due - time.perf_counter()))
            assert client.get("/v2/health/live").status_code == 200
            latencies.append(time.perf_counter() - due)
            due += PROBE_INTERVAL_S
    return np.array(latencies)


def _upload_with_curl(server: Server, symbol: Path, params: Path,
                      config: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["curl", "-sS", "-X", "POST", server.url + "/models/resnet", "-H",
         f"Authorization: Bearer {TOKEN}", "-F", f"symbol=@{symbol}", "-F", f"params=@{params}",
         "-F", f"config=@{config}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_health_answers_within_50_ms_p99_while_a_resnet_is_uploaded(
        server: Server, tmp_path: Path) -> None:
    symbol, params, config = _resnet18(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config))
    # curl sends the upload, so that this process only probes (its own collector paused). On
    # a quiet machine the probes' p99 stays far under 50 ms; on a busy one (the test machines
    # are shared) other processes delay probes too, so what the upload adds is measured
    # against the p99 of the probes of the two seconds just before it, and the best of up to
    # UPLOAD_TRIES uploads counts (one upload's p99 swung 10-230 ms on the shared 2-core VM at
    # load 3-6). Work on the server's event loop (compiling the batch-32 plan: 0.5 s) adds
    # hundreds of ms to every one; full collections over numba's objects, unfrozen, added
    # 40-100 ms a pass, several an upload.
    added = []
    for _ in range(UPLOAD_TRIES):
        idle = float(np.percentile(_probe(server), 99))
        upload = _upload_with_curl(server, symbol, params, tmp_path / "config.json")
        latencies = _probe(server, upload)
        out, err = upload.communicate()
        created = json.loads(out or err)
        assert created["state"] == "READY", created
        busy = float(np.percentile(latencies, 99))
        added.append((max(0.0, busy - idle), busy, len(latencies)))
        print(f"{len(latencies)} health probes during the upload of version "
              f"{created['version']}: p50 {np.percentile(latencies, 50) * 1e3:.1f} ms, "
              f"p99 {busy * 1e3:.1f} ms (idle just before: {idle * 1e3:.1f} ms), "
              f"max {latencies.max() * 1e3:.1f} ms")
        if min(busy, busy - idle) < 0.050 and len(latencies) >= 20:
            break
    extra, busy, count = min(added)
    assert count >= 20, "too few probes during the upload to measure a p99"
    assert busy < 0.050 or extra < 0.050, f"p99 {busy * 1e3:.1f} ms, {extra * 1e3:.1f} ms over idle"


def test_a_200_mb_upload_grows_the_server_by_less_than_64_mb(server: Server,
                                                              tmp_path: Path) -> None:
    symbol, params, config = _wide_dense(tmp_path, 200 * MIB)
    content_type, head, tail, params_path = _multipart(symbol, params, config)
    pid = server.process.pid
    before = _rss_kib(pid, "VmRSS")
    _reset_peak_rss(pid)
    peaks: dict[str, int] = {}

    def body() -> Iterator[bytes]:
        yield head
        with params_path.open("rb") as stream:
            while chunk := stream.read(MIB):
                yield chunk
        time.sleep(1.0)  # let the server take in and write out every byte sent so far
        peaks["received"] = _rss_kib(pid, "VmHWM")
        yield tail

    response = httpx.post(server.url + "/models/wide", content=body(), timeout=120,
                          headers={**AUTH, "Content-Type": content_type})
    assert response.status_code == 201, response.text
    peak, after = _rss_kib(pid, "VmHWM"), _rss_kib(pid, "VmRSS")
    print(f"RSS before {before // 1024} MiB; peak growth while receiving "
          f"{params_path.stat().st_size // MIB} MiB: {(peaks['received'] - before) // 1024} MiB; "
          f"peak through validation and loading {peak // 1024} MiB, RSS after {after // 1024} MiB")
    assert peaks["received"] - before < 64 * 1024
    size_kib = params_path.stat().st_size // 1024
    # The loaded model keeps one copy of its weights (RSS after). On the way there, loading
    # holds two for a moment (the .params file's arrays and the weight laid out for the
    # product), and the upload must add no more than 64 MB to that: a body read whole would
    # add its 200 MB.
    assert after - before < size_kib + 64 * 1024
    assert peak - before < 2 * size_kib + 64 * 1024
