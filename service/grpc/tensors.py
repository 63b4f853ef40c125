"""Tensors in gRPC messages to and from numpy: raw little-endian bytes, or typed contents.

The protobuf form of the tensor layer (`service.tensors`, which reads REST's JSON and binary
extension): a tensor's datatype, shape and element count are read through
`service.tensors.datatypes`, and raw contents in the binary extension's layout
(`service.tensors.binary`), so both protocols refuse the same inputs with the same messages.
It stays beside the gRPC server because it reads the generated messages (`inference_pb2`),
which belong to this package.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from engine.serving.config import datatype_of
from engine.serving.sequences import SequenceControl
from service.errors import BadRequest
from service.grpc import inference_pb2 as pb
from service.tensors import binary, classification
from service.tensors.datatypes import (
    BYTES,
    NameCheck,
    check_elements,
    dtype_of,
    object_array,
    read_shape,
    wrong_count,
)
from service.tensors.v2 import sequence_control

# The `InferTensorContents` field that carries each datatype (FP16 has none: raw bytes only).
CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents",
}


class GrpcInputs(NamedTuple):
    """The decoded inputs of a ``ModelInferRequest``."""

    arrays: dict[str, np.ndarray]
    datatypes: dict[str, str]


def array_from_raw(raw: bytes, datatype: str, shape: Sequence[int], where: str) -> np.ndarray:
    """A read-only array viewing `raw`: little-endian, row-major elements of `datatype`."""
    dtype = dtype_of(datatype, where)
    expected = math.prod(shape) * dtype.itemsize
    if len(raw) != expected:
        raise BadRequest(f"{where}: raw_input_contents holds {len(raw)} bytes; shape "
                         f"{list(shape)} of {datatype} needs {expected} bytes")
    return binary.array_from_bytes(raw, dtype, shape)


def array_from_contents(contents: pb.InferTensorContents, datatype: str,
                        shape: Sequence[int], where: str) -> np.ndarray:
    """An array of `datatype` from the typed field of `contents` that carries it."""
    dtype = dtype_of(datatype, where)
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise BadRequest(f"{where}: datatype {datatype} has no typed contents field; send it "
                         "in raw_input_contents")
    others = [descriptor.name for descriptor, _ in contents.ListFields()
              if descriptor.name != field]
    if others:
        raise BadRequest(f"{where}: datatype {datatype} is carried in contents.{field}, but "
                         f"the request fills contents.{others[0]}")
    values = getattr(contents, field)
    if len(values) != math.prod(shape):
        raise wrong_count(shape, len(values), where)
    try:
        array = np.array(values, dtype=dtype)
    except OverflowError as error:
        raise BadRequest(f"{where}: data cannot be read as {datatype}: {error}") from None
    return array.reshape(shape)


def _bytes_contents(contents: pb.InferTensorContents, shape: Sequence[int],
                    where: str) -> np.ndarray:
    """A BYTES tensor (encoded images) from ``contents.bytes_contents``."""
    others = [descriptor.name for descriptor, _ in contents.ListFields()
              if descriptor.name != "bytes_contents"]
    if others:
        raise BadRequest(f"{where}: datatype BYTES is carried in contents.bytes_contents, but "
                         f"the request fills contents.{others[0]}")
    if len(contents.bytes_contents) != math.prod(shape):
        raise wrong_count(shape, len(contents.bytes_contents), where)
    return object_array(list(contents.bytes_contents), shape)


def decode_inputs(request: pb.ModelInferRequest, max_elements: int,
                  check_name: NameCheck | None = None) -> GrpcInputs:
    """The request's inputs as arrays, from raw_input_contents or from typed contents; each
    input's name passes `check_name` before the rest of the tensor is read."""
    if not request.inputs:
        raise BadRequest("inference request: 'inputs' must be a non-empty list of tensors")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise BadRequest(f"inference request: {len(raw)} raw_input_contents for "
                         f"{len(request.inputs)} inputs; give one per input, in order, or none")
    decoded = GrpcInputs({}, {})
    for index, tensor in enumerate(request.inputs):
        if not tensor.name:
            raise BadRequest(f"inputs[{index}]: 'name' must be a non-empty string")
        if check_name is not None:
            check_name(tensor.name)
        where = f"input {tensor.name!r}"
        if tensor.datatype != BYTES:
            dtype_of(tensor.datatype, where)
        shape = read_shape(list(tensor.shape), where)
        check_elements(math.prod(shape), max_elements, where)
        if raw and tensor.HasField("contents"):
            raise BadRequest(f"{where}: give either contents or raw_input_contents, not both")
        if tensor.datatype == BYTES:
            array = (binary.bytes_from_binary(memoryview(raw[index]), shape, where) if raw
                     else _bytes_contents(tensor.contents, shape, where))
        else:
            array = (array_from_raw(raw[index], tensor.datatype, shape, where) if raw
                     else array_from_contents(tensor.contents, tensor.datatype, shape, where))
        if tensor.name in decoded.arrays:
            raise BadRequest(f"input {tensor.name!r} is given twice")
        decoded.arrays[tensor.name] = array
        decoded.datatypes[tensor.name] = tensor.datatype
    return decoded


