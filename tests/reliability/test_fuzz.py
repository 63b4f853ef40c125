"""Fuzzing (bounded): V2 and /predict payloads, raw bodies, and uploaded symbol/params bytes.

Whatever arrives, the answer is a known status with a JSON ``{"error": ...}`` body (or a correct
result), never a 500, and the repository holds no staging leftovers afterwards.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.inprocess import AppClient, app_client
from tests.service.helpers import files_for, first_io

MODELS = ("seed_mlp", "multi_io")
INFER_STATUSES = {200, 400, 404, 413, 422, 503}
UPLOAD_STATUSES = {201, 400, 409, 413, 422}
FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppClient]:
    root = tmp_path_factory.mktemp("fuzz") / "repository"
    with app_client(root, MODELS, max_tensor_elements=1 << 16) as running:
        yield running


def _check_answer(response: Any, allowed: set[int]) -> Any:
    assert response.status_code in allowed, (response.status_code, response.text[:500])
    body = response.json() if response.headers.get("content-type", "").startswith(
        "application/json") else None
    if response.status_code >= 400:
        assert isinstance(body, dict) and isinstance(body.get("error"), str), response.text[:500]
    return body


# ----- strategies ---------------------------------------------------------------------------

scalars = st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=32),
                    st.integers(-(1 << 70), 1 << 70), st.booleans(), st.none(),
                    st.text(max_size=5))
nested = st.recursive(scalars, lambda inner: st.lists(inner, max_size=6), max_leaves=40)
input_names = st.sampled_from(["data", "data0", "data1", "", "x", "data" * 20])
datatypes = st.sampled_from(["FP32", "FP64", "FP16", "INT32", "INT64", "UINT8", "BOOL", "BYTES",
                             "fp32", "float32", "", "FP"])
shapes = st.lists(st.integers(-3, 12) | st.sampled_from([1 << 31, 1 << 62]), max_size=5)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                           max_leaves=12)


@st.composite
def v2_tensors(draw: st.DrawFn) -> dict[str, Any]:
    """A V2 input tensor: sometimes well formed for the real models, often not."""
    shape = draw(shapes)
    count = math.prod(shape) if shape and all(0 <= dim <= 64 for dim in shape) else 0
    data = draw(st.one_of(nested, st.lists(st.floats(-1e3, 1e3, width=32), min_size=count,
                                           max_size=count)))
    tensor: dict[str, Any] = {"name": draw(input_names), "datatype": draw(datatypes),
                              "shape": shape, "data": data}
    for key in draw(st.sets(st.sampled_from(["name", "datatype", "shape", "data"]), max_size=1)):
        if draw(st.booleans()):
            tensor[key] = draw(json_values)
        else:
            del tensor[key]
    if draw(st.booleans()):
        tensor["parameters"] = draw(st.dictionaries(
            st.sampled_from(["binary_data_size", "binary_data", "other"]), json_values,
            max_size=2))
    return tensor


@st.composite
def v2_payloads(draw: st.DrawFn) -> dict[str, Any]:
    """A V2 inference request body."""
    payload: dict[str, Any] = {"inputs": draw(st.lists(v2_tensors(), max_size=3)
                                              | json_values)}
    if draw(st.booleans()):
        payload["outputs"] = draw(st.lists(st.fixed_dictionaries(
            {"name": st.sampled_from(["seed_mlp_dense2_fwd_output", "nope", ""]) | json_values},
            optional={"parameters": st.dictionaries(st.just("binary_data"), json_values)}),
            max_size=2) | json_values)
    if draw(st.booleans()):
        payload["parameters"] = draw(st.dictionaries(
            st.sampled_from(["binary_data_output", "timeout", "x"]), json_values, max_size=2))
    if draw(st.booleans()):
        payload["id"] = draw(json_values)
    return payload


# ----- inference ----------------------------------------------------------------------------

@FUZZ
@given(payload=v2_payloads(), model=st.sampled_from([*MODELS, "missing", "seed_mlp/versions/1",
                                                     "seed_mlp/versions/9"]))
def test_v2_payloads_never_500(client: AppClient, payload: dict[str, Any], model: str) -> None:
    response = client.request("POST", f"/v2/models/{model}/infer",
                              content=json.dumps(payload).encode(),
                              headers={"content-type": "application/json"})
    body = _check_answer(response, INFER_STATUSES)
    if response.status_code == 200:
        assert isinstance(body["outputs"], list) and body["outputs"]


@FUZZ
@given(body=st.binary(max_size=512), length=st.none() | st.integers(-5, 600).map(str)
       | st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=4))
def test_raw_v2_bodies_never_500(client: AppClient, body: bytes, length: str | None) -> None:
    headers = {} if length is None else {"Inference-Header-Content-Length": length}
    response = client.request("POST", "/v2/models/multi_io/infer", content=body, headers=headers)
    _check_answer(response, INFER_STATUSES)


@FUZZ
@given(model=st.sampled_from([*MODELS, "missing", "", "../x"]) | json_values,
       version=st.none() | st.integers(-2, 3) | st.text(max_size=3) | json_values,
       inputs=st.dictionaries(input_names, nested, max_size=2) | json_values,
       extra=st.dictionaries(st.sampled_from(["x", "outputs"]), json_values, max_size=1))
def test_predict_payloads_never_500(client: AppClient, model: Any, version: Any, inputs: Any,
                                    extra: dict[str, Any]) -> None:
    payload = {"model": model, "inputs": inputs, **extra}
    if version is not None:
        payload["version"] = version
    response = client.request("POST", "/predict", content=json.dumps(payload).encode())
    _check_answer(response, INFER_STATUSES)


@FUZZ
@given(rows=st.integers(1, 8), seed=st.integers(0, 2**32 - 1))
def test_well_formed_requests_are_answered_correctly(client: AppClient, rows: int,
                                                    seed: int) -> None:
    """The fuzzed server still computes: random rows through /predict match a direct run."""
    generator = np.random.default_rng(seed)
    data0 = generator.standard_normal((rows, 5), np.float32)
    data1 = generator.standard_normal((rows, 3, 6, 6), np.float32)
    response = client.request("POST", "/predict", json={"model": "multi_io", "inputs": {
        "data0": data0.tolist(), "data1": data1.tolist()}})
    assert response.status_code == 200, response.text
    expected = client.runtime.repository.get("multi_io").model.infer(
        {"data0": data0, "data1": data1})
    for name, values in response.json()["outputs"].items():
        np.testing.assert_allclose(np.asarray(values, np.float32), expected[name],
                                   rtol=1e-5, atol=1e-6)


# ----- uploads ------------------------------------------------------------------------------

SYMBOL, PARAMS = files_for("seed_mlp")
UPLOADS = settings(max_examples=60, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.function_scoped_fixture,
                                          HealthCheck.too_slow])


@st.composite
def mutated_bytes(draw: st.DrawFn, original: bytes) -> bytes:
    """`original` truncated, with bytes overwritten, or with a slice inserted."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["truncate", "overwrite", "insert"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "truncate":
            del data[at:]
        elif kind == "overwrite":
            data[at:at + 8] = draw(st.binary(min_size=1, max_size=8))
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


