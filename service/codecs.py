"""Tensors on the wire: V2 JSON and binary tensors, and /predict's nested lists, to/from numpy.

Only conversions live here (datatype names, byte layouts, element counts); checking tensors
against a model's config is `service.inference`'s job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from engine.serving.config import DATATYPES, datatype_of
from service import bytes_tensors, classification, json_tensors
from service.errors import BadRequest, PayloadTooLarge

HEADER_LENGTH = "Inference-Header-Content-Length"
MAX_DIMENSIONS = json_tensors.MAX_DEPTH


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
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class PredictRequest:
    """A decoded ``POST /predict`` body; inputs are still JSON values (no dtype known yet):
    Python scalars or `json_tensors` proxies."""

    model: str
    version: str | None
    inputs: dict[str, Any]
    brackets: int  # how many "[" the body holds: see `json_tensors.read_floats`


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _parameters(entry: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An entry's ``parameters`` object: ``{}`` when absent or null, else a JSON object."""
    parameters = entry.get("parameters")
    return {} if parameters is None else _object(parameters, f"{where}: parameters")


def dtype_of(datatype: Any, where: str) -> np.dtype:
    """The numpy dtype of a V2 datatype name; 400 for BYTES and unknown names."""
    if datatype == "BYTES":
        raise BadRequest(f"{where}: datatype BYTES is only for inputs with a preprocess "
                         f"pipeline (encoded images); use one of {', '.join(DATATYPES)}")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise BadRequest(f"{where}: unknown datatype {datatype!r}; expected one of "
                         f"{', '.join(DATATYPES)}")
    return DATATYPES[datatype]


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if (not isinstance(value, list) or len(value) > MAX_DIMENSIONS
            or not all(type(dim) is int and dim >= 0 for dim in value)):
        raise BadRequest(f"{where}: shape must be a list of at most {MAX_DIMENSIONS} "
                         f"non-negative integers, got {value!r:.200}")
    return tuple(value)


def check_elements(count: int, limit: int, where: str) -> None:
    """413 when a tensor holds more than `limit` elements."""
    if count > limit:
        raise PayloadTooLarge(f"{where}: {count} elements exceed the limit of {limit} elements "
                              "per tensor (max_tensor_elements)")


def check_depth(data: Any, max_depth: int, where: str) -> None:
    """400 when `data` nests arrays deeper than `max_depth` (the rank of the tensor's shape)."""
    if json_tensors.nesting_depth(data, max_depth) > max_depth:
        raise BadRequest(f"{where}: data is nested more than {max_depth} arrays deep; its "
                         f"shape has {max_depth} dimension{'s' if max_depth > 1 else ''}, so "
                         f"at most {max_depth} levels")


def array_from_json(data: Any, dtype: np.dtype, where: str,
                    max_depth: int = MAX_DIMENSIONS) -> np.ndarray:
    """A numpy array of `dtype` from a JSON value (a number or a nested or flat list) nested
    no deeper than `max_depth` arrays."""
    if isinstance(data, (dict, str)) or data is None:
        raise BadRequest(f"{where}: data must be a number or a (nested) list of numbers, got "
                         f"{type(data).__name__}")
    check_depth(data, max_depth, where)
    stray = json_tensors.first_non_number(data, booleans=dtype == np.bool_)
    if stray is not None:
        raise BadRequest(f"{where}: data must hold only numbers, got {stray!r:.50} "
                         f"({type(stray).__name__})")
    try:
        return np.asarray(data, dtype=dtype)
    except (ValueError, TypeError, OverflowError, RecursionError) as error:
        raise BadRequest(f"{where}: data cannot be read as {datatype_of(dtype)}: "
                         f"{error}") from None


def header_length(value: str | None) -> int | None:
    """The value of Inference-Header-Content-Length, or None when the header is absent."""
    if value is None:
        return None
    if not value.isdigit():
        raise BadRequest(f"{HEADER_LENGTH} must be a non-negative integer, got {value!r:.50}")
    return int(value)


def _split_body(body: bytes, header_length: int | None) -> tuple[bytes, memoryview]:
    if header_length is None:
        return body, memoryview(b"")
    if not 0 < header_length <= len(body):
        raise BadRequest(f"{HEADER_LENGTH} is {header_length}, but the body has {len(body)} "
                         "bytes; it must give the length of the JSON header")
    view = memoryview(body)
    return bytes(view[:header_length]), view[header_length:]


