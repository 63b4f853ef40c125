"""The reference interpreter: evaluates a graph node by node, with no optimisation at all.

It is the baseline every optimisation is checked against (``optimize=False`` always selects it),
so it stays deliberately plain: one pass in topological order, values freed after their last use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.errors import EngineError, ExecutionError, InputError
from engine.graph.infer import specialize_sources
from engine.graph.ir import Graph
from engine.ops.control import subgraphs


def last_uses(graph: Graph) -> list[list[int]]:
    """For each node index, the nodes whose values can be dropped once it has run."""
    last: dict[int, int] = {}
    for index, node in enumerate(graph.nodes):
        for entry in node.inputs:
            last[entry.node] = index
    for entry in graph.heads:
        last[entry.node] = len(graph.nodes)
    drops: list[list[int]] = [[] for _ in graph.nodes]
    for producer, consumer in last.items():
        if consumer < len(graph.nodes):
            drops[consumer].append(producer)
    return drops


def evaluate(graph: Graph, feed: Mapping[str, Any], xp: Any,
             shapes: list[list[tuple[int, ...] | None]] | None = None) -> list[Any]:
    """Run ``graph`` on ``feed`` (variable name → array); return the head values in order.

    Raises:
        InputError: a variable has no value in ``feed``.
        ExecutionError: a kernel failed; the message names the node and its op.
    """
    values: list[tuple[Any, ...] | None] = [None] * len(graph.nodes)
    drops = last_uses(graph)
    for index, node in enumerate(graph.nodes):
        if node.is_variable:
            if node.name not in feed:
                raise InputError(f"no value for variable {node.name!r}")
            values[index] = (feed[node.name],)
            continue
        args = [values[entry.node][entry.index] for entry in node.inputs]  # type: ignore[index]
        params = specialize_sources(node, shapes[index]) if shapes else node.params
        try:
            values[index] = node.opdef.compute(xp, params, args)
        except EngineError as error:
            raise ExecutionError(f"while running {node.describe()}: {error}") from error
        except Exception as error:  # a kernel bug or bad data: say where it happened
            raise ExecutionError(f"while running {node.describe()}: "
                                 f"{type(error).__name__}: {error}") from error
        for producer in drops[index]:
            values[producer] = None
    return [values[entry.node][entry.index] for entry in graph.heads]  # type: ignore[index]


subgraphs.provide_evaluation(evaluate)  # control-flow operators run their bodies here
