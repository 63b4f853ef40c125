"""The binary-tensor extension: tensors as raw bytes after a JSON header, or a body of one tensor.

With ``Inference-Header-Content-Length`` the body is that many bytes of JSON header, then each
tensor's bytes in input order (``binary_data_size`` each); with the header at 0 the whole body
is the one input's tensor (Triton's raw binary request). Numbers are little-endian, row-major;
a ``BYTES`` element is a 4-byte little-endian length followed by that many bytes, as Triton and
tritonclient write them (they become `bytes`). gRPC's ``raw_input_contents`` and
``raw_output_contents`` carry tensors in the same layout (`service.grpc.tensors`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from service.errors import BadRequest
from service.tensors.datatypes import object_array

HEADER_LENGTH = "Inference-Header-Content-Length"
LENGTH_BYTES = 4


def header_length(value: str | None) -> int | None:
    """The value of Inference-Header-Content-Length, or None when the header is absent."""
    if value is None:
        return None
    if not value.isdigit():
        raise BadRequest(f"{HEADER_LENGTH} must be a non-negative integer, got {value!r:.50}")
    return int(value)


def split_body(body: bytes, header_length: int | None) -> tuple[bytes, memoryview]:
    """The JSON header and the binary section after it (empty without the header)."""
    if header_length is None:
        return body, memoryview(b"")
    if not 0 < header_length <= len(body):
        raise BadRequest(f"{HEADER_LENGTH} is {header_length}, but the body has {len(body)} "
                         "bytes; it must give the length of the JSON header")
    view = memoryview(body)
    return bytes(view[:header_length]), view[header_length:]


def take(binary: memoryview, offset: int, size: int, where: str) -> memoryview:
    """The `size` bytes of a tensor at `offset` in the binary section; 400 when it ends first."""
    if offset + size > len(binary):
        raise BadRequest(f"{where}: binary data ends after {len(binary) - offset} of {size} "
                         "bytes")
    return binary[offset:offset + size]


def array_from_bytes(data: bytes | memoryview, dtype: np.dtype,
                     shape: Sequence[int]) -> np.ndarray:
    """A read-only array viewing `data`: little-endian, row-major elements of `dtype`."""
    return np.frombuffer(data, dtype=dtype.newbyteorder("<")).reshape(shape)


def raw_shape(template: Sequence[int], size: int, itemsize: int, where: str,
              batch_axis: int | None = 0) -> tuple[int, ...]:
    """The shape of a raw binary request's tensor (Triton's binary-data extension: a body of
    tensor bytes alone, Inference-Header-Content-Length 0): one row of the config's shape (1
    at `batch_axis`; None: the shape has no batch dimension), whose one variable dimension,
    if any, follows from the byte count."""
    dims = [dim for axis, dim in enumerate(template) if axis != batch_axis]
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
                         f"{list(_with_row(dims, batch_axis))}), got {size} bytes")
    return _with_row(dims, batch_axis)


def _with_row(dims: Sequence[int], batch_axis: int | None) -> tuple[int, ...]:
    """`dims` with one row inserted at `batch_axis` (None: as they are)."""
    if batch_axis is None:
        return tuple(dims)
    return (*dims[:batch_axis], 1, *dims[batch_axis:])


def bytes_from_binary(data: memoryview, shape: tuple[int, ...], where: str) -> np.ndarray:
    """A BYTES tensor from its binary data: `shape`'s element count, each length-prefixed,
    filling `data` exactly."""
    count = math.prod(shape)
    elements: list[bytes] = []
    offset = 0
    for index in range(count):
        if offset + LENGTH_BYTES > len(data):
            raise BadRequest(f"{where}: binary data ends after {len(elements)} of {count} BYTES "
                             f"elements; each is a 4-byte little-endian length, then its bytes")
        length = int.from_bytes(data[offset:offset + LENGTH_BYTES], "little")
        offset += LENGTH_BYTES
        if offset + length > len(data):
            raise BadRequest(f"{where}: BYTES element {index} declares {length} bytes, but only "
                             f"{len(data) - offset} remain in its binary_data_size")
        elements.append(bytes(data[offset:offset + length]))
        offset += length
    if offset != len(data):
        raise BadRequest(f"{where}: binary_data_size is {len(data)} bytes, but its {count} BYTES "
                         f"element(s) of shape {list(shape)} take {offset}")
    return object_array(elements, shape)


def bytes_tensor(array: np.ndarray) -> bytes:
    """A BYTES tensor's binary data: each element, row-major, as a 4-byte little-endian length
    and then its bytes."""
    return b"".join(len(element).to_bytes(LENGTH_BYTES, "little") + element
                    for element in array.reshape(-1))


def tensor_bytes(array: np.ndarray) -> bytes:
    """An output's binary data: its elements little-endian and row-major, or for an object
    array of byte strings (a classification result, labels) its BYTES elements."""
    if array.dtype == object:
        return bytes_tensor(array)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