def _decode_input(entry: Any, index: int, binary: memoryview, offset: int, max_elements: int,
                  read: np.ndarray | None) -> tuple[str, str, np.ndarray, int]:
    """One entry of ``inputs``; `read` is its ``data`` when `json_tensors` read it already."""
    where = f"inputs[{index}]"
    entry = _object(entry, where)
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}: 'name' must be a non-empty string")
    where = f"input {name!r}"
    datatype = entry.get("datatype")
    if datatype == "BYTES":
        return _decode_bytes_input(entry, name, binary, offset, max_elements)
    dtype = dtype_of(datatype, where)
    shape = _shape(entry.get("shape"), where)
    count = math.prod(shape)
    check_elements(count, max_elements, where)
    size = _binary_size(entry, where)
    if size is not None:
        expected = count * dtype.itemsize
        if type(size) is not int or size != expected:
            raise BadRequest(f"{where}: binary_data_size is {size!r}; shape {list(shape)} of "
                             f"{datatype} needs {expected} bytes")
        if offset + size > len(binary):
            raise BadRequest(f"{where}: binary data ends after {len(binary) - offset} of "
                             f"{size} bytes")
        array = np.frombuffer(binary[offset:offset + size], dtype=dtype.newbyteorder("<"))
        return name, datatype, array.reshape(shape), offset + size
    if "data" not in entry:
        raise BadRequest(f"{where}: no 'data' and no binary_data_size parameter")
    array = read if read is not None else array_from_json(
        json_tensors.plain(entry["data"]), dtype, where, max(len(shape), 1))
    if array.size != count:
        raise BadRequest(f"{where}: shape {list(shape)} needs {count} elements, but data has "
                         f"{array.size}")
    return name, datatype, array.reshape(shape), offset


def _binary_size(entry: Mapping[str, Any], where: str) -> Any:
    """The entry's ``binary_data_size`` parameter (None: its data is JSON)."""
    size = _parameters(entry, where).get("binary_data_size")
    if size is not None and "data" in entry:
        raise BadRequest(f"{where}: give either 'data' or binary_data_size, not both")
    return size


def _decode_bytes_input(entry: Mapping[str, Any], name: str, binary: memoryview, offset: int,
                        max_elements: int) -> tuple[str, str, np.ndarray, int]:
    """A BYTES entry (encoded images): strings in JSON, or length-prefixed binary data."""
    where = f"input {name!r}"
    shape = _shape(entry.get("shape"), where)
    check_elements(math.prod(shape), max_elements, where)
    size = _binary_size(entry, where)
    if size is not None:
        if type(size) is not int or size < 0:
            raise BadRequest(f"{where}: binary_data_size must be a non-negative integer, got "
                             f"{size!r:.50}")
        if offset + size > len(binary):
            raise BadRequest(f"{where}: binary data ends after {len(binary) - offset} of "
                             f"{size} bytes")
        array = bytes_tensors.from_binary(binary[offset:offset + size], shape, where)
        return name, "BYTES", array, offset + size
    if "data" not in entry:
        raise BadRequest(f"{where}: no 'data' and no binary_data_size parameter")
    return name, "BYTES", bytes_tensors.from_json(json_tensors.plain(entry["data"]), shape,
                                                  where), offset


def flag(parameters: Mapping[str, Any], key: str, where: str) -> bool | None:
    """A boolean parameter (``binary_data``, ``binary_data_output``): None when absent, a 400
    when it is not a JSON boolean (``"false"`` is a string, and would read as true)."""
    value = parameters.get(key)
    if value is not None and type(value) is not bool:
        raise BadRequest(f"{where}{key} must be a JSON boolean (true or false), got "
                         f"{value!r:.50}")
    return value


def _decode_outputs(value: Any) -> list[RequestedOutput] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise BadRequest(f"outputs must be a list, got {type(value).__name__}")
    requested = []
    for index, entry in enumerate(value):
        entry = _object(entry, f"outputs[{index}]")
        name = entry.get("name")
        if not isinstance(name, str):
            raise BadRequest(f"outputs[{index}]: 'name' must be a string")
        if any(output.name == name for output in requested):
            raise BadRequest(f"output {name!r} is requested twice; name each output once")
        parameters = _parameters(entry, f"output {name!r}")
        requested.append(RequestedOutput(
            name, flag(parameters, "binary_data", f"output {name!r}: parameters."),
            classification.count_of(parameters.get("classification"), f"output {name!r}")))
    return requested


