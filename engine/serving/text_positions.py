"""Upload check of a text pipeline's length against the model's position table.

BERT looks each token's position up in a table of learned rows. GluonNLP's export computes the
positions from the token ids' shape (``_contrib_arange_like`` over the sequence axis) and reads
them with an ``Embedding``, which clips an index past its table to the last row: rows longer
than the table run, and answer wrongly. So at upload the positions a padded row gives are
computed from the graph itself, and a pipeline whose rows reach past a table is refused.

An ``Embedding`` reads positions when a range op is among the ancestors of its indices; its
indices are evaluated on the dry run's row (only the nodes they depend on run), so the check
holds whatever ops lie between the range and the lookup (a transpose, a cast, an offset).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from engine.errors import EngineError
from engine.graph.ir import Entry, Graph, Node
from engine.runtime.interpreter import evaluate
from engine.serving.errors import InvalidModel

# Ops whose values are positions rather than data: ranges, `arange_like` over a shape.
RANGE_OPS = frozenset({"_contrib_arange_like", "_arange"})
LOOKUP_OP = "Embedding"


def check_positions(model: Any, rows: Mapping[str, np.ndarray], length: int, field: str
                    ) -> None:
    """Refuse rows of `length` tokens when a position `Embedding` of `model`'s graph would be
    indexed past its table.

    Args:
        model: the loaded model (its ``graph`` and ``params``; skipped without them).
        rows: the dry run's tensors, one batch row each, by graph input name.
        length: the padded length of those rows.
        field: where the error points (``inputs.0.preprocess.text``).

    Raises:
        InvalidModel: naming the node, its table's rows and the longest length that fits.
    """
    graph, params = getattr(model, "graph", None), getattr(model, "params", None)
    if not isinstance(graph, Graph) or not isinstance(params, Mapping):
        return
    for node in position_lookups(graph):
        positions = _indices(graph, node.inputs[0], {**params, **rows})
        if positions is None or positions.size == 0:
            continue
        table, largest = _table_rows(graph, node, params), int(np.max(positions))
        if largest >= table:
            fits = length - (largest - table + 1)
            raise InvalidModel(
                f"{field}.max_length: rows of {length} tokens take positions up to {largest}, "
                f"but {node.describe()} looks positions up in a table of {table} rows; "
                "positions past it would be clipped to its last row and the answers silently "
                f"wrong: set max_length to at most {fits}, the longest the model was built for")


def position_lookups(graph: Graph) -> list[Node]:
    """The ``Embedding`` nodes whose indices derive from a range op (positions)."""
    ranged: list[bool] = []
    for node in graph.nodes:
        ranged.append(not node.is_variable and (
            node.opdef.name in RANGE_OPS or any(ranged[entry.node] for entry in node.inputs)))
    return [node for node in graph.nodes
            if not node.is_variable and node.opdef.name == LOOKUP_OP and node.inputs
            and ranged[node.inputs[0].node]]


def _indices(graph: Graph, entry: Entry, feed: Mapping[str, Any]) -> np.ndarray | None:
    """The value of `entry` on `feed`, running only the nodes it depends on (None: it needs a
    variable `feed` lacks, or fails; the dry run reports such failures)."""
    needed = sorted(_ancestors(graph, entry.node))
    position = {old: new for new, old in enumerate(needed)}
    nodes = tuple(replace(graph.nodes[old], inputs=tuple(
        Entry(position[source.node], source.index, source.version)
        for source in graph.nodes[old].inputs)) for old in needed)
    if any(node.is_variable and node.name not in feed for node in nodes):
        return None
    subgraph = Graph(nodes, (Entry(position[entry.node], entry.index),))
    try:
        [value] = evaluate(subgraph, feed, np)
    except EngineError:
        return None
    return np.asarray(value)


def _ancestors(graph: Graph, start: int) -> set[int]:
    """`start` and every node it reads, directly or not."""
    found, pending = {start}, [start]
    while pending:
        for entry in graph.nodes[pending.pop()].inputs:
            if entry.node not in found:
                found.add(entry.node)
                pending.append(entry.node)
    return found


def _table_rows(graph: Graph, node: Node, params: Mapping[str, Any]) -> int:
    """Rows of an Embedding's table: its weight's, else its ``input_dim``."""
    weight = graph.nodes[node.inputs[1].node] if len(node.inputs) > 1 else None
    if weight is not None and weight.is_variable and weight.name in params:
        return int(np.shape(params[weight.name])[0])
    return int(node.params["input_dim"])
