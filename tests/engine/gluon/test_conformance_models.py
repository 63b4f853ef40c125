"""Rebuilt conformance architectures: MXNet's weights give MXNet's outputs, and export writes
the graph MXNet wrote (same nodes, names, attributes, inputs and heads)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import engine
from engine import nd
from engine.gluon import SymbolBlock
from tests.conformance.fixtures import model_files, model_io_sets, model_meta
from tests.engine.gluon.nets import BUILDERS

NAMES = sorted(BUILDERS)


def _check(actual: list, expected: list, name: str) -> None:
    tolerance = model_meta(name)["tolerance"]
    rtol = max(tolerance["rtol"], 1e-3 if name in ("text_lstm", "resblock") else 0)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=tolerance["atol"])


def _outputs(result: object) -> list[np.ndarray]:
    items = result if isinstance(result, (list, tuple)) else [result]
    return [item.asnumpy() for item in items]


def _loaded(name: str):
    net = BUILDERS[name]()
    net.load_parameters(str(model_files(name)[1]))
    return net


@pytest.mark.parametrize("name", NAMES)
def test_imperative_and_hybridized_match_mxnet(name: str) -> None:
    net = _loaded(name)
    for inputs, expected in model_io_sets(name):
        arrays = [nd.array(value, dtype=value.dtype) for value in inputs.values()]
        _check(_outputs(net(*arrays)), expected, name)
    net.hybridize()
    for _ in range(2):
        for inputs, expected in model_io_sets(name):
            arrays = [nd.array(value, dtype=value.dtype) for value in inputs.values()]
            _check(_outputs(net(*arrays)), expected, name)


def _nodes(text: str) -> tuple[list, list]:
    # Entries are compared without their version field: MXNet bumps an auxiliary variable's
    # version each time a graph is composed with it, so it records tracing history, not
    # structure (the files hold 2 after a deferred-init trace plus the hybridize trace).
    graph = json.loads(text)
    nodes = [(node["op"], node["name"], node.get("attrs", {}),
              [entry[:2] for entry in node["inputs"]]) for node in graph["nodes"]]
    return nodes, graph["heads"]


@pytest.mark.parametrize("name", NAMES)
def test_export_writes_mxnets_graph_and_reloads(name: str, tmp_path) -> None:
    net = _loaded(name)
    net.hybridize()
    inputs, expected = model_io_sets(name)[0]
    net(*[nd.array(value, dtype=value.dtype) for value in inputs.values()])
    symbol_file, params_file = net.export(str(tmp_path / name))
    symbol_path = model_files(name)[0]
    got_nodes, got_heads = _nodes(Path(symbol_file).read_text())
    want_nodes, want_heads = _nodes(symbol_path.read_text())
    for got, want in zip(got_nodes, want_nodes):
        assert got == want
    assert len(got_nodes) == len(want_nodes)
    assert got_heads == want_heads
    model = engine.load_model(symbol_file, params_file)
    feed = {f"data{i}" if len(inputs) > 1 else "data": value
            for i, value in enumerate(inputs.values())}
    _check(list(model.infer(feed).values()), expected, name)
    block = SymbolBlock.imports(symbol_file, list(feed), params_file)
    _check(_outputs(block(*[nd.array(v, dtype=v.dtype) for v in inputs.values()])), expected,
           name)