def _timeout_us(parameters: Mapping[str, Any]) -> int | None:
    timeout = parameters.get("timeout")
    if timeout is None:
        return None
    if type(timeout) is not int or timeout <= 0:
        raise BadRequest(f"parameters.timeout must be a positive integer (microseconds), got "
                         f"{timeout!r}")
    return timeout


def _read_json_data(request: dict[str, Any], inputs: list[Any],
                    brackets: int) -> dict[int, np.ndarray]:
    """The ``data`` of every JSON tensor, by input index, when all are floating-point arrays
    `json_tensors.read_floats` can read; else nothing (each is read from Python lists)."""
    values: dict[int, Any] = {}
    dtypes: dict[int, np.dtype] = {}
    depths: dict[int, int] = {}
    for index, entry in enumerate(inputs):
        if isinstance(entry, dict) and "data" in entry:
            datatype, shape = entry.get("datatype"), entry.get("shape")
            if (not isinstance(datatype, str) or datatype not in DATATYPES
                    or not isinstance(shape, list)):
                return {}
            values[index], dtypes[index] = entry["data"], DATATYPES[datatype]
            depths[index] = max(min(len(shape), MAX_DIMENSIONS), 1)
    if not values:
        return {}
    # The header's other arrays (inputs, shapes, outputs...) are Python lists by now.
    return json_tensors.read_floats(values, dtypes,
                                    brackets - json_tensors.count_arrays(request), depths) or {}


def decode_v2_request(body: bytes, header_length: int | None, max_elements: int) -> V2Request:
    """Decode a V2 inference request, JSON or with the binary-tensor extension."""
    header, binary = _split_body(body, header_length)
    request = _object(json_tensors.with_tensor_data(
        json_tensors.parse(header, "inference request header")), "inference request")
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadRequest("inference request: 'inputs' must be a non-empty list of tensors")
    parameters = _parameters(request, "inference request")
    read = _read_json_data(request, inputs, json_tensors.brackets(header))
    arrays: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    offset = 0
    for index, entry in enumerate(inputs):
        name, datatype, array, offset = _decode_input(entry, index, binary, offset, max_elements,
                                                      read.get(index))
        if name in arrays:
            raise BadRequest(f"input {name!r} is given twice")
        arrays[name], datatypes[name] = array, datatype
    if offset != len(binary):
        raise BadRequest(f"the body has {len(binary) - offset} bytes of binary data that no "
                         "input claims (check binary_data_size)")
    request_id = request.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest(f"'id' must be a string, got {type(request_id).__name__}")
    return V2Request(arrays, datatypes, request_id, _decode_outputs(request.get("outputs")),
                     bool(flag(parameters, "binary_data_output", "parameters.")),
                     _timeout_us(parameters), parameters)


def raw_shape(template: Sequence[int], size: int, itemsize: int, where: str
              ) -> tuple[int, ...]:
    """The shape of a raw binary request's tensor (Triton's binary-data extension: a body of
    tensor bytes alone, Inference-Header-Content-Length 0): one row of the config's shape,
    whose one variable dimension, if any, follows from the byte count."""
    dims = list(template[1:])
    variable = [axis for axis, dim in enumerate(dims) if dim == -1]
    if len(variable) > 1:
        raise BadRequest(f"{where}: a raw binary request (Inference-Header-Content-Length 0) "
                         f"cannot give a shape, and {list(template)} has {len(variable)} "
                         "variable dimensions besides the batch; send a JSON header with the "
                         "shape")
    row = math.prod(dim for dim in dims if dim != -1) * itemsize
    if size == 0 or size % row:
        raise BadRequest(f"{where}: a raw binary request of {size} bytes does not fill whole "
                         f"tensors of shape {list(template)} ({row} bytes per "
                         f"{'step' if variable else 'row'})")
    if variable:
        dims[variable[0]] = size // row
    elif size != row:
        raise BadRequest(f"{where}: a raw binary request is one row of {row} bytes (shape "
                         f"{[1, *dims]}), got {size} bytes")
    return (1, *dims)


