"""End to end over gRPC: a real server process, every conformance model, three clients.

tritonclient.grpc and KServe's InferenceGRPCClient run in their own processes (see
`tests.e2e.grpc_clients`); bad requests go through the stubs of `service.grpc`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from engine.serving.config import DATATYPES
from service.grpc import inference_pb2 as pb
from service.grpc import inference_pb2_grpc as pb_grpc
from tests.conformance.fixtures import assert_close, model_names
from tests.e2e.grpc_clients import matching_sets
from tests.e2e.server import ROOT, TOKEN, Server, running_server
from tests.service.helpers import config_for, files_for

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TOLERANCE = {"rtol": 1e-3, "atol": 1e-5}  # RNN models need 1e-3 (see tests/conformance)
MAX_REQUEST_BYTES = 1 << 20
MAX_ELEMENTS = 1 << 16


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("grpc") / "repository"
    extra = ["--max-request-bytes", str(MAX_REQUEST_BYTES),
             "--max-tensor-elements", str(MAX_ELEMENTS)]
    with running_server(root, extra) as running, httpx.Client(timeout=60) as http:
        for name in model_names():
            symbol, params = files_for(name)
            files = {"symbol": ("s.json", symbol), "params": ("p.params", params),
                     "config": ("config.json", json.dumps(config_for(name)).encode())}
            response = http.post(f"{running.url}/models/{name}", files=files, headers=AUTH)
            assert response.status_code == 201, response.text
        yield running


@pytest.fixture(scope="module")
def stub(server: Server) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def _client_answers(client: str, server: Server, out: Path) -> tuple[dict[str, Any],
                                                                     dict[str, np.ndarray]]:
    """Run one third-party client in its own process; what it got."""
    done = subprocess.run([sys.executable, "-m", "tests.e2e.grpc_clients", client, server.grpc,
                           str(out), *model_names()], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(out / "outputs.npz") as data:
        arrays = {key: data[key] for key in data.files}
    return json.loads((out / "answers.json").read_text()), arrays


@pytest.fixture(scope="module")
def outputs_of(stub: pb_grpc.GRPCInferenceServiceStub) -> dict[str, list[str]]:
    """Every model's output names, from ModelMetadata."""
    return {name: [tensor.name for tensor in stub.ModelMetadata(
        pb.ModelMetadataRequest(name=name)).outputs] for name in model_names()}


def _check_outputs(arrays: dict[str, np.ndarray], outputs_of: dict[str, list[str]],
                   modes: tuple[str, ...], client: str) -> None:
    checked = 0
    for name, output_names in outputs_of.items():
        for index, (_, expected) in enumerate(matching_sets(name)):
            for mode in modes:
                for output, reference in zip(output_names, expected):
                    assert_close(arrays[f"{name}/{index}/{mode}/{output}"], reference,
                                 TOLERANCE, f"{client} {mode} {name} set {index}")
                    checked += 1
    assert checked == len(arrays)


def test_tritonclient_grpc_gets_mxnet_outputs(server: Server, outputs_of: dict[str, list[str]],
                                              tmp_path: Path) -> None:
    answers, arrays = _client_answers("triton", server, tmp_path)
    assert answers["live"] is True and answers["ready"] is True
    assert answers["server"]["name"] == "hybridserve"
    assert "binary_tensor_data" in answers["server"]["extensions"]
    for name in model_names():
        assert answers[f"{name}/ready"] is True
        metadata = answers[f"{name}/metadata"]
        declared = config_for(name)["inputs"]
        assert [(tensor["name"], tensor["datatype"], [int(dim) for dim in tensor["shape"]])
                for tensor in metadata["inputs"]] == [
            (spec["name"], spec["datatype"], spec["shape"]) for spec in declared]
        rest = httpx.get(f"{server.url}/v2/models/{name}", timeout=30).json()
        assert metadata["versions"] == rest["versions"] == ["1"]
        assert metadata["platform"] == rest["platform"]
        for index in range(len(matching_sets(name))):
            assert answers[f"{name}/{index}/id"] == f"{name}-{index}"
    _check_outputs(arrays, outputs_of, ("raw",), "tritonclient.grpc")


