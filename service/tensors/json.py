"""JSON tensors: request bodies parsed by simdjson, numbers read without a Python float each.

The one JSON reader of the service: it parses a body, bounds how deep a tensor's data may nest
(its shape's rank, at most `MAX_DEPTH`), reads numeric data into arrays and BYTES data into
object arrays, and writes output arrays as orjson can. V2 (`service.tensors.v2`), /predict
(`service.tensors.predict`) and the repository routes read their JSON here.

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

import contextlib
import json as standard_json
import math
import re
import threading
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
import orjson
import simdjson

from engine.serving.config import DATATYPES, datatype_of
from service.errors import BadRequest
from service.tensors.datatypes import MAX_DIMENSIONS, object_array, wrong_count

Array = simdjson.Array
Object = simdjson.Object
K = TypeVar("K")


# Decoding a request of N float32 numbers (timeit, 2-core EPYC): up to N = 32 (700 B) orjson is
# 2-5 µs faster for V2 requests, as for a binary request's 155-byte header, and within 3 µs
# either way for /predict; at N = 64 (1.3 KB) the two are even; from N = 128 (2.6 KB) on,
# simdjson is 1.2-3x faster.
TAPE_FROM_BYTES = 1024
# A tensor's data nests no deeper than its shape has dimensions.
MAX_DEPTH = MAX_DIMENSIONS
# The literals Triton reads as floats and JSON has no word for.
NON_FINITE = re.compile(rb"NaN|Infinity")

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
        return load_json(body, what, non_finite=True)
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
        return load_json(body, what, non_finite=True)


def load_json(body: bytes, what: str = "request body", non_finite: bool = False) -> Any:
    """The body as Python values (orjson), or a 400 with the parser's message.

    With `non_finite`, the bare literals ``NaN``, ``Infinity`` and ``-Infinity`` are numbers,
    as Triton reads tensor data (perf_analyzer's JSON sends them): neither orjson nor simdjson
    reads them, so a body orjson refuses that holds one is read by Python's parser instead.
    Bodies without them never take that slower path.
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        if non_finite and NON_FINITE.search(body):
            with contextlib.suppress(ValueError):  # JSONDecodeError and UnicodeDecodeError
                return standard_json.loads(body)
        raise BadRequest(f"{what} is not valid JSON: {error}") from None


def as_object(value: Any, what: str) -> dict[str, Any]:
    """A JSON object's members (nested values of a simdjson object left as proxies); 400
    naming what `value` is instead."""
    if isinstance(value, dict):
        return value
    if isinstance(value, Object):
        return members(value)
    raise BadRequest(f"{what} must be a JSON object, got {type(plain(value)).__name__}")


def flag(parameters: Mapping[str, Any], key: str, where: str) -> bool | None:
    """A boolean parameter (``binary_data``, ``binary_data_output``): None when absent, a 400
    when it is not a JSON boolean (``"false"`` is a string, and would read as true)."""
    value = parameters.get(key)
    if value is not None and type(value) is not bool:
        raise BadRequest(f"{where}{key} must be a JSON boolean (true or false), got "
                         f"{value!r:.50}")
    return value


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


def read_v2_header(header: bytes) -> tuple[Any, dict[int, np.ndarray]]:
    """A V2 inference request's JSON: the document as Python values but for each input's
    ``data``, which stays a proxy; and the ``data`` of its inputs read straight from the tape,
    by input index, when all of them are floating-point arrays `read_floats` can read (else
    none: each input's data is read by `array_from_json`)."""
    document = parse(header, "inference request header")
    if not isinstance(document, Object):
        return plain(document), {}
    request = members(document)
    for key, value in request.items():
        if key == "inputs" and isinstance(value, Array):
            request[key] = [_data_left(entry) for entry in value]
        else:
            request[key] = plain(value)
    inputs = request.get("inputs")
    if not isinstance(inputs, list):
        return request, {}
    values: dict[int, Any] = {}
    dtypes: dict[int, np.dtype] = {}
    depths: dict[int, int] = {}
    for index, entry in enumerate(inputs):
        if isinstance(entry, dict) and "data" in entry:
            datatype, shape = entry.get("datatype"), entry.get("shape")
            if (not isinstance(datatype, str) or datatype not in DATATYPES
                    or not isinstance(shape, list)):
                return request, {}
            values[index], dtypes[index] = entry["data"], DATATYPES[datatype]
            depths[index] = max(min(len(shape), MAX_DEPTH), 1)
    if not values:
        return request, {}
    # The header's other arrays (inputs, shapes, outputs...) are Python lists by now.
    return request, read_floats(values, dtypes, brackets(header) - count_arrays(request),
                                depths) or {}


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


def first_non_number(value: Any, booleans: bool = False, finite: bool = False
                     ) -> tuple[int, str, Any] | None:
    """The first value of a nested list, in row-major order, that is neither a number nor a
    list (a string, null, an object; a boolean unless `booleans`; NaN or an infinity when
    `finite`), with its element index (the leaves before it) and its path (``[0][3]``); None
    when there is none. NumPy would read ``true`` and ``"1.5"`` as numbers, and null as NaN.

    One quick pass finds whether there is such a value; only then is its place looked for.
    """
    pending = [value]
    while pending:  # the check `_is_number` makes, inline: this loop runs once per element
        item = pending.pop()
        kind = type(item)
        if kind is float:
            if finite and not math.isfinite(item):
                return _place_of_stray(value, booleans, finite)
        elif isinstance(item, list):
            pending.extend(item)
        elif kind is not int and not (booleans and kind is bool):
            return _place_of_stray(value, booleans, finite)
    return None


def _is_number(item: Any, booleans: bool, finite: bool) -> bool:
    kind = type(item)
    if kind is float:
        return not finite or math.isfinite(item)
    return kind is int or (booleans and kind is bool)


def _place_of_stray(value: Any, booleans: bool, finite: bool) -> tuple[int, str, Any]:
    """`first_non_number`'s answer for a value known to hold a stray element."""
    pending: list[tuple[Any, str]] = [(value, "")]
    index = 0
    while pending:  # a stack, not recursion: data may nest a thousand levels deep
        item, path = pending.pop()
        if isinstance(item, list):
            pending.extend((item[position], f"{path}[{position}]")
                           for position in range(len(item) - 1, -1, -1))
        elif _is_number(item, booleans, finite):
            index += 1
        else:
            return index, path, item
    raise AssertionError("no stray element")


def json_text(value: Any) -> str:
    """A JSON value as a client wrote it (``null``, ``true``, ``"1.5"``, ``NaN``), at most 50
    characters, for an error message."""
    if type(value) is float:
        return repr(value).replace("nan", "NaN").replace("inf", "Infinity")
    try:
        return orjson.dumps(value).decode()[:50]
    except TypeError:
        return f"{value!r:.50}"


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


def check_depth(data: Any, max_depth: int, where: str) -> None:
    """400 when `data` nests arrays deeper than `max_depth` (the rank of the tensor's shape)."""
    if nesting_depth(data, max_depth) > max_depth:
        raise BadRequest(f"{where}: data is nested more than {max_depth} arrays deep; its "
                         f"shape has {max_depth} dimension{'s' if max_depth > 1 else ''}, so "
                         f"at most {max_depth} levels")


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


def array_from_json(data: Any, dtype: np.dtype, where: str,
                    max_depth: int = MAX_DEPTH) -> np.ndarray:
    """A numpy array of `dtype` from a JSON value (a number or a nested or flat list, as Python
    values or a proxy) nested no deeper than `max_depth` arrays."""
    data = plain(data)
    if isinstance(data, (dict, str)) or data is None:
        raise BadRequest(f"{where}: data must be a number or a (nested) list of numbers, got "
                         f"{type(data).__name__}")
    check_depth(data, max_depth, where)
    stray = first_non_number(data, booleans=dtype == np.bool_, finite=dtype.kind != "f")
    if stray is not None:
        index, path, value = stray
        floating = "" if type(value) is not float else (
            f"; NaN and Infinity are for floating-point inputs, not {datatype_of(dtype)}")
        raise BadRequest(f"{where}: data must hold only numbers, got {json_text(value)} at "
                         f"element {index} (data{path}){floating}")
    try:
        return np.asarray(data, dtype=dtype)
    except (ValueError, TypeError, OverflowError, RecursionError) as error:
        raise BadRequest(f"{where}: data cannot be read as {datatype_of(dtype)}: "
                         f"{error}") from None


def read_arrays(values: Mapping[str, Any], dtypes: Mapping[str, np.dtype], brackets: int,
                max_depths: Mapping[str, int]) -> dict[str, np.ndarray]:
    """`values` (JSON values by name) as arrays of their `dtypes` (float32 for a name not in
    them), each nested no deeper than its `max_depths` entry: all from the tape when
    `read_floats` can read them, else each by `array_from_json`."""
    arrays = read_floats(values, dtypes, brackets, max_depths)
    if arrays is None:
        arrays = {name: array_from_json(value, dtypes.get(name, np.dtype(np.float32)),
                                        f"input {name!r}", max_depths[name])
                  for name, value in values.items()}
    return arrays


def bytes_from_json(data: Any, shape: tuple[int, ...], where: str) -> np.ndarray:
    """A BYTES tensor from its JSON ``data``: strings, flat or nested no deeper than `shape`.

    They stay `str`: the input that reads them decides what they mean (an image input reads
    them as base64, a text input as its text)."""
    elements: list[Any] = []
    pending: list[tuple[Any, int]] = [(plain(data), 0)]
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
    if len(elements) != math.prod(shape):
        raise wrong_count(shape, len(elements), where)
    return object_array(elements, shape)


def json_ready(array: np.ndarray) -> np.ndarray | orjson.Fragment:
    """A C-contiguous array orjson can write (it has no float16 writer for every version); or,
    for floats holding NaN or an infinity, their JSON text with those as the bare literals
    ``NaN``, ``Infinity`` and ``-Infinity``, as Triton writes them (orjson writes ``null``,
    which no client reads back as the number)."""
    if array.dtype == np.float16:
        array = array.astype(np.float32)
    array = np.ascontiguousarray(array)
    if array.dtype.kind != "f" or np.isfinite(array).all():
        return array
    return orjson.Fragment(_with_literals(array))


def _with_literals(array: np.ndarray) -> bytes:
    """orjson's text of `array` with each ``null`` (a NaN or infinity: a float array holds
    nothing else orjson writes as null) replaced by its literal, in row-major order."""
    pieces = orjson.dumps(array, option=orjson.OPT_SERIALIZE_NUMPY).split(b"null")
    special = array[~np.isfinite(array)]  # row-major, as orjson writes them
    literals = np.where(np.isnan(special), b"NaN",
                        np.where(special > 0, b"Infinity", b"-Infinity")).tolist()
    text = [pieces[0]]
    for literal, piece in zip(literals, pieces[1:], strict=True):
        text += (literal, piece)
    return b"".join(text)
