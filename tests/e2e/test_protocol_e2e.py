"""End to end, on a real uvicorn process: compressed requests and responses through
tritonclient for every conformance model, a gzip bomb, and clients that send their body slowly.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from engine.serving.config import datatype_of
from tests.conformance.fixtures import assert_close, model_io_sets, model_meta, model_names
from tests.e2e.server import TOKEN, Server, running_server
from tests.service.helpers import config_for, files_for

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TOLERANCE = {"rtol": 1e-3, "atol": 1e-5}  # RNN models need 1e-3 (see tests/conformance)
LIMIT = 16 << 20  # max_request_bytes of these servers: the bomb's RSS bound is above it
BODY_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("protocol") / "repository"
    extra = ["--max-request-bytes", str(LIMIT), "--body-timeout", str(BODY_TIMEOUT_S)]
    with running_server(root, extra) as running:
        with httpx.Client(base_url=running.url, timeout=30) as client:
            for name in model_names():
                symbol, params = files_for(name)
                files = {"symbol": ("s.json", symbol), "params": ("p.params", params),
                         "config": ("config.json", json.dumps(config_for(name)).encode())}
                response = client.post(f"/models/{name}", files=files, headers=AUTH)
                assert response.status_code == 201, response.text
        yield running


def _matching_sets(name: str) -> list[tuple[dict[str, np.ndarray], list[np.ndarray]]]:
    """io sets whose input dtypes are the model's (text_lstm's float tokens are not)."""
    declared = {spec["name"]: spec["dtype"] for spec in model_meta(name)["inputs"]}
    return [(inputs, expected) for inputs, expected in model_io_sets(name)
            if all(str(array.dtype) == declared[key] for key, array in inputs.items())]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("name", model_names())
def test_tritonclient_with_compression_gets_mxnets_outputs(server: Server, name: str,
                                                           algorithm: str) -> None:
    import tritonclient.http as triton

    with triton.InferenceServerClient(server.url.removeprefix("http://")) as client:
        outputs = [tensor["name"] for tensor in client.get_model_metadata(name)["outputs"]]
        sets = _matching_sets(name)
        assert sets, name
        for inputs, expected in sets:
            for binary in (False, True):
                tensors = []
                for key, array in inputs.items():
                    tensor = triton.InferInput(key, list(array.shape), datatype_of(array.dtype))
                    tensor.set_data_from_numpy(array, binary_data=binary)
                    tensors.append(tensor)
                requested = [triton.InferRequestedOutput(output, binary_data=binary)
                             for output in outputs]
                result = client.infer(name, tensors, outputs=requested,
                                      request_compression_algorithm=algorithm,
                                      response_compression_algorithm=algorithm)
                for output, reference in zip(outputs, expected):
                    assert_close(result.as_numpy(output), reference, TOLERANCE,
                                 f"{name} {algorithm} binary={binary}")


def test_compressed_responses_reach_tritonclient(server: Server) -> None:
    """A response large enough to be compressed (32 rows of concurrent_cnn as JSON)."""
    import tritonclient.http as triton

    rows = np.random.default_rng(5).standard_normal((32, 3, 15, 15)).astype(np.float32)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        plain = http.post("/v2/models/concurrent_cnn/infer", headers={
            "Accept-Encoding": "identity"}, json={"inputs": [{
                "name": "data", "datatype": "FP32", "shape": list(rows.shape),
                "data": rows.ravel().tolist()}]})
    reference = np.asarray(plain.json()["outputs"][0]["data"], np.float32).reshape(32, 5)
    with triton.InferenceServerClient(server.url.removeprefix("http://")) as client:
        for algorithm in ("gzip", "deflate"):
            tensor = triton.InferInput("data", list(rows.shape), "FP32")
            tensor.set_data_from_numpy(rows, binary_data=False)
            result = client.infer("concurrent_cnn", [tensor],
                                  response_compression_algorithm=algorithm)
            np.testing.assert_allclose(result.as_numpy(result.get_response()["outputs"][0][
                "name"]), reference, rtol=1e-6)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for algorithm in ("gzip", "deflate"):
            asked = http.post("/v2/models/concurrent_cnn/infer", headers={
                "Accept-Encoding": algorithm}, json={"inputs": [{
                    "name": "data", "datatype": "FP32", "shape": list(rows.shape),
                    "data": rows.ravel().tolist()}]})
            assert asked.headers["content-encoding"] == algorithm
            assert asked.json() == plain.json()


# ----- the gzip bomb ------------------------------------------------------------------------

def gzip_of_zeros(total: int, chunk: int = 1 << 20) -> Iterator[bytes]:
    """A gzip stream of `total` zero bytes, compressed as it is sent. After a full flush a
    compressor forgets what came before, so each further megabyte compresses to the same
    bytes: compressed once, sent `total / chunk` times (the trailer's CRC is computed)."""
    zeros = bytes(chunk)
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    yield compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    block = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    crc = zlib.crc32(zeros, zlib.crc32(zeros))
    for _ in range(total // chunk - 2):
        crc = zlib.crc32(zeros, crc)
        yield block
    yield block + compressor.flush()[:-8] + crc.to_bytes(4, "little") + (
        total % (1 << 32)).to_bytes(4, "little")


def _memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_a_gzip_bomb_is_413_with_bounded_memory(tmp_path: Path) -> None:
    """1 GiB of zeros in 1 MB of gzip: refused once 16 MiB are inflated; the peak RSS grows
    by less than 64 MB."""
    extra = ["--max-request-bytes", str(LIMIT)]
    with running_server(tmp_path / "repository", extra) as bombed:
        symbol, params = files_for("seed_mlp")
        with httpx.Client(base_url=bombed.url, timeout=120) as http:
            files = {"symbol": ("s", symbol), "params": ("p", params),
                     "config": ("c", json.dumps(config_for("seed_mlp")).encode())}
            assert http.post("/models/seed_mlp", files=files, headers=AUTH).status_code == 201
            pid = bombed.process.pid
            before = _memory_kib(pid, "VmRSS")
            for url in ("/v2/models/seed_mlp/infer", "/predict"):
                response = http.post(url, content=gzip_of_zeros(1 << 30),
                                     headers={"Content-Encoding": "gzip"})
                assert response.status_code == 413, response.text
                assert "once decompressed" in response.json()["error"]
            growth = (_memory_kib(pid, "VmHWM") - before) * 1024
            assert growth < 64 << 20, f"peak RSS grew by {growth / 2**20:.1f} MiB"
            assert http.get("/v2/health/live").status_code == 200


# ----- slow clients ---------------------------------------------------------------------------

def _trickle(server: Server, path: str, stop: threading.Event) -> bytes:
    """Send a request head, then its 200-byte body one byte each 0.1 s; the reply. An upload's
    body starts as a well-formed form, so that only its pace is wrong."""
    body = b" " * 200
    if path.startswith("/models/"):
        body = (b'--b\r\nContent-Disposition: form-data; name="symbol"; filename="s"\r\n\r\n'
                + body)[:200]
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        kind = ("multipart/form-data; boundary=b" if path.startswith("/models/")
                else "application/json")
        connection.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n"
                           f"Content-Type: {kind}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
                           .encode())
        connection.settimeout(0.1)
        reply = b""
        for index in range(200):
            if stop.is_set():
                break
            try:
                connection.sendall(body[index:index + 1])
                reply += connection.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
            if reply:
                break
        connection.settimeout(5)
        try:
            while b"\r\n\r\n" not in reply:
                chunk = connection.recv(4096)
                if not chunk:
                    break
                reply += chunk
        except OSError:
            pass
        return reply


@pytest.mark.parametrize("path", ["/v2/models/seed_mlp/infer", "/predict",
                                  "/v2/repository/index", "/models/slow"])
def test_a_slow_body_is_408_and_others_are_served_meanwhile(server: Server, path: str) -> None:
    stop = threading.Event()
    replies: list[bytes] = []
    started = time.monotonic()
    sender = threading.Thread(target=lambda: replies.append(_trickle(server, path, stop)))
    sender.start()
    try:
        with httpx.Client(base_url=server.url, timeout=5) as http:
            slowest = 0.0
            while sender.is_alive() and time.monotonic() - started < 8:
                before = time.monotonic()
                assert http.get("/v2/health/live").status_code == 200
                slowest = max(slowest, time.monotonic() - before)
                time.sleep(0.05)
    finally:
        stop.set()
        sender.join(15)
    elapsed = time.monotonic() - started
    assert replies and replies[0].startswith(b"HTTP/1.1 408"), replies
    assert elapsed < BODY_TIMEOUT_S + 4, elapsed
    assert slowest < 0.5, f"a health probe took {slowest:.2f} s while a body trickled in"
