"""Fuzzing the readers with mutated real files: only `ModelFormatError` subclasses may escape."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import ModelFormatError
from engine.graph.json_format import graph_from_json, graph_to_json
from engine.graph.params import load_params
from tests.conformance.fixtures import MODELS, PARAMS

PARAMS_FILES = [
    (MODELS / "hybridnet" / "hybridnet-0000.params").read_bytes(),
    (MODELS / "multi_io" / "multi_io-0000.params").read_bytes(),
    (PARAMS / "dtypes.params").read_bytes(),
    (PARAMS / "np_shape_v3.params").read_bytes(),
    (PARAMS / "unnamed_list.params").read_bytes(),
    (PARAMS / "cnn_fp16-0000.params").read_bytes(),
]
SYMBOL_FILES = [
    json.loads((MODELS / name / f"{name}-symbol.json").read_text())
    for name in ("seed_mlp", "hybridnet", "multi_io", "legacy_json")
]
SYMBOL_FILES.append(json.loads((PARAMS / "cnn_fp16-symbol.json").read_text()))

FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
INTERESTING_INTS = [0, 1, -1, 2, 255, 2**31 - 1, -(2**31), 2**32 - 1, 2**40, 2**63 - 1,
                    0xF993FAC8, 0xF993FAC9, 0xF993FACA, 0x112]


# --- .params -------------------------------------------------------------------------------------


@st.composite
def mutated_params(draw: st.DrawFn) -> bytes:
    content = bytearray(draw(st.sampled_from(PARAMS_FILES)))
    for _ in range(draw(st.integers(1, 3))):
        # Headers are where the interesting decisions are: bias positions towards the start.
        limit = draw(st.sampled_from([min(len(content), 128), len(content)]))
        position = draw(st.integers(0, limit))
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "int32", "int64"]))
        if kind == "flip" and position < len(content):
            content[position] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del content[position:]
        elif kind == "insert":
            content[position:position] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del content[position:position + draw(st.integers(1, 16))]
        elif kind in ("int32", "int64"):
            size = 4 if kind == "int32" else 8
            value = draw(st.sampled_from(INTERESTING_INTS)) % (1 << (8 * size))
            content[position:position + size] = value.to_bytes(size, "little")
    return bytes(content)


@FUZZ
@given(mutated_params())
def test_mutated_params_raise_only_format_errors(content: bytes) -> None:
    try:
        loaded = load_params(content)
    except ModelFormatError:
        return
    assert all(isinstance(array, np.ndarray) for array in loaded.arrays)
    assert loaded.names is None or len(loaded.names) == len(loaded.arrays)
    try:
        loaded.as_dict()
    except ModelFormatError:
        pass


# --- symbol JSON ---------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats()
    | st.text(max_size=8) | st.sampled_from(["1e400", "99999999999999999999", "(2, -1)", "None"]),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=8,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            paths += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            paths += _paths(child, (*prefix, index))
    return paths


def _parent(document: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        document = document[key]
    return document


@st.composite
def mutated_symbols(draw: st.DrawFn) -> Any:
    document = copy.deepcopy(draw(st.sampled_from(SYMBOL_FILES)))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["delete", "replace", "integer", "reference", "attribute"]))
        nodes = document.get("nodes") if isinstance(document, dict) else None
        if kind == "reference" and isinstance(nodes, list) and nodes:
            _mutate_reference(draw, nodes)
        elif kind == "attribute" and isinstance(nodes, list) and nodes:
            node = nodes[draw(st.integers(0, len(nodes) - 1))]
            if isinstance(node, dict) and isinstance(node.get("attrs", {}), dict):
                key = draw(st.sampled_from(["num_hidden", "num_args", "num_outputs", "kernel",
                                            "act_type", "__shape__", "flatten", "lr_mult"]))
                node.setdefault("attrs", {})[key] = draw(
                    st.sampled_from(["10000000000000", "-1", "1e400", "(0, 0)", "relu", "x"]))
        else:
            path = draw(st.sampled_from(_paths(document)[1:] or [()]))
            if not path:
                return draw(JSON_VALUES)
            parent = _parent(document, path)
            if kind == "delete":
                del parent[path[-1]]
            elif kind == "replace":
                parent[path[-1]] = draw(JSON_VALUES)
            else:
                parent[path[-1]] = draw(st.sampled_from(INTERESTING_INTS) | st.integers())
    return document


def _mutate_reference(draw: st.DrawFn, nodes: list[Any]) -> None:
    index = draw(st.integers(0, len(nodes) - 1))
    node = nodes[index]
    if isinstance(node, dict) and isinstance(node.get("inputs"), list) and node["inputs"]:
        slot = draw(st.integers(0, len(node["inputs"]) - 1))
        # A later node (a cycle), itself, past the end, or negative.
        target = draw(st.integers(index, len(nodes) + 3) | st.integers(-(2**64), -1))
        node["inputs"][slot] = [target, draw(st.integers(0, 3)), 0]


def _check(source: Any) -> None:
    try:
        graph = graph_from_json(source)
    except ModelFormatError:
        return
    again = graph_from_json(graph_to_json(graph))
    assert again.nodes == graph.nodes and again.heads == graph.heads


@FUZZ
@given(mutated_symbols())
def test_mutated_symbols_raise_only_format_errors(document: Any) -> None:
    _check(copy.deepcopy(document))
    _check(json.dumps(document))


@settings(max_examples=60, deadline=None, database=None)
@given(st.sampled_from(SYMBOL_FILES), st.data())
def test_mutated_json_text_raises_only_format_errors(document: Any, data: st.DataObject) -> None:
    text = bytearray(json.dumps(document, indent=1).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(text) - 1))
        text[position] = data.draw(st.sampled_from(b'{}[]",:0123456789-e \\\xff'))
    _check(bytes(text))
