"""Triton's classification extension: the strings, their order, and their encodings."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from service.errors import BadRequest
from service.tensors.binary import bytes_tensor
from service.tensors.classification import classify, count_of
from service.tensors.v2 import decode_v2_request, encode_v2_response


def _strings(array: np.ndarray, count: int, labels: list[str] | None = None) -> list[list[str]]:
    return [[element.decode() for element in row]
            for row in classify(array, count, labels, "output 'x'")]


def test_floats_print_as_cpp_to_string_highest_first() -> None:
    # float32 0.1 is 0.100000001490116...; -1e-7 prints as C's "%f" does: "-0.000000".
    values = np.array([[0.1, -2.5, 123456789.0, -1e-7, 0.0]], np.float32)
    assert _strings(values, 5) == [["123456792.000000:2", "0.100000:0", "0.000000:4",
                                    "-0.000000:3", "-2.500000:1"]]


def test_rounding_is_the_exact_decimal_rounding_of_the_double() -> None:
    # 0.1234565 as a double is 0.12345649999...: rounds down; 2.0000005 is 2.00000050000000...01.
    values = np.array([[0.1234565, 2.0000005, -0.0000005]], np.float64)
    assert _strings(values, 3) == [["2.000001:1", "0.123456:0", "-0.000000:2"]]


def test_ties_keep_index_order_and_rows_are_classified_apart() -> None:
    values = np.array([[-1.0, -3.0, -1.0, -2.0], [4.0, 4.0, 4.0, 5.0]], np.float32)
    assert _strings(values, 3) == [["-1.000000:0", "-1.000000:2", "-2.000000:3"],
                                   ["5.000000:3", "4.000000:0", "4.000000:1"]]


def test_count_is_capped_at_the_classes_and_labels_are_appended() -> None:
    result = classify(np.array([[0.2, 0.7, 0.1]], np.float32), 10, ["cat", "dog", "bird"], "x")
    assert result.shape == (1, 3) and result.dtype == object
    assert result.tolist() == [[b"0.700000:1:dog", b"0.200000:0:cat", b"0.100000:2:bird"]]


def test_integers_print_as_plain_decimals_and_rows_flatten() -> None:
    assert _strings(np.array([[250, 3, 255]], np.uint8), 2) == [["255:2", "250:0"]]
    assert _strings(np.array([[[-7, 2], [-9, 0]]], np.int64), 4) == [
        ["2:1", "0:3", "-7:0", "-9:2"]]


@pytest.mark.parametrize("dtype", [np.float16, np.bool_])
def test_datatypes_triton_does_not_classify_are_a_400(dtype: type) -> None:
    with pytest.raises(BadRequest, match="class result not available for an output of"):
        classify(np.zeros((1, 3), dtype), 1, None, "output 'x'")


@pytest.mark.parametrize(("value", "count"), [(None, None), (0, None), (3, 3)])
def test_the_parameter_is_a_count_or_nothing(value: object, count: int | None) -> None:
    assert count_of(value, "output 'x'") == count


@pytest.mark.parametrize("value", [-1, 2.0, "3", True])
def test_the_parameter_must_be_a_non_negative_integer(value: object) -> None:
    with pytest.raises(BadRequest, match="output 'x': parameters.classification"):
        count_of(value, "output 'x'")


def test_a_requested_output_carries_its_class_count() -> None:
    body = orjson.dumps({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1],
                                     "data": [1.0]}],
                         "outputs": [{"name": "p", "parameters": {"classification": 2}},
                                     {"name": "q"}]})
    request = decode_v2_request(body, None, 100)
    assert [(output.name, output.classification) for output in request.outputs or ()] == [
        ("p", 2), ("q", None)]


def test_bytes_outputs_are_strings_in_json_and_length_prefixed_in_binary() -> None:
    strings = np.array([[b"0.5:1", b""], [b"\xc3\xa9:0", b"x"]], dtype=object)
    body, length = encode_v2_response("m", 1, {"p": strings}, {"p": False}, None)
    assert length is None
    assert orjson.loads(body)["outputs"] == [
        {"name": "p", "datatype": "BYTES", "shape": [2, 2], "data": ["0.5:1", "", "é:0", "x"]}]
    body, length = encode_v2_response("m", 1, {"p": strings}, {"p": True}, None)
    assert length is not None
    raw = (b"\x05\x00\x00\x000.5:1" b"\x00\x00\x00\x00" b"\x04\x00\x00\x00\xc3\xa9:0"
           b"\x01\x00\x00\x00x")
    assert body[length:] == raw == bytes_tensor(strings)
    assert orjson.loads(body[:length])["outputs"][0]["parameters"] == {
        "binary_data_size": len(raw)}
