"""V2 JSON and binary tensors to and from numpy."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from engine.serving.config import DATATYPES
from service.errors import BadRequest, PayloadTooLarge
from service.tensors import v2 as codecs

LIMIT = 1 << 20


def _request(inputs: list[dict], **extra: object) -> bytes:
    return orjson.dumps({"inputs": inputs, **extra})


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_json_tensor_every_datatype_nested_and_flat(datatype: str) -> None:
    dtype = DATATYPES[datatype]
    expected = (np.arange(6) % 2).astype(dtype).reshape(2, 3)
    for data in (expected.tolist(), expected.ravel().tolist()):
        body = _request([{"name": "x", "datatype": datatype, "shape": [2, 3], "data": data}])
        decoded = codecs.decode_v2_request(body, None, LIMIT)
        assert decoded.inputs["x"].dtype == dtype
        np.testing.assert_array_equal(decoded.inputs["x"], expected)


def test_binary_tensors_follow_the_json_header_in_input_order() -> None:
    first = np.arange(6, dtype=np.float16).reshape(3, 2)
    second = np.array([[1, -2]], dtype=np.int64)
    header = orjson.dumps({"inputs": [
        {"name": "a", "datatype": "FP16", "shape": [3, 2],
         "parameters": {"binary_data_size": first.nbytes}},
        {"name": "b", "datatype": "INT64", "shape": [1, 2],
         "parameters": {"binary_data_size": second.nbytes}}],
        "parameters": {"binary_data_output": True, "timeout": 5000}, "id": "r1"})
    body = header + first.tobytes() + second.tobytes()
    decoded = codecs.decode_v2_request(body, len(header), LIMIT)
    np.testing.assert_array_equal(decoded.inputs["a"], first)
    np.testing.assert_array_equal(decoded.inputs["b"], second)
    assert decoded.binary_output and decoded.timeout_us == 5000 and decoded.id == "r1"


@pytest.mark.parametrize(("entry", "message"), [
    ({"name": "x", "datatype": "BYTES", "shape": [1], "data": [1]},
     "a BYTES tensor's data must hold strings"),
    ({"name": "x", "datatype": "FP8", "shape": [1], "data": [1]}, "unknown datatype 'FP8'"),
    ({"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3]},
     "shape [2, 2] needs 4 elements, but data has 3"),
    ({"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [[1], [2, 3]]},
     "cannot be read"),
    ({"name": "x", "datatype": "FP32", "shape": [2], "data": [[1], [2]]},
     "nested more than 1 arrays deep"),
    ({"name": "x", "datatype": "INT8", "shape": [1], "data": [300]}, "cannot be read as INT8"),
    ({"name": "x", "datatype": "FP32", "shape": [1]}, "no 'data'"),
    ({"name": "x", "datatype": "FP32", "shape": [-1], "data": [1]}, "non-negative integers"),
    ({"datatype": "FP32", "shape": [1], "data": [1]}, "'name' must be a non-empty string"),
])
def test_bad_json_tensors_are_400_naming_the_problem(entry: dict, message: str) -> None:
    with pytest.raises(BadRequest, match=None) as caught:
        codecs.decode_v2_request(_request([entry]), None, LIMIT)
    assert message in str(caught.value)


def test_binary_size_mismatch_and_leftover_bytes_are_400() -> None:
    header = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2],
                                       "parameters": {"binary_data_size": 4}}]})
    with pytest.raises(BadRequest, match="needs 8 bytes"):
        codecs.decode_v2_request(header + b"\0" * 4, len(header), LIMIT)
    header = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1],
                                       "parameters": {"binary_data_size": 4}}]})
    with pytest.raises(BadRequest, match="4 bytes of binary data that no input claims"):
        codecs.decode_v2_request(header + b"\0" * 8, len(header), LIMIT)
    with pytest.raises(BadRequest, match="ends after 2 of 4 bytes"):
        codecs.decode_v2_request(header + b"\0" * 2, len(header), LIMIT)
    with pytest.raises(BadRequest, match="Inference-Header-Content-Length is 999"):
        codecs.decode_v2_request(header, 999, LIMIT)


def test_not_json_and_too_many_elements() -> None:
    with pytest.raises(BadRequest, match="not valid JSON"):
        codecs.decode_v2_request(b"{nope", None, LIMIT)
    body = _request([{"name": "x", "datatype": "FP32", "shape": [1000, 1000], "data": [0]}])
    with pytest.raises(PayloadTooLarge, match="1000000 elements exceed the limit of 1000"):
        codecs.decode_v2_request(body, None, 1000)


def test_encode_json_and_binary_outputs() -> None:
    outputs = {"y": np.array([[1.5, -2.0]], np.float32), "z": np.array([[1, 2]], np.int32)}
    body, header = codecs.encode_v2_response("m", 3, outputs, {"y": False, "z": True}, "id7")
    assert header is not None
    parsed = orjson.loads(body[:header])
    assert parsed["model_name"] == "m" and parsed["model_version"] == "3" and parsed["id"] == "id7"
    assert parsed["outputs"][0] == {"name": "y", "datatype": "FP32", "shape": [1, 2],
                                    "data": [1.5, -2.0]}
    assert parsed["outputs"][1]["parameters"] == {"binary_data_size": 8}
    np.testing.assert_array_equal(np.frombuffer(body[header:], np.int32), [1, 2])
    body, header = codecs.encode_v2_response("m", 1, outputs, {"y": False, "z": False}, None)
    assert header is None and "id" not in orjson.loads(body)
