"""/predict's inputs read from simdjson's tape agree with Python lists read by NumPy."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.serving.config import DATATYPES
from service.errors import BadRequest, PayloadTooLarge
from service.tensors import json as json_tensors
from service.tensors import predict as codecs
from service.tensors import v2

LIMIT = 1 << 20
FLOATS = [np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)]


@pytest.fixture(autouse=True)
def _tape_for_every_body(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small bodies, read from the tape too (the service gives those under the threshold to
    orjson, the reference these tests compare with)."""
    monkeypatch.setattr(json_tensors, "TAPE_FROM_BYTES", 0)


def _body(inputs: dict[str, object]) -> bytes:
    return json.dumps({"model": "m", "inputs": inputs}).encode()


def _reference(body: bytes, dtypes: dict[str, np.dtype]) -> dict[str, np.ndarray] | str:
    """What NumPy makes of orjson's Python lists: the arrays, or the error message."""
    try:
        return {name: json_tensors.array_from_json(value, dtypes[name], f"input {name!r}")
                for name, value in orjson.loads(body)["inputs"].items()}
    except BadRequest as error:
        return str(error)


def _decoded(body: bytes, dtypes: dict[str, np.dtype]) -> dict[str, np.ndarray] | str:
    try:
        return codecs.predict_arrays(codecs.decode_predict(body), dtypes, LIMIT)
    except BadRequest as error:
        return str(error)


def _fast(body: bytes, dtypes: dict[str, np.dtype]) -> dict[str, np.ndarray] | None:
    request = codecs.decode_predict(body)
    return json_tensors.read_floats(request.inputs, dtypes, request.brackets)


def _assert_same(got: dict[str, np.ndarray] | str, want: dict[str, np.ndarray] | str) -> None:
    if isinstance(want, str):
        assert got == want
        return
    assert not isinstance(got, str), got
    assert got.keys() == want.keys()
    for name, array in want.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape
        np.testing.assert_array_equal(got[name], array)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(512,), (1, 512), (2, 3, 4), (0,), (2, 0), (3, 1, 1)])
def test_regular_float_tensors_are_read_from_the_tape(dtype: np.dtype, shape: tuple) -> None:
    values = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    body = _body({"x": values.tolist()})
    dtypes = {"x": dtype}
    assert _fast(body, dtypes) is not None  # the fast read is taken...
    _assert_same(_decoded(body, dtypes), _reference(body, dtypes))  # ...and agrees


@pytest.mark.parametrize("data", [
    [[1, 2], [3]],             # uneven rows: NumPy's error
    [[1, [2]], [3, 4]],        # an array where a number belongs, same element count
    [[1, []], [[2, 3], 4]],    # arrays of either size making up the count
    [[2], 4],                  # an array and a number on one level
    [[[2]], [3]],              # uneven depth
    [1, None],                 # null among the numbers
    [True, 1.5],               # NumPy reads booleans as numbers
    [1, "2"],                  # NumPy reads numeric strings
    [[1, 2], "ab"],
    7.5,                       # a scalar
    [],
])
def test_irregular_or_mixed_values_get_numpy_s_answer(data: object) -> None:
    body = _body({"x": data})
    dtypes = {"x": np.dtype(np.float32)}
    _assert_same(_decoded(body, dtypes), _reference(body, dtypes))


def test_a_hidden_array_is_refused_not_flattened() -> None:
    body = _body({"x": [[1, [2]], [3, 4]]})
    assert _fast(body, {"x": np.dtype(np.float32)}) is None
    with pytest.raises(BadRequest, match="cannot be read as FP32"):
        codecs.predict_arrays(codecs.decode_predict(body), {"x": np.dtype(np.float32)}, LIMIT)


def test_a_key_with_an_escaped_nul_is_read_like_any_other() -> None:
    body = b'{"model": "m", "inputs": {"x\\u0000y": [[1.5]], "z": [[2.5]]}}'
    dtypes = {"x\x00y": np.dtype(np.float32), "z": np.dtype(np.float32)}
    _assert_same(_decoded(body, dtypes), _reference(body, dtypes))
    bad = b'{"model": "m", "inputs": {"x": [1]}, "\\u0000": 1}'
    with pytest.raises(BadRequest, match="unknown fields"):
        codecs.decode_predict(bad)


def test_numbers_simdjson_cannot_hold_are_read_as_orjson_reads_them() -> None:
    body = _body({"x": [[123456789012345678901234567, 1.5]]})
    dtypes = {"x": np.dtype(np.float64)}
    _assert_same(_decoded(body, dtypes), _reference(body, dtypes))


def test_integer_inputs_keep_every_digit() -> None:
    big = 2**62 + 1  # not a float64
    body = _body({"ids": [[big, -big]]})
    arrays = codecs.predict_arrays(codecs.decode_predict(body), {"ids": np.dtype(np.int64)},
                                   LIMIT)
    assert arrays["ids"].tolist() == [[big, -big]]