def test_kserve_grpc_client_gets_mxnet_outputs(server: Server, outputs_of: dict[str, list[str]],
                                               tmp_path: Path) -> None:
    answers, arrays = _client_answers("kserve", server, tmp_path)
    assert answers["live"] is True and answers["ready"] is True
    assert all(answers[f"{name}/ready"] is True for name in model_names())
    _check_outputs(arrays, outputs_of, ("raw", "contents"),
                   "kserve InferenceGRPCClient")


def _request(model: str, tensors: list[tuple[str, str, list[int], np.ndarray]], *,
             outputs: tuple[str, ...] = (), version: str = "") -> pb.ModelInferRequest:
    """A ModelInferRequest with raw contents: (name, datatype, shape, elements) per input."""
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    for name, datatype, shape, elements in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(elements.tobytes())
    request.outputs.extend(pb.ModelInferRequest.InferRequestedOutputTensor(name=name)
                           for name in outputs)
    return request


def _rest_error(server: Server, request: pb.ModelInferRequest) -> tuple[int, str]:
    """The REST answer (status, error) to the same request as V2 JSON."""
    body: dict[str, Any] = {"inputs": [
        {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape),
         "data": np.frombuffer(raw, DATATYPES[tensor.datatype]).tolist()}
        for tensor, raw in zip(request.inputs, request.raw_input_contents)]}
    if request.outputs:
        body["outputs"] = [{"name": output.name} for output in request.outputs]
    version = f"/versions/{request.model_version}" if request.model_version else ""
    response = httpx.post(f"{server.url}/v2/models/{request.model_name}{version}/infer",
                          json=body, timeout=30)
    return response.status_code, response.json()["error"]


def _refusal(call: Any, request: Any, **kwargs: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=30, **kwargs)
    return caught.value


ROW = np.zeros((1, 512), np.float32)
SAME_AS_REST = [  # (request, gRPC code, HTTP status, part of the message)
    (_request("seed_mlp", [("data", "INT32", [1, 512], ROW.astype(np.int32))]),
     grpc.StatusCode.INVALID_ARGUMENT, 400, "datatype INT32; expected FP32"),
    (_request("seed_mlp", [("data", "FP32", [2, 256], ROW)]),
     grpc.StatusCode.INVALID_ARGUMENT, 400, "shape [2, 256]; expected [-1, 512]"),
    (_request("seed_mlp", [("x", "FP32", [1, 512], ROW)]),
     grpc.StatusCode.INVALID_ARGUMENT, 400, "has no input 'x'"),
    (_request("seed_mlp", [("data", "FP32", [1, 512], ROW)], outputs=("nope",)),
     grpc.StatusCode.INVALID_ARGUMENT, 400, "has no output 'nope'"),
    (_request("multi_io", [("data0", "FP32", [1, 5], np.zeros((1, 5), np.float32))]),
     grpc.StatusCode.INVALID_ARGUMENT, 400, "missing input 'data1'"),
    (_request("nope", [("data", "FP32", [1, 512], ROW)]),
     grpc.StatusCode.NOT_FOUND, 404, "'nope'"),
    (_request("seed_mlp", [("data", "FP32", [1, 512], ROW)], version="9"),
     grpc.StatusCode.NOT_FOUND, 404, "no version 9"),
    (_request("..x", [("data", "FP32", [1, 512], ROW)]),
     grpc.StatusCode.INVALID_ARGUMENT, 400, "not allowed"),
    (_request("seed_mlp", [("data", "FP32", [200, 512], np.zeros((200, 512), np.float32))]),
     grpc.StatusCode.RESOURCE_EXHAUSTED, 413, "max_tensor_elements"),
]


