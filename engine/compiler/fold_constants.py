"""Pass: evaluate, once at load time, every node that depends only on constants."""

from __future__ import annotations

import numpy as np

from engine.compiler.rewrite import Rewriter
from engine.graph.infer import infer_shapes, specialize_sources
from engine.graph.ir import Entry, Graph, Node
from engine.ops.shapes import is_known


def fold_constants(graph: Graph) -> Graph:
    """Replace parameter-only subgraphs by their values (bound as new constants).

    A node folds when all its inputs are constants and its output shapes are fully known
    without any model input (so ``_zeros`` shaped by the batch size stays in the graph).
    """
    constant = _constant_nodes(graph)
    if not any(constant[i] and not node.is_variable for i, node in enumerate(graph.nodes)):
        return graph
    shapes = infer_shapes(graph, {name: np.shape(value)
                                  for name, value in graph.constants.items()})
    foldable = [constant[index] and not node.is_variable
                and all(is_known(shape) for shape in shapes[index])
                for index, node in enumerate(graph.nodes)]
    if not any(foldable):
        return graph
    values: dict[tuple[int, int], np.ndarray] = {}
    rewriter = Rewriter(graph)
    for index, node in enumerate(graph.nodes):
        outputs = _evaluate(node, shapes[index], values) if foldable[index] else None
        if outputs is None:
            if node.is_variable and node.name in graph.constants:
                values[(index, 0)] = graph.constants[node.name]
            for entry in node.inputs:
                _materialize(rewriter, graph, values, entry)
            rewriter.keep(index)
            continue
        for slot, output in enumerate(outputs):
            values[(index, slot)] = np.asarray(output)
    for entry in graph.heads:
        _materialize(rewriter, graph, values, entry)
    return rewriter.finish()


def _evaluate(node: Node, shapes: list, values: dict) -> tuple | None:
    """The node's outputs from its folded inputs, or None to keep it in the graph: when an input
    stayed unfolded, or when its kernel fails (an SVD of NaNs), so that the failure surfaces
    when the model runs, naming the node, as it would without folding."""
    if any((entry.node, entry.index) not in values for entry in node.inputs):
        return None
    args = [values[(entry.node, entry.index)] for entry in node.inputs]
    try:
        return node.opdef.compute(np, specialize_sources(node, shapes), args)
    except Exception:  # noqa: BLE001 (any kernel error: the plan reports it with the node)
        return None


def _constant_nodes(graph: Graph) -> list[bool]:
    constant = []
    for node in graph.nodes:
        if node.is_variable:
            constant.append(node.name in graph.constants)
        else:
            constant.append(all(constant[entry.node] for entry in node.inputs))
    return constant


def _materialize(rewriter: Rewriter, graph: Graph, values: dict, entry: Entry) -> None:
    """Give a folded value a constant variable the first time a kept node needs it."""
    key = (entry.node, entry.index)
    node = graph.nodes[entry.node]
    if node.is_variable or key not in values:
        return
    try:
        rewriter.entry(entry)
    except KeyError:
        suffix = f"_output{entry.index}" if node.num_outputs() > 1 else "_output"
        rewriter.alias(entry, rewriter.constant(f"{node.name}{suffix}_folded", values[key]))
