"""End to end: an export with a data-dependent shape (boolean_mask between Dense layers)
uploaded WITHOUT config.json to a real uvicorn process: served one request at a time with
MXNet 1.9.1's outputs through V2 binary tensors; a config asking it for batches is refused."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson
import pytest

from tests.conformance.fixtures import assert_close, model_io_sets, model_meta
from tests.e2e.server import TOKEN, running_server
from tests.e2e.test_families import _infer
from tests.service.helpers import files_for

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NAME = "boolean_mask_tiny"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    root = tmp_path_factory.mktemp("dynamic") / "repository"
    with running_server(root) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        yield http


def _upload(client: httpx.Client, name: str, config: dict | None = None) -> httpx.Response:
    symbol, params = files_for(NAME)
    files = {"symbol": ("s.json", symbol), "params": ("p.params", params)}
    if config is not None:
        files["config"] = ("config.json", orjson.dumps(config))
    return client.post(f"/models/{name}", headers=AUTH, files=files)


def test_a_data_dependent_export_is_served_one_request_at_a_time(client: httpx.Client) -> None:
    answer = _upload(client, NAME)
    assert answer.status_code == 201, answer.text
    assert answer.json()["config"]["max_batch_size"] == 1
    served = [(inputs, expected) for inputs, expected in model_io_sets(NAME)
              if inputs["data"].shape[0] == 1]
    assert len(served) == 2
    for number, (inputs, expected) in enumerate(served):
        actual = _infer(client, NAME, inputs)
        assert len(actual) == len(expected)
        for index, (got, want) in enumerate(zip(actual, expected)):
            assert got.dtype == want.dtype
            assert_close(got, want, model_meta(NAME)["tolerance"], f"set {number} out {index}")
    many = next(inputs for inputs, _ in model_io_sets(NAME) if inputs["data"].shape[0] > 1)
    response = client.post(f"/v2/models/{NAME}/infer", json={"inputs": [
        {"name": "data", "datatype": "FP32", "shape": list(many["data"].shape),
         "data": many["data"].ravel().tolist()}]})
    assert response.status_code == 400, response.text
    assert "max_batch_size is 1" in response.json()["error"], response.text


def test_a_config_asking_for_batches_is_refused_with_the_reason(client: httpx.Client) -> None:
    response = _upload(client, "masked_batches", {"max_batch_size": 4})
    assert 400 <= response.status_code < 500, response.text
    message = response.text
    for part in ("output shapes depend on the data", "(_contrib_boolean_mask)",
                 "must not share a batch", "max_batch_size 4"):
        assert part in message, message
