"""BYTES tensors in V2 requests: base64 strings in JSON, length-prefixed binary data."""

from __future__ import annotations

import orjson
import pytest

from engine.errors import InputError
from service.errors import BadRequest
from service.tensors import v2 as codecs
from service.tensors.images import image_bytes

LIMIT = 1 << 20


def _prefixed(*elements: bytes) -> bytes:
    return b"".join(len(element).to_bytes(4, "little") + element for element in elements)


def _binary_request(shape: list[int], data: bytes, size: int | None = None) -> tuple[bytes, int]:
    header = orjson.dumps({"inputs": [{
        "name": "image", "datatype": "BYTES", "shape": shape,
        "parameters": {"binary_data_size": len(data) if size is None else size}}]})
    return header + data, len(header)


def test_binary_bytes_elements_are_length_prefixed() -> None:
    body, length = _binary_request([3], _prefixed(b"\xff\xd8first", b"", b"third\x00"))
    decoded = codecs.decode_v2_request(body, length, LIMIT)
    assert decoded.datatypes == {"image": "BYTES"}
    assert decoded.inputs["image"].tolist() == [b"\xff\xd8first", b"", b"third\x00"]


def test_binary_bytes_beside_a_numeric_tensor_keep_their_offsets() -> None:
    images = _prefixed(b"abc", b"de")
    header = orjson.dumps({"inputs": [
        {"name": "image", "datatype": "BYTES", "shape": [2, 1],
         "parameters": {"binary_data_size": len(images)}},
        {"name": "scale", "datatype": "FP32", "shape": [1],
         "parameters": {"binary_data_size": 4}}]})
    body = header + images + b"\x00\x00\x80\x3f"
    decoded = codecs.decode_v2_request(body, len(header), LIMIT)
    assert decoded.inputs["image"].shape == (2, 1)
    assert decoded.inputs["image"].reshape(-1).tolist() == [b"abc", b"de"]
    assert decoded.inputs["scale"].tolist() == [1.0]


@pytest.mark.parametrize(("shape", "data", "message"), [
    ([2], _prefixed(b"abc"), "binary data ends after 1 of 2 BYTES elements"),
    ([1], (100).to_bytes(4, "little") + b"short", "BYTES element 0 declares 100 bytes, but only "
                                                  "5 remain"),
    ([1], b"\x03\x00", "binary data ends after 0 of 1 BYTES elements"),
    ([1], _prefixed(b"abc") + b"zz", "binary_data_size is 9 bytes, but its 1 BYTES element(s) of "
                                     "shape [1] take 7"),
])
def test_malformed_length_prefixes_are_400_naming_the_input(shape: list[int], data: bytes,
                                                            message: str) -> None:
    body, length = _binary_request(shape, data)
    with pytest.raises(BadRequest) as caught:
        codecs.decode_v2_request(body, length, LIMIT)
    assert str(caught.value).startswith("input 'image': ") and message in str(caught.value)


def test_binary_size_past_the_body_is_400() -> None:
    body, length = _binary_request([1], _prefixed(b"abc"), size=50)
    with pytest.raises(BadRequest, match="input 'image': binary data ends after 7 of 50 bytes"):
        codecs.decode_v2_request(body, length, LIMIT)


def test_json_bytes_are_strings_flat_or_nested() -> None:
    for shape, data in (([2], ["aGk=", "eA=="]), ([2, 1], [["aGk="], ["eA=="]]),
                        ([2, 1], ["aGk=", "eA=="])):
        body = orjson.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": shape,
                                         "data": data}]})
        decoded = codecs.decode_v2_request(body, None, LIMIT)
        assert decoded.inputs["image"].reshape(-1).tolist() == ["aGk=", "eA=="]
        assert decoded.inputs["image"].shape == tuple(shape)


@pytest.mark.parametrize(("shape", "data", "message"), [
    ([2], ["aGk="], "shape [2] needs 2 elements, but data has 1"),
    ([1], [None], "a BYTES tensor's data must hold strings"),
    ([1], [["aGk="]], "nested no deeper than its shape [1]"),
    ([1], [{"b64": "aGk="}], "got {'b64': 'aGk='} (dict)"),
])
def test_bad_json_bytes_are_400_naming_the_input(shape: list[int], data: object,
                                                 message: str) -> None:
    body = orjson.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": shape,
                                     "data": data}]})
    with pytest.raises(BadRequest) as caught:
        codecs.decode_v2_request(body, None, LIMIT)
    assert str(caught.value).startswith("input 'image': ") and message in str(caught.value)


def test_base64_strings_become_image_bytes() -> None:
    assert image_bytes("/9j/4AAQ") == b"\xff\xd8\xff\xe0\x00\x10"
    assert image_bytes("/9j/\n4AAQ\n") == b"\xff\xd8\xff\xe0\x00\x10"  # line-wrapped encoders
    assert image_bytes(b"raw") == b"raw"
    for bad in ("not base64!", "abc", "ab=c"):
        with pytest.raises(InputError, match="the string is not base64"):
            image_bytes(bad)
