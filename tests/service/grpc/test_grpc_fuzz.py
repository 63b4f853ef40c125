"""Fuzzing (bounded) the gRPC port: ModelInferRequest messages and raw bytes.

Whatever arrives, the call ends with a code a client's mistake earns (or a correct answer),
never INTERNAL or UNKNOWN, and the server keeps serving correct results.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.grpc import inference_pb2 as pb
from tests.conformance.fixtures import DEFAULT_TOLERANCE, assert_close
from tests.service.grpc_inprocess import GrpcClient, grpc_client
from tests.service.helpers import first_io

MODELS = ("seed_mlp", "multi_io")
CLIENT_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION,
                grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.UNAUTHENTICATED}
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcClient]:
    root = tmp_path_factory.mktemp("grpc-fuzz") / "repository"
    with grpc_client(root, MODELS, max_tensor_elements=1 << 16,
                     max_request_bytes=1 << 20) as running:
        yield running


names = st.sampled_from(["data", "data0", "data1", "", "x", "data" * 20])
datatypes = st.sampled_from(["FP32", "FP64", "FP16", "INT8", "INT32", "INT64", "UINT8", "UINT64",
                             "BOOL", "BYTES", "fp32", "", "FP"])
shapes = st.lists(st.integers(-3, 12) | st.sampled_from([512, 1 << 31, 1 << 62, -(1 << 62)]),
                  max_size=5)
contents_fields = st.sampled_from(["bool_contents", "int_contents", "int64_contents",
                                   "uint_contents", "uint64_contents", "fp32_contents",
                                   "fp64_contents", "bytes_contents"])
parameters = st.dictionaries(st.sampled_from(["timeout", "binary_data_output", "x"]),
                             st.builds(pb.InferParameter, int64_param=st.integers(-5, 1 << 40))
                             | st.builds(pb.InferParameter, string_param=st.text(max_size=4))
                             | st.builds(pb.InferParameter, bool_param=st.booleans())
                             | st.builds(pb.InferParameter, double_param=st.floats()),
                             max_size=2)


def _values(field: str) -> st.SearchStrategy[list[Any]]:
    if field == "bool_contents":
        return st.lists(st.booleans(), max_size=600)
    if field == "bytes_contents":
        return st.lists(st.binary(max_size=4), max_size=4)
    if field in ("fp32_contents", "fp64_contents"):
        return st.lists(st.floats(width=32), max_size=600)
    bits = {"int_contents": 31, "int64_contents": 63, "uint_contents": 32,
            "uint64_contents": 64}[field]
    low = 0 if field.startswith("uint") else -(1 << bits)
    return st.lists(st.integers(low, (1 << bits) - 1), max_size=600)


@st.composite
def infer_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    """A ModelInferRequest: sometimes well formed for the real models, often not."""
    request = pb.ModelInferRequest(
        model_name=draw(st.sampled_from([*MODELS, "missing", "", "../x"])),
        model_version=draw(st.sampled_from(["", "1", "9", "x"])), id=draw(st.text(max_size=4)),
        parameters=draw(parameters))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        shape = draw(shapes)
        tensor = request.inputs.add(name=draw(names), datatype=draw(datatypes), shape=shape)
        count = math.prod(shape) if all(0 <= dim <= 4096 for dim in shape) else 0
        if raw:
            size = draw(st.sampled_from([count * 4, count * 8, count, 3]))
            request.raw_input_contents.append(draw(st.binary(min_size=size, max_size=size)))
        else:
            field = draw(contents_fields)
            getattr(tensor.contents, field).extend(draw(_values(field)))
    if raw and draw(st.booleans()):
        request.raw_input_contents.append(b"\x00" * 4)
    for output in draw(st.lists(st.sampled_from(["seed_mlp_dense2_fwd_output", "nope", ""]),
                                max_size=2)):
        request.outputs.add(name=output)
    return request


@st.composite
def near_valid_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    """A well-formed seed_mlp request (raw or typed), sometimes with one field changed."""
    rows = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 1 << 16))
    array = np.random.default_rng(seed).standard_normal((rows, 512), np.float32)
    request = pb.ModelInferRequest(model_name="seed_mlp")
    tensor = request.inputs.add(name="data", datatype="FP32", shape=[rows, 512])
    if draw(st.booleans()):
        request.raw_input_contents.append(array.tobytes())
    else:
        tensor.contents.fp32_contents.extend(array.reshape(-1).tolist())
    change = draw(st.sampled_from(["none", "datatype", "shape", "name", "model", "output"]))
    if change == "datatype":
        tensor.datatype = draw(datatypes)
    elif change == "shape":
        tensor.shape[-1] = draw(st.integers(0, 1024))
    elif change == "name":
        tensor.name = draw(names)
    elif change == "model":
        request.model_name = "multi_io"
    elif change == "output":
        request.outputs.add(name=draw(st.sampled_from(["seed_mlp_dense2_fwd_output", "x"])))
    return request


def _ends_with(client: GrpcClient, method: str, request: Any) -> grpc.StatusCode:
    code, details = client.code(method, request, timeout=60)
    assert code in CLIENT_CODES, (code, details)
    assert code == grpc.StatusCode.OK or details, code
    return code


@FUZZ
@given(request=infer_requests() | near_valid_requests())
def test_infer_requests_never_internal(client: GrpcClient, request: pb.ModelInferRequest) -> None:
    _ends_with(client, "ModelInfer", request)


@FUZZ
@given(body=st.binary(max_size=512),
       method=st.sampled_from(["ModelInfer", "ModelMetadata", "ModelReady",
                               "RepositoryModelLoad", "RepositoryIndex"]))
def test_raw_bytes_never_internal(client: GrpcClient, body: bytes, method: str) -> None:
    code = _ends_with(client, method, body)
    assert code != grpc.StatusCode.OK or method != "RepositoryModelLoad"


def test_served_models_survive_the_fuzzing(client: GrpcClient) -> None:
    assert client.call("ServerReady", pb.ServerReadyRequest()).ready
    for name in MODELS:
        inputs, expected = first_io(name)
        request = pb.ModelInferRequest(model_name=name)
        for key, array in inputs.items():
            request.inputs.add(name=key, datatype="FP32", shape=array.shape)
            request.raw_input_contents.append(array.tobytes())
        response = client.call("ModelInfer", request)
        for tensor, raw, want in zip(response.outputs, response.raw_output_contents, expected):
            got = np.frombuffer(raw, np.float32).reshape(tensor.shape)
            assert_close(got, want, DEFAULT_TOLERANCE, name)