def test_bad_input_gets_rest_message_and_code_and_server_stays_healthy(
        server: Server, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    for request, code, status, part in SAME_AS_REST:
        error = _refusal(stub.ModelInfer, request)
        assert error.code() == code, (part, error.details())
        assert part in error.details()
        assert _rest_error(server, request) == (status, error.details())
        assert stub.ServerReady(pb.ServerReadyRequest()).ready
    own = [  # refusals that only the protobuf form can provoke
        (_request("seed_mlp", [("data", "FP32", [1, 513], ROW)]),
         grpc.StatusCode.INVALID_ARGUMENT, "holds 2048 bytes; shape [1, 513] of FP32 needs 2052"),
        (pb.ModelInferRequest(model_name="seed_mlp", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="data", datatype="FP16", shape=[1, 512])]),
         grpc.StatusCode.INVALID_ARGUMENT, "FP16 has no typed contents field"),
        (_request("seed_mlp", [("data", "FP32", [512, 512], np.zeros((512, 512), np.float32))]),
         grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max"),
    ]
    for request, code, part in own:
        error = _refusal(stub.ModelInfer, request)
        assert (error.code(), part in error.details()) == (code, True), error.details()
    for call, request, code, part in [
            (stub.ModelMetadata, pb.ModelMetadataRequest(name="nope"), grpc.StatusCode.NOT_FOUND,
             "'nope'"),
            (stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name="seed_mlp"),
             grpc.StatusCode.UNAUTHENTICATED, "authorization: Bearer"),
    ]:
        error = _refusal(call, request)
        assert (error.code(), part in error.details()) == (code, True), error.details()
    wrong = _refusal(stub.RepositoryModelUnload,
                     pb.RepositoryModelUnloadRequest(model_name="seed_mlp"),
                     metadata=[("authorization", "Bearer x")])
    assert wrong.code() == grpc.StatusCode.PERMISSION_DENIED
    assert stub.ServerLive(pb.ServerLiveRequest()).live
    good = stub.ModelInfer(_request("seed_mlp", [("data", "FP32", [1, 512], ROW)]))
    assert [tensor.name for tensor in good.outputs] == ["seed_mlp_dense2_fwd_output"]
    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    for status in (400, 404, 413, 401, 403):
        assert f'hybridserve_http_errors_total{{status="{status}"}}' in metrics, status
    assert 'hybridserve_requests_total{model="seed_mlp",outcome="success",version="1"}' in metrics


def test_repository_calls(server: Server, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    index = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))
    assert {row.name for row in index.models} == set(model_names())
    assert all(row.state == "READY" and row.version == "1" for row in index.models)
    auth = [("authorization", f"Bearer {TOKEN}")]
    stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="hybridnet"),
                               metadata=auth)
    assert not stub.ModelReady(pb.ModelReadyRequest(name="hybridnet")).ready
    assert httpx.get(f"{server.url}/v2/models/hybridnet/ready").status_code >= 400  # REST agrees
    stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="hybridnet"),
                             metadata=auth)
    assert stub.ModelReady(pb.ModelReadyRequest(name="hybridnet")).ready


def test_tritonclient_repository_calls_answer_as_triton_does(tmp_path: Path) -> None:
    """unload_model sends unload_dependents, is_model_ready of an unknown model is False, a
    timeout of 0 is none, and a load that leaves nothing serving fails naming the reason."""
    root = tmp_path / "repository"
    broken = root / "broken" / "1"
    broken.mkdir(parents=True)  # its only version has no MANIFEST.json: it cannot load
    symbol, params = files_for("seed_mlp")
    (broken / "model-symbol.json").write_bytes(symbol)
    (broken / "model-0000.params").write_bytes(params)
    with running_server(root) as running, httpx.Client(timeout=60) as http:
        files = {"symbol": ("s.json", symbol), "params": ("p.params", params),
                 "config": ("config.json", json.dumps(config_for("seed_mlp")).encode())}
        response = http.post(f"{running.url}/models/seed_mlp", files=files, headers=AUTH)
        assert response.status_code == 201, response.text
        done = subprocess.run([sys.executable, "-m", "tests.e2e.grpc_clients",
                               "triton-repository", running.grpc, str(tmp_path), "seed_mlp",
                               "broken", TOKEN], cwd=ROOT, capture_output=True, text=True,
                              timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads((tmp_path / "answers.json").read_text())
    assert answers["unload"] is None and answers["unloaded ready"] is False
    assert answers["unknown ready"] is False and answers["unknown version ready"] is False
    assert answers["load"] is None and answers["loaded ready"] is True
    assert answers["infer timeout 0"] == "seed_mlp"
    refused = answers["load broken"]
    assert refused["status"] == "StatusCode.INVALID_ARGUMENT", refused
    assert "model 'broken' did not load: version 1: " in refused["message"]
    assert "no MANIFEST.json" in refused["message"]
