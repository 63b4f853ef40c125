"""End to end (#38): GluonNLP exports made by MXNet 1.9.1 as users make them (BERT with masked
positions, time-major LSTM and GRU language models, a Transformer encoder-decoder), uploaded as
two files without config.json to a real server process, called by tritonclient over HTTP and
gRPC at batch 1 and 4, answer MXNet's outputs; V2 metadata puts the -1 at each batch axis."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from engine.serving.config import datatype_of
from tests.conformance.fixtures import assert_close, model_io_sets, serving_names
from tests.e2e.server import ROOT, TOKEN, Server, running_server
from tests.service.helpers import files_for

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TOLERANCE = {"rtol": 1e-3, "atol": 1e-5}  # RNN models need 1e-3 (see tests/conformance)
# Where each model's batch lies: every input's and every output's axis, in order.
AXES = {"gluonnlp_bert_masked": ([0, 0, 0, 0], [0, 0, 0, 0]),
        "gluonnlp_gru_lm_tnc": ([1], [1, 1]),
        "gluonnlp_lstm_lm_tnc": ([1, 1, 1], [1, 1, 1]),
        "gluonnlp_transformer_small": ([0, 0, 0, 0], [0])}


@pytest.fixture(scope="module")
def uploaded(tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[Server, dict[str, dict[str, Any]]]]:
    """One server holding the four models, uploaded as bare symbol + params; the answers."""
    root = tmp_path_factory.mktemp("batch_axes") / "repository"
    with running_server(root) as server, httpx.Client(base_url=server.url, timeout=120) as http:
        answers = {}
        for name in serving_names():
            symbol, params = files_for(name)
            response = http.post(f"/models/{name}", headers=AUTH, files={
                "symbol": ("s.json", symbol), "params": ("p.params", params)})
            assert response.status_code == 201, f"{name}: {response.text}"
            answers[name] = response.json()
        yield server, answers


def test_the_four_models_of_the_issue_are_here() -> None:
    assert sorted(AXES) == serving_names()


@pytest.mark.parametrize("name", sorted(AXES))
def test_upload_finds_the_batch_axes_and_runs_the_test_inference(
        uploaded: tuple[Server, dict[str, dict[str, Any]]], name: str) -> None:
    _, answers = uploaded
    answer = answers[name]
    checks = answer["checks"]
    assert checks["test_inference"]["ran"], checks
    batching = checks["batch_axes"]
    assert batching["batched"] is True, batching
    inputs, outputs = AXES[name]
    assert list(batching["inputs"].values()) == inputs
    assert list(batching["outputs"].values()) == outputs


@pytest.mark.parametrize("name", sorted(AXES))
def test_v2_metadata_puts_the_batch_dimension_at_its_axis(
        uploaded: tuple[Server, dict[str, dict[str, Any]]], name: str) -> None:
    import tritonclient.http as triton

    server, _ = uploaded
    with triton.InferenceServerClient(server.url.removeprefix("http://")) as client:
        metadata = client.get_model_metadata(name)
    inputs, outputs = AXES[name]
    reference, expected = model_io_sets(name)[0]
    assert [tensor["name"] for tensor in metadata["inputs"]] == list(reference)
    for tensor, axis, array in zip(metadata["inputs"], inputs, reference.values()):
        shape = [int(dim) for dim in tensor["shape"]]
        assert len(shape) == array.ndim and shape[axis] == -1, (name, tensor)
        assert all(dim in (-1, got) for dim, got in zip(shape, array.shape)), (name, tensor)
    for tensor, axis, array in zip(metadata["outputs"], outputs, expected):
        shape = [int(dim) for dim in tensor["shape"]]
        assert len(shape) == array.ndim and shape[axis] == -1, (name, tensor)


def _http_infer(url: str, name: str, inputs: dict[str, np.ndarray],
                outputs: list[str]) -> list[np.ndarray]:
    import tritonclient.http as triton

    with triton.InferenceServerClient(url) as client:
        tensors = []
        for key, array in inputs.items():
            tensor = triton.InferInput(key, list(array.shape), datatype_of(array.dtype))
            tensor.set_data_from_numpy(array, binary_data=True)
            tensors.append(tensor)
        result = client.infer(name, tensors, outputs=[
            triton.InferRequestedOutput(output, binary_data=True) for output in outputs])
        return [result.as_numpy(output) for output in outputs]


@pytest.mark.parametrize("name", sorted(AXES))
def test_tritonclient_http_gets_mxnets_outputs_at_batch_1_and_4(
        uploaded: tuple[Server, dict[str, dict[str, Any]]], name: str) -> None:
    server, answers = uploaded
    url = server.url.removeprefix("http://")
    outputs = [tensor["name"] for tensor in answers[name]["outputs"]]
    sets = model_io_sets(name)
    assert sorted(_rows(name, inputs) for inputs, _ in sets) == [1, 4]
    for inputs, expected in sets:
        for index, (got, want) in enumerate(zip(_http_infer(url, name, inputs, outputs),
                                                expected)):
            assert_close(got, want, TOLERANCE, f"{name} batch {_rows(name, inputs)} "
                                               f"output {index}")


@pytest.mark.parametrize("name", sorted(AXES))
def test_four_concurrent_single_rows_get_their_own_rows(
        uploaded: tuple[Server, dict[str, dict[str, Any]]], name: str) -> None:
    """Rows sent at once may be joined by the batcher along the batch axis; each caller gets
    exactly MXNet's row of the batch of 4 back."""
    server, answers = uploaded
    url = server.url.removeprefix("http://")
    outputs = [tensor["name"] for tensor in answers[name]["outputs"]]
    in_axes, out_axes = AXES[name]
    inputs, expected = next((inputs, expected) for inputs, expected in model_io_sets(name)
                            if _rows(name, inputs) == 4)
    rows = [{key: np.take(array, [row], axis=axis)
             for (key, array), axis in zip(inputs.items(), in_axes)} for row in range(4)]
    with ThreadPoolExecutor(4) as pool:
        answered = list(pool.map(lambda row: _http_infer(url, name, row, outputs), rows))
    for row, got in enumerate(answered):
        for index, (value, want, axis) in enumerate(zip(got, expected, out_axes)):
            assert_close(value, np.take(want, [row], axis=axis), TOLERANCE,
                         f"{name} row {row} output {index}")


