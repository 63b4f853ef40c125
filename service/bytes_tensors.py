"""V2 ``BYTES`` tensors on the wire, to NumPy object arrays (one element per ``str``/``bytes``).

In JSON a BYTES tensor's ``data`` holds strings (nested as the shape, or flat); they stay
`str` here, and the input that reads them decides what they mean (an image input reads them
as base64). With the binary-tensor extension each element is a 4-byte little-endian length
followed by that many bytes, as Triton and tritonclient write them; those become `bytes`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from service.errors import BadRequest

LENGTH_BYTES = 4


def _filled(elements: list[Any], shape: tuple[int, ...]) -> np.ndarray:
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array.reshape(shape)


def from_json(data: Any, shape: tuple[int, ...], where: str) -> np.ndarray:
    """A BYTES tensor from its JSON ``data``: strings, flat or nested no deeper than `shape`."""
    elements: list[Any] = []
    pending: list[tuple[Any, int]] = [(data, 0)]
    while pending:  # a stack, not recursion: a body may nest a thousand levels deep
        item, depth = pending.pop()
        if isinstance(item, list) and depth < max(len(shape), 1):
            pending.extend((member, depth + 1) for member in reversed(item))
        elif isinstance(item, str):
            elements.append(item)
        else:
            raise BadRequest(f"{where}: a BYTES tensor's data must hold strings (base64 for "
                             f"images), nested no deeper than its shape {list(shape)}; got "
                             f"{item!r:.50} ({type(item).__name__})")
    count = math.prod(shape)
    if len(elements) != count:
        raise BadRequest(f"{where}: shape {list(shape)} needs {count} elements, but data has "
                         f"{len(elements)}")
    return _filled(elements, shape)


def from_binary(data: memoryview, shape: tuple[int, ...], where: str) -> np.ndarray:
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
    return _filled(elements, shape)
