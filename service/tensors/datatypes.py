"""What every tensor format shares: V2 datatype names, and the bounds on a tensor's shape and size.

JSON (`service.tensors.json`), the binary-tensor extension (`service.tensors.binary`) and gRPC's
protobuf tensors (`service.grpc.tensors`) all read a tensor's datatype, shape and element count
through here, so they refuse the same tensors with the same messages. Checking tensors against
a model's config is the data plane's job (`service.dataplane.checks`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from engine.serving.config import DATATYPES
from service.errors import BadRequest, PayloadTooLarge

BYTES = "BYTES"
# No tensor has more dimensions than this, so no tensor's data is nested deeper in JSON (NumPy's
# own limit is 64: past it, it raises an error of its own).
MAX_DIMENSIONS = 32
# Raises for an input name the model lacks (`service.dataplane.checks.check_input_name`): the
# decoders call it as they read each input's name, before its datatype, shape and data.
NameCheck = Callable[[str], None]


def dtype_of(datatype: Any, where: str) -> np.dtype:
    """The numpy dtype of a V2 datatype name; 400 for BYTES and unknown names."""
    if datatype == BYTES:
        raise BadRequest(f"{where}: datatype BYTES is only for inputs with a preprocess "
                         f"pipeline (encoded images); use one of {', '.join(DATATYPES)}")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise BadRequest(f"{where}: unknown datatype {datatype!r}; expected one of "
                         f"{', '.join(DATATYPES)}")
    return DATATYPES[datatype]


def read_shape(value: Any, where: str) -> tuple[int, ...]:
    """A tensor's shape: a list of at most `MAX_DIMENSIONS` non-negative integers."""
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


def wrong_count(shape: Sequence[int], given: int, where: str) -> BadRequest:
    """The 400 for data of `given` elements where `shape` needs another number."""
    return BadRequest(f"{where}: shape {list(shape)} needs {math.prod(shape)} elements, but "
                      f"data has {given}")


def object_array(elements: Sequence[Any], shape: Sequence[int]) -> np.ndarray:
    """A BYTES tensor: an object array of `shape` holding `elements` (``str`` or ``bytes``,
    row-major) as they are."""
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array.reshape(shape)
