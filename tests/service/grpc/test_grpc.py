"""The gRPC service in-process: tensors in protobuf, status codes, drain, management, settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from engine.serving.config import DATATYPES
from service.dataplane.drain import SHUTTING_DOWN
from service.errors import STATUS, BadRequest
from service.grpc import inference_pb2 as pb
from service.grpc import tensors
from service.grpc.server import GrpcPortError, start_grpc
from service.grpc.status import code_of
from service.settings import load_settings
from tests.conformance.fixtures import DEFAULT_TOLERANCE, assert_close
from tests.service.grpc_inprocess import GrpcClient, grpc_client
from tests.service.helpers import TOKEN, first_io

AUTH = [("authorization", f"Bearer {TOKEN}")]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcClient]:
    root = tmp_path_factory.mktemp("grpc") / "repository"
    with grpc_client(root, ("seed_mlp", "multi_io")) as running:
        yield running


def _request(model: str, arrays: dict[str, np.ndarray], raw: bool) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id="r1")
    for name, array in arrays.items():
        tensor = request.inputs.add(name=name, datatype="FP32", shape=array.shape)
        if raw:
            request.raw_input_contents.append(array.tobytes())
        else:
            tensor.contents.fp32_contents.extend(array.reshape(-1).tolist())
    return request


def _outputs(response: pb.ModelInferResponse) -> list[np.ndarray]:
    return [np.frombuffer(raw, DATATYPES[tensor.datatype]).reshape(tensor.shape)
            for tensor, raw in zip(response.outputs, response.raw_output_contents)]


@pytest.mark.parametrize("model", ["seed_mlp", "multi_io"])
@pytest.mark.parametrize("raw", [True, False])
def test_raw_and_typed_contents_give_mxnet_outputs(client: GrpcClient, model: str,
                                                   raw: bool) -> None:
    inputs, expected = first_io(model)
    response = client.call("ModelInfer", _request(model, inputs, raw))
    assert (response.model_name, response.model_version, response.id) == (model, "1", "r1")
    for output, reference in zip(_outputs(response), expected):
        assert_close(output, reference, DEFAULT_TOLERANCE, f"{model} raw={raw}")


def test_requested_outputs_come_in_the_requested_order(client: GrpcClient) -> None:
    inputs, expected = first_io("multi_io")
    request = _request("multi_io", inputs, raw=True)
    names = [tensor.name for tensor in client.call(
        "ModelMetadata", pb.ModelMetadataRequest(name="multi_io")).outputs]
    request.outputs.add(name=names[-1])
    response = client.call("ModelInfer", request)
    assert [tensor.name for tensor in response.outputs] == [names[-1]]
    assert_close(_outputs(response)[0], expected[-1], DEFAULT_TOLERANCE, "last output")


@pytest.mark.parametrize("datatype", sorted(tensors.CONTENTS_FIELD))
def test_every_datatype_reads_from_its_contents_field(datatype: str) -> None:
    values = [0, 1, 1, 0, 1, 0] if datatype == "BOOL" else [0, 1, 2, 3, 4, 5]
    contents = pb.InferTensorContents(**{tensors.CONTENTS_FIELD[datatype]: values})
    array = tensors.array_from_contents(contents, datatype, [2, 3], "input 'x'")
    assert array.dtype == DATATYPES[datatype] and array.shape == (2, 3)
    assert array.reshape(-1).tolist() == [type(array.reshape(-1)[0].item())(v) for v in values]


def test_contents_refusals_name_the_input_and_the_fix() -> None:
    fp32 = pb.InferTensorContents(fp32_contents=[1.0, 2.0])
    refusals = [
        (lambda: tensors.array_from_contents(fp32, "INT32", [2], "input 'x'"),
         "input 'x': datatype INT32 is carried in contents.int_contents, but the request fills "
         "contents.fp32_contents"),
        (lambda: tensors.array_from_contents(fp32, "FP32", [3], "input 'x'"),
         "input 'x': shape [3] needs 3 elements, but data has 2"),
        (lambda: tensors.array_from_contents(pb.InferTensorContents(int_contents=[300]), "INT8",
                                             [1], "input 'x'"), "cannot be read as INT8"),
        (lambda: tensors.array_from_contents(fp32, "FP16", [2], "input 'x'"),
         "FP16 has no typed contents field; send it in raw_input_contents"),
        (lambda: tensors.array_from_raw(b"\x00" * 7, "FP32", [2], "input 'x'"),
         "raw_input_contents holds 7 bytes; shape [2] of FP32 needs 8 bytes"),
        (lambda: tensors.array_from_raw(b"", "BYTES", [0], "input 'x'"),
         "datatype BYTES is only for inputs with a preprocess pipeline"),
    ]
    for refuse, message in refusals:
        with pytest.raises(BadRequest) as caught:
            refuse()
        assert message in str(caught.value)


def test_raw_bytes_are_little_endian_row_major() -> None:
    array = tensors.array_from_raw(np.arange(6, dtype="<i4").tobytes(), "INT32", [2, 3], "x")
    assert array.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_request_refusals(client: GrpcClient) -> None:
    raw = np.zeros((1, 512), np.float32).tobytes()
    tensor = pb.ModelInferRequest.InferInputTensor(name="data", datatype="FP32", shape=[1, 512])
    cases = [
        (pb.ModelInferRequest(model_name="seed_mlp", inputs=[tensor],
                              raw_input_contents=[raw, raw]), "2 raw_input_contents for 1 inputs"),
        (pb.ModelInferRequest(model_name="seed_mlp", inputs=[tensor, tensor],
                              raw_input_contents=[raw, raw]), "input 'data' is given twice"),
        (pb.ModelInferRequest(model_name="seed_mlp", inputs=[
            pb.ModelInferRequest.InferInputTensor(name="data", datatype="FP32", shape=[1, 512],
                                                  contents=pb.InferTensorContents(
                                                      fp32_contents=[0.0]))],
                              raw_input_contents=[raw]), "either contents or raw_input_contents"),
        (pb.ModelInferRequest(model_name="seed_mlp", inputs=[
            pb.ModelInferRequest.InferInputTensor(datatype="FP32", shape=[1])]),
         "inputs[0]: 'name' must be a non-empty string"),
        (pb.ModelInferRequest(model_name="seed_mlp", inputs=[
            pb.ModelInferRequest.InferInputTensor(name="data", datatype="FP32", shape=[-1, 512])]),
         "shape must be a list of at most 32 non-negative integers"),
        (pb.ModelInferRequest(model_name="seed_mlp", inputs=[tensor], raw_input_contents=[raw],
                              parameters={"timeout": pb.InferParameter(string_param="1s")}),
         "parameters.timeout must be a non-negative integer (microseconds; 0: none)"),
        (pb.ModelInferRequest(model_name="seed_mlp"), "'inputs' must be a non-empty list"),
        # The name is checked before the tensor's size: the message names the wrong name.
        (pb.ModelInferRequest(model_name="seed_mlp", inputs=[
            pb.ModelInferRequest.InferInputTensor(name="dat", datatype="FP32", shape=[1, 512])],
                              raw_input_contents=[raw[:100]]), "has no input 'dat'"),
        (pb.ModelInferRequest(model_name="seed_mlp", inputs=[
            pb.ModelInferRequest.InferInputTensor(name="dat", datatype="FP32", shape=[1, 512],
                                                  contents=pb.InferTensorContents(
                                                      fp32_contents=[0.0]))]),
         "has no input 'dat'"),
    ]
    for request, message in cases:
        code, details = client.code("ModelInfer", request)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details, details
    assert client.call("ServerReady", pb.ServerReadyRequest()).ready


def test_bytes_that_are_no_request_are_invalid_argument(client: GrpcClient) -> None:
    code, details = client.code("ModelInfer", b"\xff\xff\xff")
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid inference.ModelInferRequest message" in details


def test_every_error_status_has_its_own_code() -> None:
    for status in {*STATUS.values(), 401, 403, 413}:
        assert code_of(status) != grpc.StatusCode.UNKNOWN, status
    assert code_of(404) == grpc.StatusCode.NOT_FOUND
    assert code_of(503) == grpc.StatusCode.UNAVAILABLE


def test_timeout_parameter_in_seconds() -> None:
    assert tensors.timeout_s({"timeout": pb.InferParameter(int64_param=2500)}) == 0.0025
    assert tensors.timeout_s({}) is None
    assert tensors.timeout_s({"timeout": pb.InferParameter(int64_param=0)}) is None  # Triton's
    with pytest.raises(BadRequest, match="got -1"):
        tensors.timeout_s({"timeout": pb.InferParameter(int64_param=-1)})


def test_inference_is_counted_in_the_shared_metrics(client: GrpcClient) -> None:
    inputs, _ = first_io("seed_mlp")
    series = client.runtime.metrics.requests.labels("seed_mlp", "1", "success")
    before = series._value.get()
    client.call("ModelInfer", _request("seed_mlp", inputs, raw=True))
    assert series._value.get() == before + 1


def test_draining_refuses_calls_but_answers_health(client: GrpcClient) -> None:
    inputs, _ = first_io("seed_mlp")
    client.runtime.drain.draining = True
    try:
        assert client.code("ModelInfer", _request("seed_mlp", inputs, raw=True)) == (
            grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
        assert client.call("ServerLive", pb.ServerLiveRequest()).live
    finally:
        client.runtime.drain.draining = False
    assert client.runtime.drain.in_flight == 0


def test_model_readiness_and_repository_index(client: GrpcClient) -> None:
    assert client.call("ModelReady", pb.ModelReadyRequest(name="seed_mlp")).ready
    # Not ready, as Triton answers, for a model or version the repository does not know.
    assert not client.call("ModelReady", pb.ModelReadyRequest(name="nope")).ready
    assert not client.call("ModelReady", pb.ModelReadyRequest(name="seed_mlp", version="9")).ready
    index = client.call("RepositoryIndex", pb.RepositoryIndexRequest())
    assert sorted((row.name, row.version, row.state) for row in index.models) == [
        ("multi_io", "1", "READY"), ("seed_mlp", "1", "READY")]
    metadata = client.call("ServerMetadata", pb.ServerMetadataRequest())
    assert metadata.name == "hybridserve" and "model_repository" in metadata.extensions


def test_unload_and_load_need_the_admin_token(client: GrpcClient) -> None:
    unload = pb.RepositoryModelUnloadRequest(model_name="multi_io")
    assert client.code("RepositoryModelUnload", unload)[0] == grpc.StatusCode.UNAUTHENTICATED
    client.call("RepositoryModelUnload", unload, metadata=AUTH)
    assert not client.call("ModelReady", pb.ModelReadyRequest(name="multi_io")).ready
    inputs, _ = first_io("multi_io")
    code, details = client.code("ModelInfer", _request("multi_io", inputs, raw=True))
    # Unloaded until someone loads it: REST's 400, not UNAVAILABLE (which invites retries).
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "it serves once loaded" in details
    client.call("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="multi_io"),
                metadata=AUTH)
    assert client.call("ModelReady", pb.ModelReadyRequest(name="multi_io")).ready


def test_unload_takes_unload_dependents_and_nothing_else(client: GrpcClient) -> None:
    flag = pb.ModelRepositoryParameter
    unload = pb.RepositoryModelUnloadRequest(
        model_name="multi_io", parameters={"unload_dependents": flag(bool_param=True)})
    client.call("RepositoryModelUnload", unload, metadata=AUTH)
    assert not client.call("ModelReady", pb.ModelReadyRequest(name="multi_io")).ready
    for method, request, message in (
            ("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(
                model_name="multi_io", parameters={"unload_dependents": flag(string_param="1")}),
             "parameter 'unload_dependents' must be a bool_param"),
            ("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(
                model_name="multi_io", parameters={"force": flag(bool_param=True)}),
             "parameter 'force' is not supported; only unload_dependents is"),
            ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(
                model_name="multi_io", parameters={"config": flag(string_param="{}")}),
             "parameter 'config' is not supported; a model is loaded from its files")):
        code, details = client.code(method, request, metadata=AUTH)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details, details
    client.call("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="multi_io"),
                metadata=AUTH)
    assert client.call("ModelReady", pb.ModelReadyRequest(name="multi_io")).ready


@pytest.mark.parametrize(("overrides", "message"), [
    ({"management": False}, "switched off"),
    ({"admin_port": 1}, "served on the admin port only"),
])
def test_management_refused_where_rest_refuses_it(tmp_path: Path, overrides: dict,
                                                  message: str) -> None:
    with grpc_client(tmp_path / "repository", (), **overrides) as running:
        code, details = running.code("RepositoryModelLoad", pb.RepositoryModelLoadRequest(
            model_name="x"), metadata=AUTH)
    assert code == grpc.StatusCode.PERMISSION_DENIED and message in details, details


def test_a_taken_port_is_refused(client: GrpcClient) -> None:
    with pytest.raises(GrpcPortError, match="cannot listen for gRPC on 127.0.0.1:"):
        client.run(lambda: start_grpc(client.runtime))


def test_grpc_port_setting() -> None:
    assert load_settings([]).grpc_port == 8001
    assert load_settings(["--grpc-port", "0"]).grpc_port == 0
    with pytest.raises(SystemExit):
        load_settings(["--grpc-port", "70000"])


def _strings(raw: bytes) -> list[str]:
    """The elements of a BYTES tensor's raw contents: each a 4-byte little-endian length, then
    the bytes."""
    elements, offset = [], 0
    while offset < len(raw):
        size = int.from_bytes(raw[offset:offset + 4], "little")
        elements.append(raw[offset + 4:offset + 4 + size].decode())
        offset += 4 + size
    return elements


def test_classification_gives_rest_s_class_strings_as_bytes(client: GrpcClient) -> None:
    inputs, expected = first_io("seed_mlp")
    name = client.call("ModelMetadata", pb.ModelMetadataRequest(name="seed_mlp")).outputs[0].name
    request = _request("seed_mlp", inputs, raw=True)
    request.outputs.add(name=name, parameters={"classification": pb.InferParameter(int64_param=1)})
    response = client.call("ModelInfer", request)
    (tensor,) = response.outputs
    rows = expected[0].reshape(len(expected[0]), -1)
    assert (tensor.datatype, list(tensor.shape)) == ("BYTES", [len(rows), 1])
    elements = _strings(response.raw_output_contents[0])
    assert [int(element.split(":")[1]) for element in elements] == rows.argmax(axis=1).tolist()
    np.testing.assert_allclose([float(element.split(":")[0]) for element in elements],
                               rows.max(axis=1), rtol=1e-4, atol=1e-5)


def test_classification_that_is_not_an_integer_is_invalid_argument(client: GrpcClient) -> None:
    inputs, _ = first_io("seed_mlp")
    name = client.call("ModelMetadata", pb.ModelMetadataRequest(name="seed_mlp")).outputs[0].name
    request = _request("seed_mlp", inputs, raw=True)
    request.outputs.add(name=name,
                        parameters={"classification": pb.InferParameter(string_param="3")})
    code, details = client.code("ModelInfer", request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "parameters.classification must be a non-negative integer" in details
