"""Tensors in gRPC messages to and from numpy: raw little-endian bytes, or typed contents.

The REST side's `service.codecs` reads JSON and the binary extension; this module reads the
protobuf form and reuses its datatype and size checks, so both refuse the same inputs with the
same messages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from engine.serving.config import datatype_of
from service import bytes_tensors, classification, codecs
from service.errors import BadRequest
from service.grpc import inference_pb2 as pb

BYTES = "BYTES"
# The `InferTensorContents` field that carries each datatype (FP16 has none: raw bytes only).
CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents",
}


@dataclass
class GrpcInputs:
    """The decoded inputs of a ``ModelInferRequest``."""

    arrays: dict[str, np.ndarray]
    datatypes: dict[str, str]


def array_from_raw(raw: bytes, datatype: str, shape: Sequence[int], where: str) -> np.ndarray:
    """A read-only array viewing `raw`: little-endian, row-major elements of `datatype`."""
    dtype = codecs.dtype_of(datatype, where)
    expected = math.prod(shape) * dtype.itemsize
    if len(raw) != expected:
        raise BadRequest(f"{where}: raw_input_contents holds {len(raw)} bytes; shape "
                         f"{list(shape)} of {datatype} needs {expected} bytes")
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(shape)


def array_from_contents(contents: pb.InferTensorContents, datatype: str,
                        shape: Sequence[int], where: str) -> np.ndarray:
    """An array of `datatype` from the typed field of `contents` that carries it."""
    dtype = codecs.dtype_of(datatype, where)
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
    count = math.prod(shape)
    if len(values) != count:
        raise BadRequest(f"{where}: shape {list(shape)} needs {count} elements, but data has "
                         f"{len(values)}")
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
    count = math.prod(shape)
    if len(contents.bytes_contents) != count:
        raise BadRequest(f"{where}: shape {list(shape)} needs {count} elements, but data has "
                         f"{len(contents.bytes_contents)}")
    array = np.empty(count, dtype=object)
    array[:] = list(contents.bytes_contents)
    return array.reshape(shape)


def _shape(dims: Sequence[int], where: str) -> tuple[int, ...]:
    if len(dims) > codecs.MAX_DIMENSIONS or any(dim < 0 for dim in dims):
        raise BadRequest(f"{where}: shape must be a list of at most {codecs.MAX_DIMENSIONS} "
                         f"non-negative integers, got {list(dims)!r:.200}")
    return tuple(dims)


def decode_inputs(request: pb.ModelInferRequest, max_elements: int) -> GrpcInputs:
    """The request's inputs as arrays, from raw_input_contents or from typed contents."""
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
        where = f"input {tensor.name!r}"
        if tensor.datatype != BYTES:
            codecs.dtype_of(tensor.datatype, where)
        shape = _shape(tensor.shape, where)
        codecs.check_elements(math.prod(shape), max_elements, where)
        if raw and tensor.HasField("contents"):
            raise BadRequest(f"{where}: give either contents or raw_input_contents, not both")
        if tensor.datatype == BYTES:
            array = (bytes_tensors.from_binary(memoryview(raw[index]), shape, where) if raw
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
    """The request's ``timeout`` parameter (microseconds) in seconds, or None."""
    if "timeout" not in parameters:
        return None
    parameter = parameters["timeout"]
    kind = parameter.WhichOneof("parameter_choice")
    value = getattr(parameter, kind) if kind else None
    if kind not in ("int64_param", "uint64_param") or value <= 0:
        raise BadRequest(f"parameters.timeout must be a positive integer (microseconds), got "
                         f"{value!r}")
    return value / 1e6


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
        if array.dtype == object:
            tensor.datatype = "BYTES"
            response.raw_output_contents.append(codecs.bytes_tensor(array))
            continue
        tensor.datatype = datatype_of(array.dtype)
        little = array.astype(array.dtype.newbyteorder("<"), order="C", copy=False)
        response.raw_output_contents.append(little.tobytes())