def test_brackets_in_names_only_cost_the_fast_read() -> None:
    body = _body({"x[0]": [[0.5, 1.5]], "y": [[2.5]]})
    dtypes = {"x[0]": np.dtype(np.float32), "y": np.dtype(np.float32)}
    assert _fast(body, dtypes) is None
    _assert_same(_decoded(body, dtypes), _reference(body, dtypes))


def test_inputs_of_other_dtypes_or_unknown_names_use_numpy() -> None:
    body = _body({"x": [[1.5, 2.5]], "mask": [[1, 0]]})
    dtypes = {"x": np.dtype(np.float32), "mask": np.dtype(np.int32)}
    assert _fast(body, dtypes) is None
    _assert_same(_decoded(body, dtypes), _reference(body, dtypes))
    unknown = codecs.predict_arrays(codecs.decode_predict(body), {}, LIMIT)
    assert unknown["mask"].dtype == np.float32  # left to the caller's name check


def test_element_limit_applies_to_the_fast_read() -> None:
    body = _body({"x": [[0.0] * 100]})
    with pytest.raises(PayloadTooLarge, match="100 elements exceed the limit of 10"):
        codecs.predict_arrays(codecs.decode_predict(body), {"x": np.dtype(np.float32)}, 10)


@pytest.mark.parametrize("body, message", [
    (b"[1, 2", "not valid JSON"),
    (b'{"model": "m", "inputs": {"x": [1e400]}}', "not valid JSON"),
    (b"\xff", "not valid JSON"),
    (b"[1, 2]", "predict request must be a JSON object, got list"),
    (b'{"model": "m", "inputs": [1]}', "'inputs' must be a JSON object, got list"),
    (b'{"model": "m", "version": [1], "inputs": {"x": [1]}}', "got \\[1\\]"),
])
def test_bad_bodies_are_refused(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        codecs.decode_predict(body)


def test_decoded_requests_stay_valid_after_later_parses() -> None:
    first = codecs.decode_predict(_body({"x": [[1.0, 2.0]]}))
    second = codecs.decode_predict(_body({"x": [[3.0, 4.0]]}))
    del second  # frees the reusable parser again
    third = codecs.decode_predict(_body({"x": [[5.0, 6.0]]}))
    for request, want in ((first, [[1.0, 2.0]]), (third, [[5.0, 6.0]])):
        arrays = codecs.predict_arrays(request, {"x": np.dtype(np.float32)}, LIMIT)
        assert arrays["x"].tolist() == want


_leaf = st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=32),
                  st.integers(-2**31, 2**31), st.booleans(), st.none())
_nested = st.recursive(st.lists(_leaf, max_size=4),
                       lambda inner: st.lists(st.one_of(inner, _leaf), max_size=3), max_leaves=24)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(_nested, _leaf), dtype=st.sampled_from(FLOATS))
def test_any_value_gets_the_same_answer_as_numpy(data: object, dtype: np.dtype) -> None:
    body = _body({"x": data})
    with np.errstate(over="ignore"):  # beyond float16's range: inf on both paths
        _assert_same(_decoded(body, {"x": dtype}), _reference(body, {"x": dtype}))


@settings(max_examples=150, deadline=None)
@given(shape=st.lists(st.integers(0, 4), min_size=1, max_size=4), dtype=st.sampled_from(FLOATS))
def test_any_regular_shape_is_read_fast(shape: list[int], dtype: np.dtype) -> None:
    values = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) / 7
    body = _body({"x": values.tolist()})
    assert _fast(body, {"x": dtype}) is not None
    _assert_same(_decoded(body, {"x": dtype}), _reference(body, {"x": dtype}))


def test_bodies_under_the_threshold_are_read_by_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_tensors, "TAPE_FROM_BYTES", 1024)
    small = _body({"x": [[0.5] * 10]})
    large = _body({"x": [[0.5] * 400]})
    assert len(small) < 1024 <= len(large)
    assert type(json_tensors.parse(small)) is dict
    assert isinstance(json_tensors.parse(large), json_tensors.Object)
    for body in (small, large):
        _assert_same(_decoded(body, {"x": FLOATS[1]}), _reference(body, {"x": FLOATS[1]}))


def test_the_parser_is_reused_once_its_document_is_gone() -> None:
    def scenario() -> None:  # in a new thread: its own parser, unused so far
        first = json_tensors.parse(b"[1]")
        parser = first.parser
        held = json_tensors.parse(b"[2]")  # `first` still lives: another parser
        assert held.parser is not parser and held.as_list() == [2] and first.as_list() == [1]
        del first, held
        assert json_tensors.parse(b"[3]").parser is parser

    with ThreadPoolExecutor(1) as pool:
        pool.submit(scenario).result()


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False,
                                                                            allow_infinity=False)
                     | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=4), inner, max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=_json, inputs=_json, extra=st.dictionaries(st.text(max_size=4), _json, max_size=2))