def test_tritonclient_grpc_gets_mxnets_outputs_at_batch_1_and_4(
        uploaded: tuple[Server, dict[str, dict[str, Any]]], tmp_path: Path) -> None:
    """tritonclient.grpc runs in its own process (see `tests.e2e.grpc_clients`)."""
    server, answers = uploaded
    names = sorted(AXES)
    done = subprocess.run([sys.executable, "-m", "tests.e2e.grpc_clients", "triton",
                           server.grpc, str(tmp_path), *names], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads((tmp_path / "answers.json").read_text())
    with np.load(tmp_path / "outputs.npz") as data:
        arrays = {key: data[key] for key in data.files}
    for name in names:
        assert got[f"{name}/ready"] is True
        outputs = [tensor["name"] for tensor in answers[name]["outputs"]]
        metadata_inputs = got[f"{name}/metadata"]["inputs"]
        for tensor, axis in zip(metadata_inputs, AXES[name][0]):
            assert int(tensor["shape"][axis]) == -1, (name, tensor)
        for index, (inputs, expected) in enumerate(model_io_sets(name)):
            for output, want in zip(outputs, expected):
                assert_close(arrays[f"{name}/{index}/raw/{output}"], want, TOLERANCE,
                             f"{name} grpc batch {_rows(name, inputs)} {output}")


def _rows(name: str, inputs: dict[str, np.ndarray]) -> int:
    """A request's batch size: its first input's size along its batch axis."""
    first = next(iter(inputs.values()))
    return first.shape[AXES[name][0][0]]


def test_a_raw_binary_request_is_one_row_at_the_batch_axis(
        uploaded: tuple[Server, dict[str, dict[str, Any]]]) -> None:
    """The GRU's tokens as bare bytes (Inference-Header-Content-Length 0): 6 steps of one
    sequence, ``[6, 1]``, answered as MXNet answers batch 1."""
    server, _ = uploaded
    name = "gluonnlp_gru_lm_tnc"
    inputs, expected = next((inputs, expected) for inputs, expected in model_io_sets(name)
                            if _rows(name, inputs) == 1)
    tokens = inputs["data"]
    with httpx.Client(base_url=server.url, timeout=60) as http:
        response = http.post(f"/v2/models/{name}/infer", content=tokens.tobytes(),
                             headers={"Inference-Header-Content-Length": "0"})
    assert response.status_code == 200, response.text
    offset = length = int(response.headers["Inference-Header-Content-Length"])
    header = json.loads(response.content[:length])
    for tensor, want in zip(header["outputs"], expected):
        size = tensor["parameters"]["binary_data_size"]
        got = np.frombuffer(response.content[offset:offset + size], np.float32)
        assert_close(got.reshape(tensor["shape"]), want, TOLERANCE, f"{name} raw {tensor}")
        offset += size
