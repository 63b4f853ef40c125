"""V2 inference bodies over REST: a request to `V2Request`, outputs to the response body.

A request is JSON (`service.tensors.json`) or a JSON header with the binary-tensor extension
(`service.tensors.binary`); each input's datatype, shape and element count are read through
`service.tensors.datatypes`, as gRPC's are. Only conversions live here; checking tensors
against a model's config is the data plane's job (`service.dataplane.checks`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from engine.serving.config import datatype_of
from engine.serving.sequences import SequenceControl
from service.errors import BadRequest
from service.tensors import binary, classification, json
from service.tensors.datatypes import (
    BYTES,
    NameCheck,
    check_elements,
    dtype_of,
    read_shape,
    wrong_count,
)


@dataclass
class RequestedOutput:
    """An entry of a V2 request's ``outputs``: which tensor, whether as binary data, and how
    many top classes to return instead of its values (classification extension)."""

    name: str
    binary: bool | None = None
    classification: int | None = None


@dataclass
class V2Request:
    """A decoded V2 inference request."""

    inputs: dict[str, np.ndarray]
    datatypes: dict[str, str]
    id: str | None = None
    outputs: list[RequestedOutput] | None = None
    binary_output: bool = False
    timeout_us: int | None = None
    priority: int = 0
    parameters: dict[str, Any] = field(default_factory=dict)


def _parameters(entry: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An entry's ``parameters`` object: ``{}`` when absent or null, else a JSON object."""
    parameters = entry.get("parameters")
    return {} if parameters is None else json.as_object(parameters, f"{where}: parameters")


def _decode_input(entry: Any, index: int, section: memoryview, offset: int, max_elements: int,
                  read: np.ndarray | None, check_name: NameCheck | None
                  ) -> tuple[str, str, np.ndarray, int]:
    """One entry of ``inputs`` (numbers, or BYTES: strings in JSON, length-prefixed binary
    data); `read` is its ``data`` when `json.read_v2_header` read it already."""
    where = f"inputs[{index}]"
    entry = json.as_object(entry, where)
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}: 'name' must be a non-empty string")
    if check_name is not None:
        check_name(name)
    where = f"input {name!r}"
    datatype = entry.get("datatype")
    dtype = None if datatype == BYTES else dtype_of(datatype, where)
    shape = read_shape(entry.get("shape"), where)
    count = math.prod(shape)
    check_elements(count, max_elements, where)
    size = _binary_size(entry, where)
    if size is not None:
        if dtype is None:
            if type(size) is not int or size < 0:
                raise BadRequest(f"{where}: binary_data_size must be a non-negative integer, "
                                 f"got {size!r:.50}")
            data = binary.take(section, offset, size, where)
            return name, BYTES, binary.bytes_from_binary(data, shape, where), offset + size
        expected = count * dtype.itemsize
        if type(size) is not int or size != expected:
            raise BadRequest(f"{where}: binary_data_size is {size!r}; shape {list(shape)} of "
                             f"{datatype} needs {expected} bytes")
        data = binary.take(section, offset, size, where)
        return name, datatype, binary.array_from_bytes(data, dtype, shape), offset + size
    if "data" not in entry:
        raise BadRequest(f"{where}: no 'data' and no binary_data_size parameter")
    if dtype is None:
        return name, BYTES, json.bytes_from_json(entry["data"], shape, where), offset
    array = read if read is not None else json.array_from_json(entry["data"], dtype, where,
                                                               max(len(shape), 1))
    if array.size != count:
        raise wrong_count(shape, array.size, where)
    return name, datatype, array.reshape(shape), offset


def _binary_size(entry: Mapping[str, Any], where: str) -> Any:
    """The entry's ``binary_data_size`` parameter (None: its data is JSON)."""
    size = _parameters(entry, where).get("binary_data_size")
    if size is not None and "data" in entry:
        raise BadRequest(f"{where}: give either 'data' or binary_data_size, not both")
    return size


def _decode_outputs(value: Any) -> list[RequestedOutput] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise BadRequest(f"outputs must be a list, got {type(value).__name__}")
    requested = []
    for index, entry in enumerate(value):
        entry = json.as_object(entry, f"outputs[{index}]")
        name = entry.get("name")
        if not isinstance(name, str):
            raise BadRequest(f"outputs[{index}]: 'name' must be a string")
        if any(output.name == name for output in requested):
            raise BadRequest(f"output {name!r} is requested twice; name each output once")
        parameters = _parameters(entry, f"output {name!r}")
        requested.append(RequestedOutput(
            name, json.flag(parameters, "binary_data", f"output {name!r}: parameters."),
            classification.count_of(parameters.get("classification"), f"output {name!r}")))
    return requested