def test_any_json_body_is_decoded_or_refused_with_a_400(model: object, inputs: object,
                                                        extra: dict) -> None:
    body = json.dumps({"model": model, "inputs": inputs, **extra}).encode()
    try:
        request = codecs.decode_predict(body)
        with np.errstate(over="ignore"):
            codecs.predict_arrays(request, {name: np.dtype(np.float32) for name in
                                            request.inputs}, LIMIT)
    except (BadRequest, PayloadTooLarge):
        pass


# ----- V2 inference requests -----------------------------------------------------------------

def _v2(entries: list[dict], **extra: object) -> bytes:
    return json.dumps({"inputs": entries, **extra}).encode()


def _v2_reference(body: bytes) -> dict[str, np.ndarray] | str:
    """Each input's data as NumPy reads orjson's lists (nested no deeper than the declared
    shape's rank), reshaped as declared."""
    try:
        arrays = {}
        for entry in orjson.loads(body)["inputs"]:
            where = f"input {entry['name']!r}"
            array = json_tensors.array_from_json(entry["data"], DATATYPES[entry["datatype"]],
                                           where, max(len(entry["shape"]), 1))
            if array.size != int(np.prod(entry["shape"])):
                raise BadRequest(f"{where}: shape {entry['shape']} needs "
                                 f"{int(np.prod(entry['shape']))} elements, but data has "
                                 f"{array.size}")
            arrays[entry["name"]] = array.reshape(entry["shape"])
        return arrays
    except BadRequest as error:
        return str(error)


def _v2_decoded(body: bytes) -> dict[str, np.ndarray] | str:
    try:
        return v2.decode_v2_request(body, None, LIMIT).inputs
    except BadRequest as error:
        return str(error)


@pytest.fixture
def fast_reads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """What each `read_floats` call returned."""
    results: list[object] = []
    read_floats = json_tensors.read_floats

    def spy(*args: object) -> object:
        results.append(read_floats(*args))
        return results[-1]

    monkeypatch.setattr(json_tensors, "read_floats", spy)
    return results


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
def test_v2_float_data_is_read_from_the_tape(datatype: str, fast_reads: list) -> None:
    values = np.random.default_rng(1).normal(size=(2, 3)).astype(np.float32)
    for data in (values.tolist(), values.ravel().tolist()):
        body = _v2([{"name": "x", "datatype": datatype, "shape": [2, 3], "data": data},
                    {"name": "y", "datatype": datatype, "shape": [1], "data": [0.5]}],
                   outputs=[{"name": "z", "parameters": {"binary_data": False}}],
                   parameters={"tags": [["a"], []]})
        _assert_same(_v2_decoded(body), _v2_reference(body))
    assert len(fast_reads) == 2 and all(result is not None for result in fast_reads)


@pytest.mark.parametrize("entries", [
    [{"name": "x", "datatype": "FP32", "shape": [3], "data": [1, [2], 3]}],
    [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [[1, []], [[2, 3], 4]]}],
    [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, True]}],
    [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1.5, 2.5]},
     {"name": "n", "datatype": "INT64", "shape": [1], "data": [2**62 + 1]}],
    [{"name": "x[0]", "datatype": "FP32", "shape": [1], "data": [1.5]}],
])
def test_v2_data_that_cannot_be_read_fast_gets_numpy_s_answer(entries: list[dict],
                                                              fast_reads: list) -> None:
    body = _v2(entries)
    _assert_same(_v2_decoded(body), _v2_reference(body))
    assert all(result is None for result in fast_reads)


_v2_extras = st.fixed_dictionaries({}, optional={
    "id": st.text(max_size=4),
    "parameters": st.dictionaries(st.text(max_size=4), _json, max_size=3),
    "outputs": st.lists(st.fixed_dictionaries({"name": st.text(max_size=3)}), max_size=2,
                        unique_by=lambda output: output["name"])})


def test_v2_data_of_the_wrong_size_is_refused(fast_reads: list) -> None:
    body = _v2([{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2, 3]}])
    with pytest.raises(BadRequest, match="shape \\[2\\] needs 2 elements, but data has 3"):
        v2.decode_v2_request(body, None, LIMIT)
    assert fast_reads[0] is not None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_nested, datatype=st.sampled_from(["FP16", "FP32", "FP64"]), extra=_v2_extras)
