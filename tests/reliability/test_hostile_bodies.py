"""Hostile request bodies (#26): every field of every body nested, mistyped, or the body cut.

Each example starts from a valid body of one route (V2 infer as JSON and with binary tensors,
/predict, the repository extension's index/load/unload, a model upload's config.json), breaks
it in one place, and expects a JSON 4xx naming the problem: never a 200, never a 500.
``null`` is not among the wrong types: the protocol reads it as "not given".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.inprocess import AppClient, app_client
from tests.service.helpers import AUTH, config_for, files_for, first_io

MLP = "seed_mlp"
OUTPUT = "seed_mlp_dense2_fwd_output"
HOSTILE = settings(max_examples=150, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.function_scoped_fixture,
                                          HealthCheck.too_slow])
ROW = np.asarray(first_io(MLP)[0]["data"], np.float32)
SYMBOL, PARAMS = files_for(MLP)

Path = tuple[Any, ...]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppClient]:
    root = tmp_path_factory.mktemp("hostile") / "repository"
    with app_client(root, (MLP,)) as running:
        yield running


def v2_json() -> dict[str, Any]:
    return {"id": "r1",
            "inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 512],
                        "data": ROW.tolist()}],
            "outputs": [{"name": OUTPUT, "parameters": {"binary_data": False}}],
            "parameters": {"binary_data_output": False, "timeout": 10_000_000}}


def v2_binary_header() -> dict[str, Any]:
    return {"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 512],
                        "parameters": {"binary_data_size": ROW.nbytes}}],
            "outputs": [{"name": OUTPUT, "parameters": {"binary_data": True}}],
            "parameters": {"binary_data_output": True}}


def predict() -> dict[str, Any]:
    return {"model": MLP, "version": 1, "inputs": {"data": ROW.tolist()}}


# Route -> (method, url, valid body): each is answered 200 as it stands (test below).
BODIES = {
    "v2 json": ("POST", f"/v2/models/{MLP}/infer", v2_json),
    "v2 binary": ("POST", f"/v2/models/{MLP}/infer", v2_binary_header),
    "predict": ("POST", "/predict", predict),
    "index": ("POST", "/v2/repository/index", lambda: {"ready": True}),
    "load": ("POST", f"/v2/repository/models/{MLP}/load", lambda: {"parameters": {}}),
    "unload": ("POST", f"/v2/repository/models/{MLP}/unload",
               lambda: {"parameters": {"unload_dependents": False}}),
    "upload config": ("POST", "/models/hostile",
                      lambda: {**config_for(MLP), "max_batch_size": 8}),
}


def paths(value: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every field and element of a JSON value; of a long array of numbers only the first."""
    if prefix:
        yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:1] if len(value) > 4 else value):
            yield from paths(item, (*prefix, index))


def replaced(document: Any, path: Path, make: Any) -> Any:
    """A copy of `document` with the value at `path` replaced by ``make(old value)``."""
    if not path:
        return make(document)
    head, rest = path[0], path[1:]
    if isinstance(document, dict):
        return {**document, head: replaced(document[head], rest, make)}
    return [replaced(item, rest, make) if index == head else item
            for index, item in enumerate(document)]


def category(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


WRONG_TYPES = [7, 1.5, "seven", True, [], {}, [1, "a"], {"a": 1}]


@st.composite
def broken_bodies(draw: st.DrawFn, route: str) -> tuple[bytes, dict[str, str]]:
    """One route's valid body broken in one place: (body bytes, extra headers)."""
    document = BODIES[route][2]()
    kind = draw(st.sampled_from(["nest", "mistype", "truncate"]))
    if kind != "truncate":
        path = draw(st.sampled_from(list(paths(document))))
        if kind == "nest":
            depth = draw(st.sampled_from([1, 2, 33, 65, 200, 1000]))
            document = replaced(document, path, lambda old: json.loads(
                "[" * depth + json.dumps(old) + "]" * depth))
        else:
            old = document
            for key in path:
                old = old[key]
            wrong = [value for value in WRONG_TYPES if category(value) != category(old)]
            document = replaced(document, path, lambda _: draw(st.sampled_from(wrong)))
    body = json.dumps(document).encode()
    headers = {}
    if route == "v2 binary":
        headers["Inference-Header-Content-Length"] = str(len(body))
        body += ROW.tobytes()
    if kind == "truncate":
        body = body[:draw(st.integers(1, len(body) - 1))]
    return body, headers


def send(client: AppClient, route: str, body: bytes, headers: dict[str, str]) -> Any:
    method, url, _ = BODIES[route]
    if route == "upload config":
        files = {"symbol": ("s.json", SYMBOL), "params": ("p.params", PARAMS),
                 "config": ("config.json", body)}
        return client.request(method, url, files=files, headers=AUTH)
    return client.request(method, url, content=body, headers={**headers, **AUTH})


@pytest.mark.parametrize("route", sorted(BODIES))
def test_the_unbroken_bodies_are_answered(client: AppClient, route: str) -> None:
    body, headers = json.dumps(BODIES[route][2]()).encode(), {}
    if route == "v2 binary":
        headers["Inference-Header-Content-Length"] = str(len(body))
        body += ROW.tobytes()
    response = send(client, route, body, headers)
    assert response.status_code in (200, 201), response.text
    if route in ("unload", "upload config"):  # put the repository back as it was
        cleanup = ("POST", f"/v2/repository/models/{MLP}/load") if route == "unload" else (
            "DELETE", "/models/hostile")
        assert client.request(*cleanup, headers=AUTH).status_code == 200


@pytest.mark.parametrize("route", sorted(BODIES))
def test_every_broken_body_is_a_json_4xx(client: AppClient, route: str) -> None:
    @HOSTILE
    @given(broken=broken_bodies(route))
    def check(broken: tuple[bytes, dict[str, str]]) -> None:
        response = send(client, route, *broken)
        assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
        error = response.json()["error"]
        assert isinstance(error, str) and error

    check()


def test_a_config_nested_past_the_json_parsers_depth_is_400(client: AppClient) -> None:
    config = b'{"max_batch_size": ' + b"[" * 3000 + b"8" + b"]" * 3000 + b"}"
    response = send(client, "upload config", config, {})
    assert response.status_code == 400, response.text
    assert "nests values too deeply" in response.json()["error"]


def test_a_config_with_true_for_a_number_is_refused(client: AppClient) -> None:
    config = json.dumps({**config_for(MLP), "max_batch_size": True}).encode()
    response = send(client, "upload config", config, {})
    if response.status_code == 201:
        client.request("DELETE", "/models/hostile", headers=AUTH)
    assert 400 <= response.status_code < 500, response.text