def _timeout_us(parameters: Mapping[str, Any]) -> int | None:
    """The ``timeout`` parameter in microseconds; None when absent or 0, which Triton reads as
    no timeout."""
    timeout = parameters.get("timeout")
    if timeout is None:
        return None
    if type(timeout) is not int or timeout < 0:
        raise BadRequest(f"parameters.timeout must be a non-negative integer (microseconds; "
                         f"0: none), got {timeout!r}")
    return timeout or None


def _priority(parameters: Mapping[str, Any]) -> int:
    """The ``priority`` parameter: a level of the model's priority_levels, 1 highest; 0 when
    absent (the model's default level)."""
    priority = parameters.get("priority")
    if priority is None:
        return 0
    if type(priority) is not int or priority < 0:
        raise BadRequest(f"parameters.priority must be a non-negative integer (1: highest; "
                         f"0: the model's default level), got {priority!r:.50}")
    return priority


def sequence_of(parameters: Mapping[str, Any]) -> SequenceControl | None:
    """A request's place in its sequence, from Triton's request parameters ``sequence_id``
    (an integer or a string), ``sequence_start`` and ``sequence_end`` (booleans); None when
    it names no sequence (no id, 0 or "", which Triton reads as none)."""
    start = json.flag(parameters, "sequence_start", "parameters.")
    end = json.flag(parameters, "sequence_end", "parameters.")
    return sequence_control(parameters.get("sequence_id"), bool(start), bool(end))


def sequence_control(sequence_id: Any, start: bool, end: bool) -> SequenceControl | None:
    """`sequence_of` once each protocol has read its parameters' values: the id checked."""
    if type(sequence_id) is int and sequence_id < 0:
        raise BadRequest(f"parameters.sequence_id must be a non-negative integer or a string, "
                         f"got {sequence_id}")
    if type(sequence_id) not in (int, str, type(None)):
        raise BadRequest(f"parameters.sequence_id must be an integer or a string, got "
                         f"{sequence_id!r:.50}")
    if sequence_id in (None, 0, ""):
        return None
    return SequenceControl(sequence_id, start, end)


def decode_v2_request(body: bytes, header_length: int | None, max_elements: int,
                      check_name: NameCheck | None = None) -> V2Request:
    """Decode a V2 inference request, JSON or with the binary-tensor extension; each input's
    name passes `check_name` (which raises for a name the model lacks) before the rest of it
    is read."""
    header, section = binary.split_body(body, header_length)
    document, read = json.read_v2_header(header)
    request = json.as_object(document, "inference request")
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadRequest("inference request: 'inputs' must be a non-empty list of tensors")
    parameters = _parameters(request, "inference request")
    arrays: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    offset = 0
    for index, entry in enumerate(inputs):
        name, datatype, array, offset = _decode_input(entry, index, section, offset,
                                                      max_elements, read.get(index),
                                                      check_name)
        if name in arrays:
            raise BadRequest(f"input {name!r} is given twice")
        arrays[name], datatypes[name] = array, datatype
    if offset != len(section):
        raise BadRequest(f"the body has {len(section) - offset} bytes of binary data that no "
                         "input claims (check binary_data_size)")
    request_id = request.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest(f"'id' must be a string, got {type(request_id).__name__}")
    return V2Request(arrays, datatypes, request_id, _decode_outputs(request.get("outputs")),
                     bool(json.flag(parameters, "binary_data_output", "parameters.")),
                     _timeout_us(parameters), _priority(parameters), parameters)


def decode_raw_request(body: bytes, name: str, datatype: str, template: Sequence[int],
                       max_elements: int, batch_axis: int | None = 0) -> V2Request:
    """A raw binary request for the model's one input `name` (one row at `batch_axis`; None:
    no batch dimension); every output comes back as binary data, as the extension says."""
    where = f"input {name!r}"
    dtype = dtype_of(datatype, where)
    shape = binary.raw_shape(template, len(body), dtype.itemsize, where, batch_axis)
    check_elements(math.prod(shape), max_elements, where)
    return V2Request({name: binary.array_from_bytes(body, dtype, shape)}, {name: datatype},
                     binary_output=True)


def encode_v2_response(model: str, version: int, outputs: Mapping[str, np.ndarray],
                       binary_outputs: Mapping[str, bool], request_id: str | None
                       ) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when some outputs are binary. An
    object array of byte strings is a BYTES tensor (a classification result)."""
    tensors = []
    chunks = []
    for name, array in outputs.items():
        strings = array.dtype == object
        tensor: dict[str, Any] = {"name": name,
                                  "datatype": BYTES if strings else datatype_of(array.dtype),
                                  "shape": list(array.shape)}
        if binary_outputs.get(name, False):
            raw = binary.tensor_bytes(array)
            tensor["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        elif strings:
            tensor["data"] = [element.decode("utf-8") for element in array.reshape(-1)]
        else:
            tensor["data"] = json.json_ready(array.reshape(-1))
        tensors.append(tensor)
    response: dict[str, Any] = {"model_name": model, "model_version": str(version),
                                "outputs": tensors}
    if request_id is not None:
        response["id"] = request_id
    header = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)
