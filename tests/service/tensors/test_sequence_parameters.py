"""Triton's sequence parameters of a V2 request (``sequence_id``, ``sequence_start``,
``sequence_end``), read alike from REST's JSON and gRPC's InferParameter map."""

from __future__ import annotations

from typing import Any

import pytest

from engine.serving.sequences import SequenceControl
from service.errors import BadRequest
from service.grpc import inference_pb2 as pb
from service.grpc.tensors import sequence_of as grpc_sequence_of
from service.tensors.v2 import decode_v2_request, sequence_of

STEP = {"name": "tokens", "datatype": "FP32", "shape": [1, 1], "data": [3.0]}


def _rest(parameters: dict[str, Any]) -> SequenceControl | None:
    import orjson

    body = orjson.dumps({"inputs": [STEP], "parameters": parameters})
    return sequence_of(decode_v2_request(body, None, 1000).parameters)


def _grpc(**values: Any) -> SequenceControl | None:
    request = pb.ModelInferRequest()
    for key, value in values.items():
        parameter = request.parameters[key]
        if isinstance(value, bool):
            parameter.bool_param = value
        elif isinstance(value, int):
            parameter.int64_param = value
        else:
            parameter.string_param = value
    return grpc_sequence_of(request.parameters)


@pytest.mark.parametrize("read", [_rest, lambda parameters: _grpc(**parameters)])
def test_ids_and_flags_are_read_as_triton_sends_them(read: Any) -> None:
    assert read({"sequence_id": 42, "sequence_start": True}) == SequenceControl(42, True, False)
    assert read({"sequence_id": "s-1", "sequence_end": True}) == SequenceControl("s-1", False,
                                                                                 True)
    # No id, 0 or "": no sequence (Triton's reading), whatever the flags say.
    assert read({}) is None
    assert read({"sequence_id": 0, "sequence_start": True}) is None
    assert read({"sequence_id": ""}) is None


def test_uint64_ids_over_grpc() -> None:
    request = pb.ModelInferRequest()
    request.parameters["sequence_id"].uint64_param = 2**63 + 5
    assert grpc_sequence_of(request.parameters) == SequenceControl(2**63 + 5)


@pytest.mark.parametrize("parameters, message", [
    ({"sequence_id": 1, "sequence_start": "true"}, "sequence_start must be a JSON boolean"),
    ({"sequence_id": 1, "sequence_end": 1}, "sequence_end must be a JSON boolean"),
    ({"sequence_id": 1.5}, "sequence_id must be an integer or a string"),
    ({"sequence_id": True}, "sequence_id must be an integer or a string"),
    ({"sequence_id": -3}, "sequence_id must be a non-negative integer")])
def test_rest_refuses_wrong_types_naming_the_parameter(parameters: dict[str, Any],
                                                       message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        _rest(parameters)


def test_grpc_refuses_a_flag_that_is_no_bool_param() -> None:
    request = pb.ModelInferRequest()
    request.parameters["sequence_id"].int64_param = 1
    request.parameters["sequence_start"].int64_param = 1
    with pytest.raises(BadRequest, match="sequence_start must be a bool_param"):
        grpc_sequence_of(request.parameters)
    request = pb.ModelInferRequest()
    request.parameters["sequence_id"].double_param = 1.0
    with pytest.raises(BadRequest, match="sequence_id must be an integer or a string"):
        grpc_sequence_of(request.parameters)
