"""Run an op through `nd` and through `sym` → JSON → `Graph` → a tiny interpreter, for tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from engine import nd, sym
from engine.graph.ir import Graph


def evaluate(graph: Graph, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Evaluate ``graph`` node by node with the registry kernels; the heads' values."""
    values: list[list[Any]] = []
    for node in graph.nodes:
        if node.is_variable:
            values.append([feeds[node.name]])
            continue
        arguments = [values[entry.node][entry.index] for entry in node.inputs]
        values.append(list(node.opdef.compute(np, node.params, arguments)))
    return [np.asarray(values[entry.node][entry.index]) for entry in graph.heads]


def run_nd(op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """``nd.<op>(*inputs, **attrs)`` as a list of NumPy outputs."""
    result = getattr(nd, op)(*[nd.array(value, dtype=value.dtype) for value in inputs], **attrs)
    results = result if isinstance(result, list) else [result]
    return [value.asnumpy() for value in results]


def build_sym(op: str, input_names: Sequence[str], attrs: Mapping[str, Any],
              name: str | None = None) -> sym.Symbol:
    """``sym.<op>(var(n) for n in input_names, **attrs)``."""
    return getattr(sym, op)(*[sym.var(input_name) for input_name in input_names], **attrs,
                            name=name)


def run_sym(op: str, inputs: Mapping[str, np.ndarray], attrs: Mapping[str, Any],
            name: str | None = None) -> list[np.ndarray]:
    """Build the op symbolically, round-trip it through JSON and evaluate the graph."""
    symbol = build_sym(op, list(inputs), attrs, name)
    graph = sym.fromjson(symbol.tojson()).to_graph()
    return evaluate(graph, inputs)


def check_op(op: str, inputs: Mapping[str, np.ndarray], attrs: Mapping[str, Any],
             rtol: float = 1e-6, atol: float = 1e-6) -> list[np.ndarray]:
    """Run ``op`` both ways, assert the outputs agree (and shapes/dtypes infer), return them."""
    imperative = run_nd(op, list(inputs.values()), attrs)
    symbolic = run_sym(op, inputs, attrs)
    assert len(imperative) == len(symbolic)
    for position, (left, right) in enumerate(zip(imperative, symbolic, strict=True)):
        assert left.shape == right.shape, f"{op} output {position}: {left.shape} != {right.shape}"
        assert left.dtype == right.dtype, f"{op} output {position}: {left.dtype} != {right.dtype}"
        np.testing.assert_allclose(left, right, rtol=rtol, atol=atol, err_msg=f"{op} #{position}")
    symbol = build_sym(op, list(inputs), attrs)
    shapes = {key: value.shape for key, value in inputs.items()}
    _, out_shapes, _ = symbol.infer_shape(**shapes)
    assert [tuple(shape) for shape in out_shapes] == [value.shape for value in imperative]
    dtypes = {key: value.dtype for key, value in inputs.items()}
    _, out_types, _ = symbol.infer_type(**dtypes)
    assert [np.dtype(kind) for kind in out_types] == [value.dtype for value in imperative]
    return imperative
