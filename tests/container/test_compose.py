"""docker-compose.yml on a real Docker engine: built, healthy, non-root, and lossless under churn.

Run with `make container-test`. Traffic goes only to nginx on 127.0.0.1; a single replica is
reached from inside its own container (`docker exec`, its loopback).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import httpx
import numpy as np
import pytest
from sklearn.datasets import load_digits

from engine.serving.repository import ModelRepository
from tests.conformance.fixtures import assert_close, model_io_sets
from tests.container.compose import ROOT, Project
from tests.container.load import LoadResult, PacedLoad
from tests.deploy.helpers import NGINX_CONF
from tests.service.helpers import MLP, config_for, files_for

pytestmark = pytest.mark.container
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
SERVER_UID = "10001"
REPLICAS = 3
UPLOADED = "uploaded_mlp"
CONVERGE_LIMIT_S = 30.0  # poll interval 1 s here, plus reading and planning the model
ROUNDS = 5
REQUESTS_PER_ROUND = 200
DISRUPT_AFTER = 30  # requests completed before the replica goes
RESTART_LIMIT_S = 90.0

# Runs inside a replica: POST stdin's JSON body to its own /predict, print status and body.
PREDICT_IN_CONTAINER = """
import json, sys, urllib.error, urllib.request
request = urllib.request.Request("http://127.0.0.1:8000/predict", data=sys.stdin.read().encode(),
                                 headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(request, timeout=30) as response:
        print(json.dumps({"status": response.status, "body": json.load(response)}))
except urllib.error.HTTPError as error:
    print(json.dumps({"status": error.code, "body": error.read().decode()}))
"""


@pytest.fixture(scope="module")
def nginx_url(project: Project) -> str:
    """nginx's published address (loopback)."""
    return f"http://127.0.0.1:{project.env['HYBRIDSERVE_HTTP_PORT']}"


def only_output(body: dict[str, Any]) -> np.ndarray:
    """The single output tensor of a /predict answer."""
    (values,) = body["outputs"].values()
    return np.asarray(values)


def engine_digits(images: np.ndarray) -> np.ndarray:
    """What the engine in this checkout computes for `images` with models/digits."""
    async def infer() -> np.ndarray:
        repository = ModelRepository(ROOT / "models")
        await repository.start()
        try:
            (scores,) = (await repository.infer("digits", {"data": images})).values()
        finally:
            await repository.close()
        return np.asarray(scores)
    return asyncio.run(infer())


def test_replicas_are_healthy_and_run_unprivileged(project: Project) -> None:
    servers = project.containers("server")
    assert len(servers) == REPLICAS, servers
    for name in [*servers, *project.containers("nginx")]:
        state = project.inspect(name)["State"]
        assert state["Running"] and state["Health"]["Status"] == "healthy", (name, state)
    for name in servers:
        assert project.inspect(name)["Config"]["User"] == f"{SERVER_UID}:{SERVER_UID}", name
        status = project.docker("exec", name, "cat", "/proc/1/status").stdout
        uids = re.search(r"^Uid:\s+(.+)$", status, flags=re.MULTILINE)
        assert uids is not None and set(uids.group(1).split()) == {SERVER_UID}, (name, status)


def test_the_image_traces_when_its_environment_asks(project: Project) -> None:
    # The image carries the `tracing` extra: the server's OTLP/HTTP tracing builds in it.
    code = ("from service.tracing import from_environment\n"
            "tracing = from_environment(False, {'OTEL_TRACES_EXPORTER': 'otlp', "
            "'OTEL_EXPORTER_OTLP_ENDPOINT': 'http://127.0.0.1:4318'})\n"
            "print(type(tracing).__name__)\n"
            "tracing.shutdown()\n")
    server = project.containers("server")[0]
    assert project.exec_python(server, code).strip() == "OpenTelemetryTracing"


def test_nginx_is_published_on_loopback_only(project: Project) -> None:
    port = project.env["HYBRIDSERVE_HTTP_PORT"]
    assert project.published("nginx", 80) == f"127.0.0.1:{port}"
    (binding,) = project.inspect(project.containers("nginx")[0])["HostConfig"]["PortBindings"][
        "80/tcp"]
    assert binding == {"HostIp": "127.0.0.1", "HostPort": port}


def test_predict_through_nginx_matches_the_engine(nginx_url: str) -> None:
    data = load_digits()
    images = data.data[:32].astype(np.float32)
    response = httpx.post(f"{nginx_url}/predict", timeout=60,
                          json={"model": "digits", "inputs": {"data": images.tolist()}})
    assert response.status_code == 200, response.text
    scores = only_output(response.json())
    assert_close(scores, engine_digits(images), TOLERANCE, "digits through nginx")
    assert (scores.argmax(axis=1) == data.target[:32]).mean() > 0.9


def predict_in(project: Project, container: str, body: dict[str, Any]) -> tuple[int, Any]:
    """(status, body) of a /predict sent by the replica in `container` to itself."""
    answer = json.loads(project.exec_python(container, PREDICT_IN_CONTAINER, json.dumps(body)))
    return answer["status"], answer["body"]


def wait_served(project: Project, container: str, body: dict[str, Any]) -> Any:
    """The replica's answer once it serves the uploaded model; fail after CONVERGE_LIMIT_S."""
    start = time.monotonic()
    while True:
        status, answer = predict_in(project, container, body)
        if status == 200:
            return answer
        if time.monotonic() - start > CONVERGE_LIMIT_S:
            raise AssertionError(f"{container} does not serve {UPLOADED} {CONVERGE_LIMIT_S} s "
                                 f"after the upload: {status} {answer}")
        time.sleep(0.5)


def test_an_upload_to_one_replica_is_served_by_all(project: Project, nginx_url: str) -> None:
    symbol, params = files_for(MLP)
    files = {"symbol": ("symbol.json", symbol), "params": ("model.params", params),
             "config": ("config.json", json.dumps(config_for(MLP)).encode())}
    url = f"{nginx_url}/models/{UPLOADED}"
    refused = httpx.post(url, files=files, timeout=60)
    assert refused.status_code == 401, refused.text
    token = project.env["HYBRIDSERVE_ADMIN_TOKEN"]
    response = httpx.post(url, files=files, timeout=60,
                          headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 201, response.text  # one replica wrote it (no retry: a POST)
    inputs, (expected,) = model_io_sets(MLP)[0]
    body = {"model": UPLOADED, "inputs": {"data": inputs["data"].tolist()}}
    for container in project.containers("server"):
        answer = wait_served(project, container, body)
        assert_close(only_output(answer), expected, TOLERANCE, f"{UPLOADED} on {container}")


def resolver_valid_s() -> float:
    """How long nginx trusts a resolved replica list (`resolver ... valid=Ns`)."""
    found = re.search(r"^\s*resolver \S+ valid=(\d+)s", NGINX_CONF.read_text(), flags=re.M)
    assert found is not None, "nginx.conf: expected `resolver ADDRESS valid=<N>s`"
    return float(found.group(1))


def digits_load(nginx_url: str) -> PacedLoad:
    """REQUESTS_PER_ROUND predictions of one digit through nginx, each checked."""
    image = load_digits().data[:1].astype(np.float32)
    expected = engine_digits(image)

    def correct(body: dict[str, Any]) -> bool:
        scores = only_output(body)
        return scores.shape == expected.shape and bool(np.allclose(scores, expected, **TOLERANCE))

    body = {"model": "digits", "inputs": {"data": image.tolist()}}
    return PacedLoad(f"{nginx_url}/predict", body, correct, total=REQUESTS_PER_ROUND, pause_s=0.3)


def disruption_round(project: Project, nginx_url: str, action: str, victim: str
                     ) -> tuple[LoadResult, float]:
    """A load run during which `docker ACTION victim` happens, then the victim started again.

    Returns the load's result and how many seconds of it ran after the victim had gone.
    """
    gone_at: list[float] = []

    def disrupt() -> None:
        project.docker(action, victim, timeout=60)
        assert not project.inspect(victim)["State"]["Running"], f"{victim} still runs"
        gone_at.append(time.monotonic())

    started = time.monotonic()
    result = digits_load(nginx_url).run(DISRUPT_AFTER, disrupt)
    return result, started + result.seconds - gone_at[0]


@pytest.mark.parametrize("action", ["stop", "kill"])
def test_losing_a_replica_under_load_loses_no_request(project: Project, nginx_url: str,
                                                      run_log: list[str], action: str) -> None:
    """`docker stop` (drain, then exit) or `docker kill` one replica while requests flow."""
    servers = project.containers("server")
    valid_s = resolver_valid_s()
    lines, lost = [], []
    for round_number in range(ROUNDS):
        victim = servers[round_number % len(servers)]
        result, after_s = disruption_round(project, nginx_url, action, victim)
        project.docker("start", victim)
        restart_s = project.wait_ready(victim, RESTART_LIMIT_S)
        lines.append(f"docker {action} #{round_number + 1} ({victim}): {result.lost_count} of "
                     f"{result.sent} lost {dict(result.outcomes)}; load {result.seconds:.1f} s, "
                     f"{after_s:.1f} s of it after the replica was gone; ready again "
                     f"{restart_s:.1f} s after start")
        run_log.append(lines[-1])
        lost += result.lost
        assert after_s > valid_s, (
            f"the load ended {after_s:.1f} s after the replica went, before nginx's resolver "
            f"(valid={valid_s:.0f}s) had to drop it; lengthen the load")
    assert lost == [], "\n".join(lines + lost)
