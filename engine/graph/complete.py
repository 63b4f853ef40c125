"""What a graph alone says about its inputs' shapes, for models exported without any.

Gluon exports carry no ``__shape__`` on the data variable, so shape inference from the
parameters alone often leaves an input's rank unknown. `complete_input_shapes` picks the
smallest rank that shape inference accepts (with one row in the batch dimension) and lets
inference fill every dimension the graph determines: the seed MLP's input becomes ``(0, 512)``
(batch unknown, 512 features from its first FullyConnected), a CNN's ``(0, 3, 0, 0)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from engine.errors import ShapeError
from engine.graph.infer import MaybeShape, infer_shapes
from engine.graph.ir import Graph

MAX_RANK = 6  # ranks tried for an input that no node constrains otherwise


def complete_input_shapes(graph: Graph, known: Mapping[str, tuple[int, ...]],
                          input_names: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Shapes of `input_names` (0 for each unknown dimension) as far as the graph fixes them.

    `known` holds the parameters' shapes. An input the graph gives no rank is tried at ranks
    1 to `MAX_RANK` with one row and the other dimensions unknown; the smallest rank that
    shape inference accepts is kept. Inputs whose rank no attempt settles are left out.

    Raises:
        ShapeError: the parameters alone do not fit the graph.
    """
    index = {graph.nodes[i].name: i for i in graph.variable_indices()}
    chosen: dict[str, tuple[int, ...]] = {}
    shapes = infer_shapes(graph, known)
    for name in input_names:
        shape: MaybeShape = shapes[index[name]][0]
        if shape is None:
            rank = _smallest_rank(graph, {**known, **chosen}, name)
            if rank is None:
                continue
            try:  # with the rank fixed, inference fills what the graph determines
                shapes = infer_shapes(graph, {**known, **chosen, name: (0,) * rank})
            except ShapeError:
                continue
            shape = shapes[index[name]][0]
        if shape is not None:
            chosen[name] = shape
    return chosen


def _smallest_rank(graph: Graph, known: Mapping[str, tuple[int, ...]], name: str) -> int | None:
    for rank in range(1, MAX_RANK + 1):
        try:
            infer_shapes(graph, {**known, name: (1, *(0,) * (rank - 1))})
        except ShapeError:
            continue
        return rank
    return None


def upstream_inputs(graph: Graph, node_name: str) -> list[str]:
    """Names of the variables `node_name` depends on, in graph order (empty if no such node)."""
    by_name = {node.name: index for index, node in enumerate(graph.nodes)}
    start = by_name.get(node_name)
    if start is None:
        return []
    seen = {start}
    pending = [start]
    while pending:
        for entry in graph.nodes[pending.pop()].inputs:
            if entry.node not in seen:
                seen.add(entry.node)
                pending.append(entry.node)
    return [graph.nodes[index].name for index in sorted(seen) if graph.nodes[index].is_variable]
