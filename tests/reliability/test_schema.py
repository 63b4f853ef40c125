"""schemathesis over the server's own OpenAPI schema, in process: no 500s, answers match it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.reliability.inprocess import AppClient, app_client
from tests.service.helpers import AUTH

MODELS = ("seed_mlp", "multi_io")
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]
EXAMPLES_PER_OPERATION = 40
BUDGET_S = 45.0


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppClient]:
    root = tmp_path_factory.mktemp("schema") / "repository"
    with app_client(root, MODELS) as running:
        yield running


def _operations(client: AppClient, narrowed: bool) -> list[Any]:
    """The schema's operations; `narrowed`: path names and versions mostly hit real models."""
    raw = client.request("GET", "/openapi.json").json()
    if narrowed:
        for item in raw["paths"].values():
            for operation in item.values():
                for parameter in operation.get("parameters", []):
                    if parameter["in"] == "path" and parameter["name"] == "name":
                        parameter["schema"] = {"type": "string", "enum": [*MODELS, "missing"]}
                    elif parameter["in"] == "path":
                        parameter["schema"] = {"type": "string", "enum": ["1", "2", "0"]}
    schema = schemathesis.openapi.from_dict(raw)
    return [result.ok() for result in schema.get_all_operations()]


def _send(client: AppClient, case: Any) -> Any:
    kwargs = case.as_transport_kwargs(base_url="http://127.0.0.1", headers=AUTH)
    method, url = kwargs.pop("method"), kwargs.pop("url")
    assert not kwargs.pop("cookies", None), "the schema declares no cookies"
    allowed = {"headers", "params", "json", "data", "files", "content"}
    unknown = set(kwargs) - allowed
    assert not unknown, f"transport arguments this test does not pass on: {unknown}"
    if isinstance(kwargs.get("data"), (bytes, str)):
        kwargs["content"] = kwargs.pop("data")
    if kwargs.get("files"):
        kwargs["files"] = [_form_part(name, value) for name, value in _items(kwargs["files"])]
    response = client.request(method, url, **kwargs)
    response.request.read()  # schemathesis reads the request back when it reports a failure
    return response


def _items(files: Any) -> list[tuple[str, Any]]:
    return list(files.items()) if isinstance(files, dict) else list(files)


def _form_part(name: str, value: Any) -> tuple[str, Any]:
    """A multipart part httpx accepts: plain form values (ints, bools) become their JSON text."""
    if isinstance(value, tuple) and not isinstance(value[1], (bytes, str)):
        return name, (value[0], json.dumps(value[1]).encode(), *value[2:])
    return name, value


@pytest.mark.parametrize("narrowed", [False, True], ids=["any-names", "real-names"])
def test_every_operation_answers_within_its_schema(client: AppClient, narrowed: bool) -> None:
    operations = _operations(client, narrowed)
    assert len(operations) >= 15, [operation.label for operation in operations]
    deadline = time.monotonic() + BUDGET_S
    failures: list[str] = []
    counts: dict[str, int] = {}
    for operation in operations:
        assert time.monotonic() < deadline, f"over {BUDGET_S} s before {operation.label}"

        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True,
                  database=None, suppress_health_check=list(HealthCheck),
                  phases=[Phase.explicit, Phase.generate])
        @given(case=operation.as_strategy())
        def check(case: Any) -> None:
            label = case.operation.label
            counts[label] = counts.get(label, 0) + 1
            try:
                response = _send(client, case)
                case.validate_response(response, checks=CHECKS)
            except Exception as error:  # noqa: BLE001 - collect every operation's failure
                failures.append(f"{case.method} {case.formatted_path}: {error!r:.400}")
                raise

        try:
            check()
        except Exception:  # noqa: BLE001 - reported below with the others
            pass
    assert failures == []
    assert len(counts) == len(operations), sorted(counts)