def test_any_v2_data_gets_the_same_answer_as_numpy(data: object, datatype: str,
                                                   extra: dict) -> None:
    try:
        size = np.asarray(data, dtype=np.float64).size
    except (ValueError, TypeError):
        size = 1
    body = _v2([{"name": "x", "datatype": datatype, "shape": [size], "data": data}], **extra)
    with np.errstate(over="ignore"):
        _assert_same(_v2_decoded(body), _v2_reference(body))


# ----- null, NaN and the infinities ------------------------------------------------------------

@pytest.mark.parametrize(("data", "shape", "place"), [
    ([1.5, None, 2.5, 3.5], [4], "element 1 (data[1])"),                 # flat
    ([[1.5, 2.5], [3.5, None]], [2, 2], "element 3 (data[1][1])"),        # nested
    ([[1.5, 2.5], [None, None]], [2, 2], "element 2 (data[1][0])"),       # the first one
])
@pytest.mark.parametrize("threshold", [0, 1 << 20])  # simdjson's tape, or orjson's values
def test_null_among_numbers_is_refused_naming_its_element(
        monkeypatch: pytest.MonkeyPatch, data: list, shape: list[int], place: str,
        threshold: int) -> None:
    monkeypatch.setattr(json_tensors, "TAPE_FROM_BYTES", threshold)
    message = f"input 'x': data must hold only numbers, got null at {place}"
    with pytest.raises(BadRequest) as predict_error:
        codecs.predict_arrays(codecs.decode_predict(_body({"x": data})),
                              {"x": np.dtype(np.float32)}, LIMIT)
    with pytest.raises(BadRequest) as v2_error:
        v2.decode_v2_request(_v2([{"name": "x", "datatype": "FP32", "shape": shape,
                                   "data": data}]), None, LIMIT)
    assert str(predict_error.value) == str(v2_error.value) == message


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("threshold", [0, 1 << 20])
def test_nan_and_infinity_literals_are_floats(monkeypatch: pytest.MonkeyPatch,
                                              dtype: np.dtype, threshold: int) -> None:
    monkeypatch.setattr(json_tensors, "TAPE_FROM_BYTES", threshold)
    literals = b"[[NaN, 1.5], [Infinity, -Infinity]]"
    want = np.array([[np.nan, 1.5], [np.inf, -np.inf]], dtype)
    predict = codecs.predict_arrays(
        codecs.decode_predict(b'{"model": "m", "inputs": {"x": ' + literals + b"}}"),
        {"x": dtype}, LIMIT)
    datatype = {np.float16: "FP16", np.float32: "FP32", np.float64: "FP64"}[dtype.type]
    header = (b'{"inputs": [{"name": "x", "datatype": "' + datatype.encode()
              + b'", "shape": [2, 2], "data": ' + literals + b"}]}")
    for array in (predict["x"], v2.decode_v2_request(header, None, LIMIT).inputs["x"]):
        assert array.dtype == dtype
        np.testing.assert_array_equal(array, want)  # NaN equals NaN here


@pytest.mark.parametrize(("data", "message"), [
    (b"[1, NaN]", "got NaN at element 1 (data[1]); NaN and Infinity are for floating-point "
                  "inputs, not INT32"),
    (b"[[1], [-Infinity]]", "got -Infinity at element 1 (data[1][0])"),
])
def test_nan_or_infinity_for_an_integer_input_is_400(data: bytes, message: str) -> None:
    body = b'{"model": "m", "inputs": {"ids": ' + data + b"}}"
    with pytest.raises(BadRequest, match=re.escape(f"input 'ids': data must hold only "
                                                   f"numbers, {message}")):
        codecs.predict_arrays(codecs.decode_predict(body), {"ids": np.dtype(np.int32)}, LIMIT)


@pytest.mark.parametrize("body", [
    b'{"model": "m", "inputs": {"x": [nan]}}',          # not the literal's spelling
    b'{"model": "m", "inputs": {"x": [NaN}}',           # broken around a literal
    b'{"model": "m", "inputs": {"x": ["NaN", 1', ])     # a string, and broken
def test_bodies_that_are_not_json_with_literals_are_still_refused(body: bytes) -> None:
    with pytest.raises(BadRequest, match="not valid JSON"):
        codecs.decode_predict(body)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(4,), (2, 2), (1, 2, 2)])
def test_non_finite_outputs_are_written_as_literals(dtype: np.dtype, shape: tuple) -> None:
    array = np.array([np.nan, 0.25, np.inf, -np.inf], dtype).reshape(shape)
    text = orjson.dumps({"data": json_tensors.json_ready(array)},
                        option=orjson.OPT_SERIALIZE_NUMPY)
    assert b"null" not in text and b"NaN" in text and b"-Infinity" in text
    np.testing.assert_array_equal(np.array(json.loads(text)["data"], dtype), array)
    finite = json_tensors.json_ready(np.ones(shape, dtype))
    assert isinstance(finite, np.ndarray)  # finite outputs take orjson's own writer