@st.composite
def mutated_symbols(draw: st.DrawFn) -> bytes:
    """The seed MLP's symbol JSON with one node field, attribute or head replaced."""
    document = json.loads(SYMBOL)
    nodes = document["nodes"]
    node = nodes[draw(st.integers(0, len(nodes) - 1))]
    target = draw(st.sampled_from(["op", "attrs", "inputs", "name", "heads", "arg_nodes",
                                   "node_row_ptr"]))
    values = json_values | st.sampled_from(["Convolution", "tile", "Reshape", "nope", [[0, 0]],
                                            [[99, 0, 0]], [[0, 5, 0]], {"num_hidden": "-1"},
                                            {"num_hidden": "99999999999"}, {"reps": "(1, 8)"}])
    if target in ("heads", "arg_nodes", "node_row_ptr"):
        document[target] = draw(values)
    elif target == "attrs" and isinstance(node.get("attrs"), dict) and node["attrs"]:
        key = draw(st.sampled_from(sorted(node["attrs"])))
        node["attrs"][key] = draw(st.text(max_size=12) | st.sampled_from(
            ["(1,)", "0", "-1", "99999999", "True", "(3, 3)", ""]))
    else:
        node[target] = draw(values)
    return json.dumps(document).encode()


def _upload_and_check(client: AppClient, symbol: bytes, params: bytes) -> None:
    root = client.runtime.settings.model_repository
    response = client.upload("fuzzed", symbol, params)
    _check_answer(response, UPLOAD_STATUSES)
    if response.status_code == 201:
        assert client.request("DELETE", "/models/fuzzed",
                              headers={"Authorization": "Bearer test-token"}).status_code == 200
    leftovers = sorted(path.name for path in root.iterdir() if path.name.startswith("."))
    assert leftovers == [], leftovers
    assert {path.name for path in root.iterdir()} == set(MODELS)


@UPLOADS
@given(symbol=mutated_bytes(SYMBOL) | mutated_symbols())
def test_mutated_symbol_uploads_are_refused_cleanly(client: AppClient, symbol: bytes) -> None:
    _upload_and_check(client, symbol, PARAMS)


@UPLOADS
@given(params=mutated_bytes(PARAMS[:4096]).map(lambda head: head + PARAMS[4096:])
       | mutated_bytes(PARAMS) | st.binary(max_size=256))
def test_mutated_params_uploads_are_refused_cleanly(client: AppClient, params: bytes) -> None:
    _upload_and_check(client, SYMBOL, params)


def test_served_models_survive_the_fuzzing(client: AppClient) -> None:
    for name in MODELS:
        inputs, expected = first_io(name)
        response = client.request("POST", "/predict", json={
            "model": name, "inputs": {key: array.tolist() for key, array in inputs.items()}})
        assert response.status_code == 200, response.text
        for values, want in zip(response.json()["outputs"].values(), expected):
            np.testing.assert_allclose(np.asarray(values, np.float32), want, rtol=1e-4,
                                       atol=1e-5)
