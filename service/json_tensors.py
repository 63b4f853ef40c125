"""JSON request bodies parsed by simdjson, numeric tensors read without a Python float each.

orjson (or any parser building Python objects) makes one Python float per number, which NumPy
then reads back one by one. simdjson parses into its own tape, and an array's ``as_buffer``
copies all its numbers, at any depth, into float64 memory in one call. For a 64x64 RGB image
sent as JSON the event loop spends 1.6x less per request; for the seed MLP's 512 numbers the
two cost the same in the server (`bench/serve_breakdown.py`).

``as_buffer`` flattens whatever nesting it meets, so it is only trusted where the nesting is
known to be regular: every array of a level has the length of the level's first array, and the
request body holds no more ``[`` than these arrays account for, so no number is secretly an
array. Where that cannot be shown, the value goes back to Python lists, which NumPy checks as
it always did. A body simdjson refuses goes to orjson, which reads integers beyond 64 bits (as
floats) and words the error for anything else. So do bodies under `TAPE_FROM_BYTES`: without
numbers enough to read in bulk, orjson's plain values cost less than simdjson's proxies.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
import orjson
import simdjson

from service.errors import BadRequest

Array = simdjson.Array
Object = simdjson.Object
K = TypeVar("K")


# Decoding a request of N float32 numbers (timeit, 2-core EPYC): up to N = 32 (700 B) orjson is
# 2-5 µs faster for V2 requests, as for a binary request's 155-byte header, and within 3 µs
# either way for /predict; at N = 64 (1.3 KB) the two are even; from N = 128 (2.6 KB) on,
# simdjson is 1.2-3x faster.
TAPE_FROM_BYTES = 1024
# No tensor has more dimensions than this, so no tensor's data is nested deeper (NumPy's own
# limit is 64: past it, it raises an error of its own).
MAX_DEPTH = 32

_reusable = threading.local()


def parse(body: bytes, what: str = "request body") -> Any:
    """The document: a `simdjson` proxy for an object or array, else the Python value (always
    for bodies under `TAPE_FROM_BYTES`).

    Each thread reuses one parser: a new one per body allocates and frees its buffers each time,
    which a profile of the server showed costing more than the parse itself. simdjson refuses to
    reparse while proxies of its last document live (a traceback may hold some); that body gets
    a parser of its own.
    """
    if len(body) < TAPE_FROM_BYTES:
        return load_json(body, what)
    parser = getattr(_reusable, "parser", None)
    if parser is None:
        parser = _reusable.parser = simdjson.Parser()
    try:
        try:
            return parser.parse(body)
        except RuntimeError:  # the last document is still referenced, or a too-big integer
            return simdjson.Parser().parse(body)
    except (ValueError, RuntimeError):  # UnicodeDecodeError is a ValueError
        # Not JSON, or numbers simdjson cannot hold that orjson reads (integers beyond 64
        # bits, as floats): orjson decides, and words the error.
        return load_json(body, what)


def load_json(body: bytes, what: str = "request body") -> Any:
    """The body as Python values (orjson), or a 400 with the parser's message."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadRequest(f"{what} is not valid JSON: {error}") from None


def plain(value: Any) -> Any:
    """`value` as Python lists, dicts and scalars."""
    if isinstance(value, Array):
        return value.as_list()
    if isinstance(value, Object):
        return value.as_dict()
    return value


def brackets(body: bytes) -> int:
    """How many ``[`` the body holds (by ``replace``, which finds them with memchr: ten times
    faster than ``bytes.count`` on a 10 KB body)."""
    return len(body) - len(body.replace(b"[", b""))


def members(document: Object) -> dict[str, Any]:
    """An object's members, nested objects and arrays left as proxies (``items()`` would
    convert them all). A key simdjson cannot look up (one holding an escaped NUL) makes them
    all plain Python values."""
    try:
        return {key: document[key] for key in document}
    except KeyError:
        return document.as_dict()


def with_tensor_data(document: Any) -> Any:
    """A V2 inference request as Python values, but for each input's ``data`` array: those
    stay proxies, for `read_floats`."""
    if not isinstance(document, Object):
        return plain(document)
    request = members(document)
    for key, value in request.items():
        if key == "inputs" and isinstance(value, Array):
            request[key] = [_data_left(entry) for entry in value]
        else:
            request[key] = plain(value)
    return request


def _data_left(entry: Any) -> Any:
    if not isinstance(entry, Object):
        return plain(entry)
    return {key: value if key == "data" else plain(value)
            for key, value in members(entry).items()}


def count_arrays(value: Any) -> int:
    """How many lists a Python value holds, at any depth (proxies count none).

    A loop over a stack, not recursion: a body may nest its parameters a thousand levels deep.
    """
    count = 0
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            count += 1
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
    return count


def first_non_number(value: Any, booleans: bool = False) -> Any:
    """A value in a nested list that is neither a number nor a list (a string, null, an
    object; a boolean unless `booleans`), or None: NumPy would read ``true`` and ``"1.5"`` as
    numbers."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(item)
        elif type(item) is not float and type(item) is not int and not (
                booleans and type(item) is bool):
            return item
    return None


def nesting_depth(value: Any, cap: int) -> int:
    """How many arrays deep `value`'s first number lies (a Python list or a proxy), counting
    no further than ``cap + 1``. Uneven nesting elsewhere is NumPy's to refuse."""
    depth = 0
    while isinstance(value, (list, Array)) and depth <= cap:
        depth += 1
        if not len(value):
            break
        value = value[0]
    return depth


def regular_shape(array: Array, max_depth: int) -> tuple[tuple[int, ...], int] | None:
    """The shape of a regular nested array and how many arrays it is made of; None when its
    levels are uneven, mix arrays with other values or go deeper than `max_depth`. The last
    level is not looked into: `read_floats` checks it."""
    shape: list[int] = []
    level = [array]
    arrays = 0
    while len(shape) < max_depth:
        arrays += len(level)
        length = len(level[0])
        if any(len(member) != length for member in level):
            return None
        shape.append(length)
        if length == 0 or not isinstance(level[0][0], Array):
            return tuple(shape), arrays
        below = []
        for member in level:
            for item in member:
                if not isinstance(item, Array):
                    return None
                below.append(item)
        level = below
    return None


def read_floats(values: Mapping[K, Any], dtypes: Mapping[K, np.dtype], brackets: int,
                max_depths: Mapping[K, int] | None = None) -> dict[K, np.ndarray] | None:
    """All `values` as arrays of their floating `dtypes`, read straight from simdjson's tape;
    None unless every one of them can be, in a body holding `brackets` ``[``, nested no deeper
    than its `max_depths` entry (default: `MAX_DEPTH`).

    A count of arrays equal to ``brackets`` proves the body has no array but the ones
    `regular_shape` walked: none hides at a number's place on the last level.
    """
    found = {}
    arrays = 0
    for name, value in values.items():
        dtype = dtypes.get(name)
        if dtype is None or dtype.kind != "f" or not isinstance(value, Array):
            return None
        regular = regular_shape(value, MAX_DEPTH if max_depths is None else max_depths[name])
        if regular is None:
            return None
        found[name], count = regular
        arrays += count
    if arrays != brackets:
        return None
    tensors = {}
    for name, shape in found.items():
        try:
            flat = values[name].as_buffer(of_type="d")
        except (TypeError, ValueError):  # a boolean, null or string among the numbers
            return None
        numbers = np.frombuffer(flat, np.float64)
        if numbers.size != math.prod(shape):
            return None
        tensors[name] = numbers.astype(dtypes[name]).reshape(shape)
    return tensors
