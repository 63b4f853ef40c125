"""Every V2 path the README and docs/ name is a route of the app."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from starlette.routing import BaseRoute, Match

from service.rest.app import create_app
from service.runtime import Runtime
from tests.service.helpers import settings_for

ROOT = Path(__file__).resolve().parents[3]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A path as the docs write it: `/v2/models/{name}[/versions/{v}]/ready`, `/v2/models/*/infer`,
# `/v2/repository/models/...` (any path below), `localhost:8000/v2/health/ready`.
V2_PATH = re.compile(r"/v2(?:/[^\s`'\"),]*)?")
OPTIONAL = re.compile(r"\[([^\[\]]*)\]")
PLACEHOLDER = re.compile(r"\{[^{}/]*\}|\*")


def documented_paths() -> list[tuple[str, str]]:
    """(document, path) for every V2 path named, each optional part both left out and in."""
    found = []
    for document in DOCUMENTS:
        for match in V2_PATH.finditer(document.read_text()):
            path = match.group()
            path = path if path.endswith("...") else path.rstrip(".:;")
            found += [(document.name, variant) for variant in _variants(path)]
    return sorted(set(found))


def _variants(path: str) -> list[str]:
    """The path with its first ``[optional part]`` left out and kept, recursively."""
    optional = OPTIONAL.search(path)
    if optional is None:
        return [path]
    before, after = path[:optional.start()], path[optional.end():]
    return [*_variants(before + after), *_variants(before + optional.group(1) + after)]


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> list[BaseRoute]:
    """The routes of an app serving both the inference and the management API."""
    app = create_app(Runtime.create(settings_for(tmp_path_factory.mktemp("routes"))))
    return list(app.router.routes)


def _served(routes: list[BaseRoute], path: str) -> bool:
    """Whether a route's pattern takes `path` (for some method: the docs name paths)."""
    scope = {"type": "http", "method": "GET", "path": path, "root_path": "",
             "query_string": b"", "headers": []}
    return any(route.matches(scope)[0] != Match.NONE for route in routes)


def test_the_docs_name_v2_paths() -> None:
    paths = {path for _, path in documented_paths()}
    assert {"/v2/health/ready", "/v2/models/{name}/config"} <= paths


@pytest.mark.parametrize(("document", "path"), documented_paths())
def test_each_documented_path_is_a_route(routes: list[BaseRoute], document: str,
                                         path: str) -> None:
    """A path with placeholders is served once they are filled in. A path ending in ``...``,
    or a fixed path no route serves (a proxy's rule naming ``/v2/repository``), stands for
    the paths below it: some route serves one of them."""
    concrete = PLACEHOLDER.sub("m1", path)
    if not path.endswith("...") and (_served(routes, concrete) or concrete != path):
        assert _served(routes, concrete), f"{document} names {path}, which no route serves"
        return
    prefix = concrete.removesuffix("...").rstrip("/") + "/"
    below = [prefix + rest for rest in ("m1", "m1/load", "index", "health/ready", "models/m1",
                                        "models/m1/load", "models/m1/unload")]
    assert any(_served(routes, candidate) for candidate in below), (
        f"{document} names {path}, and no route serves a path below it")
