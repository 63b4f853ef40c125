"""Triton's ModelConfig and ModelStreamInfer calls, in-process."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from google.protobuf import json_format

from engine.serving.config import DATATYPES
from service.dataplane import triton_config
from service.dataplane.drain import SHUTTING_DOWN
from service.grpc import inference_pb2 as pb
from tests.conformance.fixtures import DEFAULT_TOLERANCE, assert_close
from tests.service.grpc_inprocess import GrpcClient, grpc_client
from tests.service.helpers import first_io

STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcClient]:
    root = tmp_path_factory.mktemp("grpc-triton") / "repository"
    with grpc_client(root, ("seed_mlp", "multi_io")) as running:
        yield running


def _request(model: str, request_id: str, arrays: dict[str, np.ndarray]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    for name, array in arrays.items():
        request.inputs.add(name=name, datatype="FP32", shape=array.shape)
        request.raw_input_contents.append(array.tobytes())
    return request


def _outputs(response: pb.ModelInferResponse) -> list[np.ndarray]:
    return [np.frombuffer(raw, DATATYPES[tensor.datatype]).reshape(tensor.shape)
            for tensor, raw in zip(response.outputs, response.raw_output_contents)]


def _stream(client: GrpcClient, messages: list[bytes]) -> list[pb.ModelStreamInferResponse]:
    """Send `messages` on one stream, close it, and read every answer."""
    call = client.channel.stream_stream(STREAM)

    async def exchange() -> list[bytes]:
        return [answer async for answer in call(iter(messages))]

    return [pb.ModelStreamInferResponse.FromString(answer) for answer in client.run(exchange)]


def test_model_config_is_the_rest_answer_as_a_message(client: GrpcClient) -> None:
    for request in (pb.ModelConfigRequest(name="multi_io"),
                    pb.ModelConfigRequest(name="multi_io", version="1")):
        config = client.call("ModelConfig", request).config
        expected = triton_config.model_config(client.runtime.repository, "multi_io", None)
        assert json_format.MessageToDict(config, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True) == (
            json_format.MessageToDict(json_format.ParseDict(
                expected.model_dump(mode="json", exclude_none=True), pb.ModelConfig()),
                preserving_proto_field_name=True, always_print_fields_with_no_presence=True))
        assert [tensor.name for tensor in config.input] == ["data0", "data1"]
        assert list(config.input[1].dims) == [3, 6, 6]
        assert config.input[0].data_type == pb.TYPE_FP32
        assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
        assert config.instance_group[0].kind == pb.ModelInstanceGroup.KIND_CPU


def test_model_config_of_an_unknown_model_is_not_found(client: GrpcClient) -> None:
    code, details = client.code("ModelConfig", pb.ModelConfigRequest(name="nothing"))
    assert code == grpc.StatusCode.NOT_FOUND and "nothing" in details


def test_a_stream_answers_every_request_under_its_id(client: GrpcClient) -> None:
    """Good requests get MXNet's outputs; a bad one, and bytes that are no request, get their
    error on the stream, which carries on."""
    mlp, mlp_expected = first_io("seed_mlp")
    multi, multi_expected = first_io("multi_io")
    wrong = _request("seed_mlp", "wrong", {"no_such_input": np.zeros((1, 512), np.float32)})
    messages = [_request("seed_mlp", "a", mlp).SerializeToString(), b"\xff\xff\xff",
                wrong.SerializeToString(), _request("multi_io", "b", multi).SerializeToString()]
    answers = _stream(client, messages)
    assert len(answers) == 4
    by_id = {answer.infer_response.id: answer for answer in answers
             if answer.infer_response.id}
    assert set(by_id) == {"a", "b", "wrong"}
    for request_id, expected in (("a", mlp_expected), ("b", multi_expected)):
        assert by_id[request_id].error_message == ""
        for output, reference in zip(_outputs(by_id[request_id].infer_response), expected,
                                     strict=True):
            assert_close(output, reference, DEFAULT_TOLERANCE, request_id)
    assert "no_such_input" in by_id["wrong"].error_message
    (garbage,) = [answer for answer in answers if not answer.infer_response.id]
    assert "not a valid inference.ModelInferRequest" in garbage.error_message


def test_a_stream_keeps_answering_while_open(client: GrpcClient) -> None:
    """Each answer arrives before the client sends its next request (as perf_analyzer's
    streaming does, waiting on answers with the stream open)."""
    inputs, expected = first_io("seed_mlp")
    call = client.channel.stream_stream(STREAM)

    async def exchange() -> list[pb.ModelStreamInferResponse]:
        stream = call()
        got = []
        for index in range(3):
            await stream.write(_request("seed_mlp", str(index), inputs).SerializeToString())
            got.append(pb.ModelStreamInferResponse.FromString(
                await asyncio.wait_for(stream.read(), 30)))
        await stream.done_writing()
        assert await stream.read() == grpc.aio.EOF
        return got

    answers = client.run(exchange)
    assert [answer.infer_response.id for answer in answers] == ["0", "1", "2"]
    for answer in answers:
        (output,) = _outputs(answer.infer_response)
        assert_close(output, expected[0], DEFAULT_TOLERANCE, answer.infer_response.id)


def test_a_draining_server_refuses_stream_requests(client: GrpcClient) -> None:
    inputs, _ = first_io("seed_mlp")
    client.runtime.drain.draining = True
    try:
        (answer,) = _stream(client, [_request("seed_mlp", "late", inputs).SerializeToString()])
    finally:
        client.runtime.drain.draining = False
    assert answer.error_message == SHUTTING_DOWN and answer.infer_response.id == "late"
    assert client.runtime.drain.in_flight == 0