def decode_raw_request(body: bytes, name: str, datatype: str, template: Sequence[int],
                       max_elements: int) -> V2Request:
    """A raw binary request for the model's one input `name`; every output comes back as
    binary data, as the extension says."""
    where = f"input {name!r}"
    dtype = dtype_of(datatype, where)
    shape = raw_shape(template, len(body), dtype.itemsize, where)
    check_elements(math.prod(shape), max_elements, where)
    array = np.frombuffer(body, dtype=dtype.newbyteorder("<")).reshape(shape)
    return V2Request({name: array}, {name: datatype}, binary_output=True)


def _json_ready(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array orjson can write (it has no float16 writer for every version)."""
    if array.dtype == np.float16:
        array = array.astype(np.float32)
    return np.ascontiguousarray(array)


def encode_v2_response(model: str, version: int, outputs: Mapping[str, np.ndarray],
                       binary: Mapping[str, bool], request_id: str | None
                       ) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when some outputs are binary. An
    object array of byte strings is a BYTES tensor (a classification result)."""
    tensors = []
    chunks = []
    for name, array in outputs.items():
        strings = array.dtype == object
        tensor: dict[str, Any] = {"name": name,
                                  "datatype": "BYTES" if strings else datatype_of(array.dtype),
                                  "shape": list(array.shape)}
        if binary.get(name, False):
            raw = bytes_tensor(array) if strings else np.ascontiguousarray(
                array, dtype=array.dtype.newbyteorder("<")).tobytes()
            tensor["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        elif strings:
            tensor["data"] = [element.decode("utf-8") for element in array.reshape(-1)]
        else:
            tensor["data"] = _json_ready(array).reshape(-1)
        tensors.append(tensor)
    response: dict[str, Any] = {"model_name": model, "model_version": str(version),
                                "outputs": tensors}
    if request_id is not None:
        response["id"] = request_id
    header = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


def bytes_tensor(array: np.ndarray) -> bytes:
    """A BYTES tensor's binary data: each element, row-major, as a 4-byte little-endian length
    and then its bytes."""
    return b"".join(len(element).to_bytes(4, "little") + element
                    for element in array.reshape(-1))


def decode_predict(body: bytes) -> PredictRequest:
    """Decode ``{"model": NAME, "version": optional, "inputs": {name: nested list}}``."""
    document = json_tensors.parse(body)
    if not isinstance(document, json_tensors.Object):
        _object(json_tensors.plain(document), "predict request")
    request = json_tensors.members(document)
    unknown = sorted(set(request) - {"model", "version", "inputs"})
    if unknown:
        raise BadRequest(f"predict request: unknown fields {unknown}; expected model, version, "
                         "inputs")
    model = request.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("predict request: 'model' must be a non-empty string")
    version = request.get("version")
    if version is not None and (isinstance(version, bool)
                                or not isinstance(version, (int, str))):
        raise BadRequest(f"predict request: 'version' must be an integer or a string, got "
                         f"{json_tensors.plain(version)!r:.50}")
    inputs = request.get("inputs")
    if not isinstance(inputs, json_tensors.Object):
        _object(json_tensors.plain(inputs), "predict request: 'inputs'")
    if not inputs:
        raise BadRequest("predict request: 'inputs' must name at least one input")
    return PredictRequest(model, None if version is None else str(version),
                          json_tensors.members(inputs), json_tensors.brackets(body))


def predict_arrays(request: PredictRequest, dtypes: Mapping[str, np.dtype],
                   max_elements: int, ranks: Mapping[str, int] | None = None
                   ) -> dict[str, np.ndarray]:
    """The inputs as arrays of each input's dtype, nested no deeper than its rank in `ranks`
    (inputs not in `dtypes` are left to the caller's name check, converted as float32)."""
    depths = {name: (ranks or {}).get(name, MAX_DIMENSIONS) for name in request.inputs}
    arrays = json_tensors.read_floats(request.inputs, dtypes, request.brackets, depths)
    if arrays is None:
        arrays = {name: array_from_json(json_tensors.plain(value),
                                        dtypes.get(name, np.dtype(np.float32)),
                                        f"input {name!r}", depths[name])
                  for name, value in request.inputs.items()}
    for name, array in arrays.items():
        check_elements(array.size, max_elements, f"input {name!r}")
    return arrays


def predict_outputs(outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs ready for orjson to write as nested lists."""
    return {name: _json_ready(array) for name, array in outputs.items()}


def names(values: Sequence[str]) -> str:
    """Names quoted for an error message."""
    return ", ".join(repr(value) for value in values)