def timeout_s(parameters: Mapping[str, pb.InferParameter]) -> float | None:
    """The request's ``timeout`` parameter (microseconds) in seconds; None when absent or 0,
    which Triton reads as no timeout."""
    if "timeout" not in parameters:
        return None
    parameter = parameters["timeout"]
    kind = parameter.WhichOneof("parameter_choice")
    value = getattr(parameter, kind) if kind else None
    if kind not in ("int64_param", "uint64_param") or value < 0:
        raise BadRequest(f"parameters.timeout must be a non-negative integer (microseconds; "
                         f"0: none), got {value!r}")
    return value / 1e6 or None


def priority(parameters: Mapping[str, pb.InferParameter]) -> int:
    """The request's ``priority`` parameter (int64_param or uint64_param, as REST's integer);
    0 when absent: the model's default level."""
    if "priority" not in parameters:
        return 0
    parameter = parameters["priority"]
    kind = parameter.WhichOneof("parameter_choice")
    value = getattr(parameter, kind) if kind else None
    if kind not in ("int64_param", "uint64_param") or value < 0:
        raise BadRequest(f"parameters.priority must be a non-negative integer (1: highest; "
                         f"0: the model's default level), got {value!r:.50}")
    return int(value)


def sequence_of(parameters: Mapping[str, pb.InferParameter]) -> SequenceControl | None:
    """The request's place in its sequence (``sequence_id`` as int64_param, uint64_param or
    string_param; ``sequence_start`` and ``sequence_end`` as bool_param), as REST reads it."""
    values = {}
    for key in ("sequence_id", "sequence_start", "sequence_end"):
        if key in parameters:
            kind = parameters[key].WhichOneof("parameter_choice")
            values[key] = getattr(parameters[key], kind) if kind else None
    for key in ("sequence_start", "sequence_end"):
        if type(values.get(key, False)) is not bool:
            raise BadRequest(f"parameters.{key} must be a bool_param, got {values[key]!r:.50}")
    return sequence_control(values.get("sequence_id"), values.get("sequence_start", False),
                            values.get("sequence_end", False))


def classification_counts(request: pb.ModelInferRequest) -> dict[str, int]:
    """Requested outputs whose ``classification`` parameter asks for their top classes."""
    counts = {}
    for output in request.outputs:
        if "classification" not in output.parameters:
            continue
        parameter = output.parameters["classification"]
        kind = parameter.WhichOneof("parameter_choice")
        value = getattr(parameter, kind) if kind else None  # count_of refuses non-integers
        count = classification.count_of(value, f"output {output.name!r}")
        if count is not None:
            counts[output.name] = count
    return counts


def encode_outputs(response: pb.ModelInferResponse, outputs: Mapping[str, np.ndarray]) -> None:
    """Add `outputs` to `response` as raw little-endian bytes, in order; an object array of
    byte strings (a classification result) as BYTES, each element length-prefixed."""
    for name, array in outputs.items():
        tensor = response.outputs.add()
        tensor.name = name
        tensor.shape.extend(array.shape)
        tensor.datatype = BYTES if array.dtype == object else datatype_of(array.dtype)
        response.raw_output_contents.append(binary.tensor_bytes(array))
