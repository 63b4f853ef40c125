"""Triton's own tools against a real server process: perf_analyzer over HTTP (binary and JSON
tensors) and gRPC (unary and streaming), and tritonclient's model configuration and stream.

perf_analyzer reads the model's configuration before its first request and stops without it;
tritonclient.grpc runs in its own process (see `tests.e2e.grpc_clients`).
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conformance.fixtures import DEFAULT_TOLERANCE, assert_close, model_meta
from tests.e2e import perf_analyzer
from tests.e2e.grpc_clients import matching_sets
from tests.e2e.server import ROOT, TOKEN, Server, running_server
from tests.service.helpers import config_for, files_for

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MODELS = ("seed_mlp", "multi_io")
MAX_BATCH_SIZE = 16
REQUESTS = 64
OUTCOMES = re.compile(
    r'^hybridserve_requests_total\{model="seed_mlp",outcome="(success|failure)",version="1"\} '
    r"(\S+)$", re.MULTILINE)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("triton-tools") / "repository"
    with running_server(root) as running, httpx.Client(timeout=120) as http:
        for name in MODELS:
            symbol, params = files_for(name)
            config = {**config_for(name), "max_batch_size": MAX_BATCH_SIZE,
                      "dynamic_batching": {"max_queue_delay_us": 200,
                                           "preferred_batch_sizes": [4, MAX_BATCH_SIZE]}}
            files = {"symbol": ("s.json", symbol), "params": ("p.params", params),
                     "config": ("config.json", json.dumps(config).encode())}
            response = http.post(f"{running.url}/models/{name}", files=files, headers=AUTH)
            assert response.status_code == 201, response.text
        yield running


@pytest.fixture(scope="module")
def perf_analyzer_argv() -> list[str]:
    try:
        return perf_analyzer.command()
    except perf_analyzer.Unavailable as error:
        pytest.skip(f"perf_analyzer cannot run on this machine: {error}")


def _outcomes(server: Server) -> dict[str, float]:
    """seed_mlp's requests counted by the server, by outcome."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    counted = {outcome: float(count) for outcome, count in OUTCOMES.findall(text)}
    return {outcome: counted.get(outcome, 0.0) for outcome in ("success", "failure")}


@pytest.mark.parametrize(("protocol", "options"), [
    ("http", []),
    ("http", ["-b", "4"]),
    # perf_analyzer's random bytes include NaN and infinities, which JSON carries as bare
    # NaN / Infinity literals, as Triton reads them.
    ("http", ["--input-tensor-format", "json", "--output-tensor-format", "json"]),
    ("grpc", []),
    ("grpc", ["--streaming"]),
], ids=["http-binary", "http-binary-batch4", "http-json", "grpc", "grpc-streaming"])
def test_perf_analyzer_measures_the_server(server: Server, perf_analyzer_argv: list[str],
                                           tmp_path: Path, protocol: str,
                                           options: list[str]) -> None:
    """perf_analyzer gets the config and metadata, sends its requests, and every one of them
    succeeds on the server."""
    where = server.url.removeprefix("http://") if protocol == "http" else server.grpc
    report = tmp_path / "report.csv"
    before = _outcomes(server)
    done = subprocess.run(
        [*perf_analyzer_argv, "-m", "seed_mlp", "-i", protocol, "-u", where,
         "--concurrency-range", "4", "--request-count", str(REQUESTS), "-f", str(report),
         *options], capture_output=True, text=True, timeout=300)
    said = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, said
    with report.open() as rows:
        (row,) = list(csv.DictReader(rows))
    assert row["Concurrency"] == "4" and float(row["Inferences/Second"]) > 0, said
    after = _outcomes(server)
    assert after["failure"] == before["failure"], said
    assert after["success"] - before["success"] >= REQUESTS, said


def test_tritonclient_http_reads_the_model_config(server: Server) -> None:
    import tritonclient.http as triton

    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        config = client.get_model_config("seed_mlp")
        versioned = client.get_model_config("seed_mlp", "1")
    finally:
        client.close()
    assert versioned == config
    _check_seed_mlp_config(config)


def _check_seed_mlp_config(config: dict) -> None:
    """(gRPC's config as JSON writes its 64-bit integers as strings, as protobuf does.)"""
    (spec,) = model_meta("seed_mlp")["inputs"]
    assert config["name"] == "seed_mlp"
    assert config["max_batch_size"] == MAX_BATCH_SIZE
    (tensor,) = config["input"]
    assert (tensor["name"], tensor["data_type"]) == (spec["name"], "TYPE_FP32")
    assert [int(dim) for dim in tensor["dims"]] == spec["shape"][1:]
    (output,) = config["output"]
    assert output["data_type"] == "TYPE_FP32" and [int(d) for d in output["dims"]] == [2]
    batching = config["dynamic_batching"]
    assert batching["preferred_batch_size"] == [4, MAX_BATCH_SIZE]
    assert int(batching["max_queue_delay_microseconds"]) == 200
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert config["instance_group"][0]["kind"] == "KIND_CPU"


def test_tritonclient_grpc_config_and_stream(server: Server, tmp_path: Path) -> None:
    """gRPC's ModelConfig as tritonclient decodes it, and one stream with every io set of two
    models and a failing request: each answer comes back under its request's id, the failure
    as an error, and the stream carries on."""
    done = subprocess.run([sys.executable, "-m", "tests.e2e.grpc_clients", "triton-stream",
                           server.grpc, str(tmp_path), *MODELS], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads((tmp_path / "answers.json").read_text())
    with np.load(tmp_path / "outputs.npz") as data:
        arrays = {key: data[key] for key in data.files}
    _check_seed_mlp_config(answers["seed_mlp/config"])
    assert [tensor["name"] for tensor in answers["multi_io/config"]["input"]] == [
        spec["name"] for spec in model_meta("multi_io")["inputs"]]

    expected_ids = [f"{name}/{index}" for name in MODELS
                    for index in range(len(matching_sets(name)))]
    assert sorted(answers["stream/ids"]) == sorted(expected_ids)
    (error,) = answers["stream/errors"]
    assert "no_such_input" in error
    for name in MODELS:
        outputs = [tensor["name"] for tensor in answers[f"{name}/config"]["output"]]
        tolerance = model_meta(name).get("tolerance", DEFAULT_TOLERANCE)
        for index, (_, expected) in enumerate(matching_sets(name)):
            for output, want in zip(outputs, expected, strict=True):
                key = f"{name}/{index}/{output}"
                assert_close(arrays[key], want, tolerance, key)
