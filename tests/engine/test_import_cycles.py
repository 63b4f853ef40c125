"""The frontends' modules import one way: no import cycle runs through `engine.gluon` or
`engine.sym`, counting every import statement (function-level and ``TYPE_CHECKING`` ones too,
which only hide a cycle until someone moves them)."""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "engine"


def module_files() -> dict[str, Path]:
    """Every module of ``engine`` by dotted name (a package by its ``__init__.py``)."""
    modules = {}
    for path in ENGINE.rglob("*.py"):
        parts = path.relative_to(ENGINE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported(path: Path, modules: dict[str, Path]) -> set[str]:
    """The ``engine`` modules a file imports anywhere in it. ``from package import submodule``
    counts as importing the submodule only; the package's own names count as the package."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & modules.keys()
            found |= submodules
            if node.module in modules and len(submodules) < len(node.names):
                found.add(node.module)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported(path, modules) - {name} for name, path in modules.items()}


def cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A shortest import chain from ``start`` back to itself, or None."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for target in sorted(graph[module]):
            if target == start:
                chain = [module]
                while chain[-1] != start:
                    chain.append(came_from[chain[-1]])
                return [*reversed(chain), start]
            if target not in came_from:
                came_from[target] = module
                queue.append(target)
    return None


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert cycle_through(graph, "a") == ["a", "b", "c", "a"]
    assert cycle_through(graph, "d") is None


@pytest.mark.parametrize("package", ["engine.gluon", "engine.sym"])
def test_no_import_cycle_runs_through_the_package(package: str) -> None:
    graph = import_graph()
    members = [name for name in graph if name == package or name.startswith(package + ".")]
    assert len(members) > 5  # the package was found
    cycles = [" -> ".join(chain) for name in members
              if (chain := cycle_through(graph, name)) is not None]
    assert not cycles, ("import cycles (make one side stop importing the other):\n"
                        + "\n".join(cycles))
