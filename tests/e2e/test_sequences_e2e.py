"""End to end (#38): the time-major GluonNLP LSTM language model served with
``sequence_batching`` by a real server process; eight sentences fed one token a request as
eight concurrent sequences, over REST (binary and JSON tensors, tritonclient.http) and gRPC
(tritonclient.grpc), answer MXNet's logits for the whole sentences, and the metrics show the
steps of different sequences run in batches of more than one row."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conformance.fixtures import assert_close
from tests.e2e.server import ROOT, TOKEN, Server, running_server
from tests.engine.serving.sequence_lstm import LSTM, TOLERANCE, reference, sequence_config
from tests.service.helpers import files_for

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# Steps of all sequences present (8 of 32 slots) go as one batch, or after 50 ms.
STRATEGY = {"direct": {"max_queue_delay_microseconds": 50_000,
                       "minimum_slot_utilization": 0.25}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("sequences") / "repository"
    with running_server(root) as running, httpx.Client(base_url=running.url,
                                                       timeout=120) as http:
        symbol, params = files_for(LSTM)
        config = json.dumps(sequence_config(**STRATEGY)).encode()
        response = http.post(f"/models/{LSTM}", headers=AUTH, files={
            "symbol": ("s.json", symbol), "params": ("p.params", params),
            "config": ("config.json", config)})
        assert response.status_code == 201, response.text
        yield running


def _batches(server: Server) -> tuple[int, int]:
    """(batches run, batches of one row) from the batch-size histogram of /metrics."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    labels = f'model="{LSTM}",version="1"'
    count = re.search(rf"hybridserve_batch_size_count{{{labels}}} (\S+)", text)
    ones = re.search(rf'hybridserve_batch_size_bucket{{le="1.0",{labels}}} (\S+)', text)
    assert count and ones, text
    return int(float(count.group(1))), int(float(ones.group(1)))


def _sequence_events(server: Server) -> dict[str, int]:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return {event: int(float(value)) for event, value in re.findall(
        rf'hybridserve_sequences_total{{event="(\w+)",model="{LSTM}",version="1"}} (\S+)',
        text)}


def _http_sentence(url: str, tokens: np.ndarray, sentence: int, sequence_id: int,
                   binary: bool) -> list[np.ndarray]:
    import tritonclient.http as triton

    steps = len(tokens)
    logits = []
    with triton.InferenceServerClient(url) as client:
        for step in range(steps):
            tensor = triton.InferInput("tokens", [1, 1], "FP32")
            tensor.set_data_from_numpy(tokens[step:step + 1, sentence:sentence + 1],
                                       binary_data=binary)
            result = client.infer(LSTM, [tensor], sequence_id=sequence_id,
                                  sequence_start=step == 0, sequence_end=step == steps - 1,
                                  outputs=[triton.InferRequestedOutput("logits",
                                                                       binary_data=binary)])
            logits.append(result.as_numpy("logits"))
    return logits


def test_metadata_and_config_show_the_sequence_model_as_triton_does(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        metadata = http.get(f"/v2/models/{LSTM}").json()
        config = http.get(f"/v2/models/{LSTM}/config").json()
    assert [tensor["name"] for tensor in metadata["inputs"]] == ["tokens"]
    assert [tensor["name"] for tensor in metadata["outputs"]] == ["logits"]
    assert "dynamic_batching" not in config
    sequences = config["sequence_batching"]
    assert sequences["direct"] == {"max_queue_delay_microseconds": 50_000,
                                   "minimum_slot_utilization": 0.25}
    assert sequences["max_sequence_idle_microseconds"] == 60_000_000
    assert sequences["state"] == [
        {"input_name": name, "output_name": output, "data_type": "TYPE_FP32", "dims": [2, 32],
         "initial_state": [{"zero_data": True}]} for name, output in (("h_in", "h"),
                                                                      ("c_in", "c"))]


def test_eight_sentences_token_by_token_over_rest_answer_mxnet_in_batches(
        server: Server) -> None:
    tokens, logits = reference()
    url = server.url.removeprefix("http://")
    before = _batches(server)
    events = _sequence_events(server)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda sentence: _http_sentence(
            url, tokens, sentence, 1000 + sentence, binary=sentence % 2 == 0), range(8)))
    for sentence, answer in enumerate(answers):
        for step, got in enumerate(answer):
            assert_close(got, logits[step:step + 1, sentence:sentence + 1], TOLERANCE,
                         f"REST sentence {sentence} step {step}")
    batches, ones = (now - then for now, then in zip(_batches(server), before))
    assert batches > ones, f"{batches} batches, all of one row"
    after = _sequence_events(server)
    assert {event: after[event] - events.get(event, 0) for event in after} == {
        "started": 8, "ended": 8, "dropped_idle": 0}


