"""End to end: priorities and queue policies in a real server process, over REST
(tritonclient.http) and gRPC (tritonclient.grpc, in a process of its own: its generated
messages and the server's share names, and one process cannot register both), with Triton's
``priority`` and ``timeout`` request parameters. A fully convolutional model fed 128x128
images takes milliseconds a request, one request a batch, so a steady load of low-priority
requests keeps its queue full: high-priority requests overtake it (their p99 at most a third
of the low ones'), and a REJECT level answers what waits past its timeout with 503 /
UNAVAILABLE naming the queue."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.server import TOKEN, Server, running_server
from tests.service.helpers import files_for

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MODEL = "resblock"  # conv stem, residual blocks, global pooling: any image size runs
IMAGE = np.random.default_rng(0).random((1, 3, 128, 128), dtype=np.float32)
LOW_CLIENTS = 32
HIGH_REQUESTS = 25


def _config(**batching: Any) -> bytes:
    return json.dumps({"inputs": [{"name": "data", "datatype": "FP32",
                                   "shape": [-1, 3, -1, -1]}],
                       "max_batch_size": 1, "dynamic_batching": batching}).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("priorities") / "repository"
    symbol, params = files_for(MODEL)
    configs = {
        # Two levels, neither with a timeout: only the order differs.
        "ordered": _config(priority_levels=2, default_priority_level=2),
        # Level 2 rejects a request still queued after 1 ms.
        "rejecting": _config(priority_levels=2, default_priority_level=2,
                             priority_queue_policy={"2": {
                                 "timeout_action": "REJECT",
                                 "default_timeout_microseconds": 1000}}),
    }
    with running_server(root) as running, httpx.Client(base_url=running.url,
                                                       timeout=120) as http:
        for name, config in configs.items():
            response = http.post(f"/models/{name}", headers=AUTH, files={
                "symbol": ("s.json", symbol), "params": ("p.params", params),
                "config": ("config.json", config)})
            assert response.status_code == 201, response.text
        yield running


def _http_infer(address: str) -> Callable[..., None]:
    import tritonclient.http as triton

    def infer(model: str, priority: int, timeout: int | None = None) -> None:
        # A client per request, closed by the thread that made it: the HTTP client's gevent
        # pool cannot be closed from another thread, and one left to the garbage collector
        # raises in whichever thread collects it (failing a later test).
        with triton.InferenceServerClient(address) as client:
            tensor = triton.InferInput("data", list(IMAGE.shape), "FP32")
            tensor.set_data_from_numpy(IMAGE, binary_data=True)
            client.infer(model, [tensor], priority=priority, timeout=timeout)

    return infer


def _grpc_infer(address: str) -> Callable[..., None]:
    import tritonclient.grpc as triton

    local = threading.local()

    def infer(model: str, priority: int, timeout: int | None = None) -> None:
        if not hasattr(local, "client"):
            local.client = triton.InferenceServerClient(address)
        tensor = triton.InferInput("data", list(IMAGE.shape), "FP32")
        tensor.set_data_from_numpy(IMAGE)
        local.client.infer(model, [tensor], priority=priority, timeout=timeout)

    return infer


def _timed(call: Callable[[], None]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _overtake(infer: Callable[..., None]) -> dict[str, list[float]]:
    """Seconds per high- and low-priority request while low-priority clients fill the queue."""
    infer("ordered", 1)  # connections and the model's first run out of the measurement
    done = threading.Event()
    low: list[float] = []

    def low_client() -> None:
        while not done.is_set():
            low.append(_timed(lambda: infer("ordered", 2)))

    with ThreadPoolExecutor(LOW_CLIENTS) as pool:
        clients = [pool.submit(low_client) for _ in range(LOW_CLIENTS)]
        while len(low) < 2 * LOW_CLIENTS:  # the low clients' queue has formed
            assert not any(client.done() for client in clients), clients[0].result()
            time.sleep(0.01)
        low.clear()
        try:
            high = [_timed(lambda: infer("ordered", 1)) for _ in range(HIGH_REQUESTS)]
            while len(low) < LOW_CLIENTS:  # low requests that waited beside the high ones
                time.sleep(0.01)
        finally:
            done.set()
        for client in clients:
            client.result()
    return {"high": high, "low": list(low)}


def _rejects(infer: Callable[..., None]) -> dict[str, list[str]]:
    """Answers of 32 requests, eight at a time, at level 2 (REJECT after 1 ms) and level 1."""
    from tritonclient.utils import InferenceServerException

    infer("rejecting", 1)

    def attempt(priority: int) -> str:
        try:
            infer("rejecting", priority)
        except InferenceServerException as error:
            return f"{error.status()}: {error.message()}"
        return "ok"

    with ThreadPoolExecutor(8) as pool:
        level_2 = list(pool.map(attempt, [2] * 32))
    with ThreadPoolExecutor(8) as pool:
        level_1 = list(pool.map(attempt, [1] * 32))
    return {"level 2": level_2, "level 1": level_1}


SCENARIOS: dict[str, Callable[[Callable[..., None]], Any]] = {
    "overtake": _overtake, "rejects": _rejects}


def _scenario(name: str, server: Server, protocol: str) -> Any:
    """`name`'s results over `protocol`: REST here, gRPC in a process of its own."""
    if protocol == "rest":
        return SCENARIOS[name](_http_infer(server.url.removeprefix("http://")))
    done = subprocess.run([sys.executable, "-m", "tests.e2e.test_priorities_e2e", name,
                           server.grpc], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_high_priority_overtakes_a_queue_of_low_priority(server: Server, protocol: str) -> None:
    timed = _scenario("overtake", server, protocol)
    high_p99, low_p99 = np.percentile(timed["high"], 99), np.percentile(timed["low"], 99)
    print(f"{protocol}: high p99 {high_p99 * 1e3:.1f} ms, low p99 {low_p99 * 1e3:.1f} ms "
          f"({len(timed['low'])} low requests)")
    assert high_p99 <= low_p99 / 3, (high_p99, low_p99)


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_reject_answers_what_waited_past_the_levels_timeout(server: Server,
                                                           protocol: str) -> None:
    answers = _scenario("rejects", server, protocol)
    rejected = [answer for answer in answers["level 2"] if answer != "ok"]
    # Eight at once, each run ~ms: most of them wait more than 1 ms.
    assert rejected, answers["level 2"]
    status = "503" if protocol == "rest" else "StatusCode.UNAVAILABLE"
    for answer in rejected:
        assert answer.startswith(status), answer
        assert "rejecting" in answer and "priority level 2 queue" in answer, answer
    # Level 1 has no timeout: the same load there is all answered.
    assert set(answers["level 1"]) == {"ok"}


if __name__ == "__main__":  # python -m tests.e2e.test_priorities_e2e SCENARIO GRPC_ADDRESS
    print(json.dumps(SCENARIOS[sys.argv[1]](_grpc_infer(sys.argv[2]))))