def test_rest_refuses_what_no_sequence_allows(server: Server) -> None:
    tokens, _ = reference()
    step = {"name": "tokens", "datatype": "FP32", "shape": [1, 1],
            "data": tokens[:1, :1].reshape(-1).tolist()}
    state = {"name": "h_in", "datatype": "FP32", "shape": [2, 1, 32], "data": [0.0] * 64}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        def infer(inputs: list[dict[str, object]], **parameters: object) -> httpx.Response:
            return http.post(f"/v2/models/{LSTM}/infer",
                             json={"inputs": inputs, "parameters": parameters})

        refused = infer([step], sequence_id=77)
        assert refused.status_code == 400
        assert "sequence_id 77 has not started" in refused.json()["error"]
        refused = infer([step])
        assert refused.status_code == 400 and "sequence_id" in refused.json()["error"]
        refused = infer([step, state], sequence_id=78, sequence_start=True)
        assert refused.status_code == 400
        assert "input 'h_in' is a sequence's implicit state" in refused.json()["error"]
        refused = infer([step], sequence_id=79, sequence_start="yes")
        assert refused.status_code == 400 and "sequence_start must be a JSON boolean" in (
            refused.json()["error"])
        refused = http.post(f"/v2/models/{LSTM}/infer", json={
            "inputs": [step], "outputs": [{"name": "h"}],
            "parameters": {"sequence_id": 80, "sequence_start": True}})
        assert refused.status_code == 400
        assert "output 'h' is a sequence's implicit state" in refused.json()["error"]
        answered = infer([step], sequence_id="words", sequence_start=True, sequence_end=True)
        assert answered.status_code == 200, answered.text
        assert [tensor["name"] for tensor in answered.json()["outputs"]] == ["logits"]


def test_eight_sentences_token_by_token_over_grpc_answer_mxnet_in_batches(
        server: Server, tmp_path: Path) -> None:
    tokens, logits = reference()
    before = _batches(server)
    done = subprocess.run([sys.executable, "-m", "tests.e2e.sequence_clients", server.grpc,
                           LSTM, str(tmp_path), "2000"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(tmp_path / "logits.npz") as data:
        got, streamed = data["logits"], data["streamed"]
    assert_close(got, logits, TOLERANCE, "gRPC sentences")
    assert_close(streamed, logits[:, 0], TOLERANCE, "gRPC stream, steps sent at once")
    batches, ones = (now - then for now, then in zip(_batches(server), before))
    assert batches > ones, f"{batches} batches, all of one row"
    refusal = (tmp_path / "refusal.txt").read_text()
    assert refusal.startswith("StatusCode.INVALID_ARGUMENT") and (
        "sequence_id 'never-started' has not started") in refusal, refusal
    config = json.loads((tmp_path / "config.json").read_text())["config"]
    assert "dynamic_batching" not in config
    sequences = config["sequence_batching"]
    assert sequences["direct"] == {"max_queue_delay_microseconds": "50000",
                                   "minimum_slot_utilization": 0.25}
    assert [(state["input_name"], state["output_name"], state["data_type"], state["dims"])
            for state in sequences["state"]] == [("h_in", "h", "TYPE_FP32", ["2", "32"]),
                                                 ("c_in", "c", "TYPE_FP32", ["2", "32"])]
