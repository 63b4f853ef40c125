"""Symbolic DAG nodes and their conversion to and from the `Graph` IR.

A `SymNode` is immutable and compared by identity: two ``var('data')`` calls are two nodes, as
in MXNet. `to_graph` orders nodes as MXNet's depth-first post-order from the heads (inputs in
order), so a shared subexpression appears once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from engine.graph.ir import VARIABLE, Entry, Graph, Node
from engine.ops.registry import Attrs, OpDef, get_op

_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, eq=False)
class SymNode:
    """One operator application or variable; ``inputs`` are ``(node, output, version)``."""

    op: str
    name: str
    attrs: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    inputs: tuple[tuple[SymNode, int, int], ...] = field(default=(), repr=False)
    params: Attrs = field(default_factory=lambda: Attrs({}), repr=False)

    @property
    def is_variable(self) -> bool:
        """Whether this node is a variable."""
        return self.op == VARIABLE

    @property
    def opdef(self) -> OpDef:
        """The registry record of the op (not for variables)."""
        return get_op(self.op, f"node {self.name!r}")

    def output_names(self) -> tuple[str, ...]:
        """Visible output names (``output`` for most ops)."""
        return ("output",) if self.is_variable else self.opdef.output_names(self.params)

    def output_label(self, index: int) -> str:
        """MXNet's ``list_outputs`` label of output ``index``: ``<node>_<output>``."""
        return self.name if self.is_variable else f"{self.name}_{self.output_names()[index]}"

    def aux_flags(self) -> list[bool]:
        """For each input, whether it is an auxiliary-state slot."""
        if self.is_variable or not self.opdef.aux:
            return [False] * len(self.inputs)
        names = self.opdef.input_names(self.params)
        return [name in self.opdef.aux for name in names]


def topological(heads: Sequence[SymNode]) -> list[SymNode]:
    """Every node reachable from ``heads``, inputs before users, in MXNet's DFS order."""
    seen: set[int] = set()
    order: list[SymNode] = []
    for head in heads:
        stack: list[tuple[SymNode, bool]] = [(head, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in seen:
                continue
            if expanded:
                seen.add(id(node))
                order.append(node)
                continue
            stack.append((node, True))
            stack.extend((child, False) for child, _, _ in reversed(node.inputs)
                         if id(child) not in seen)
    return order


def aux_nodes(nodes: Sequence[SymNode]) -> set[int]:
    """Ids of variables wired into an auxiliary-state slot of some op."""
    found: set[int] = set()
    for node in nodes:
        for (child, _, _), is_aux in zip(node.inputs, node.aux_flags(), strict=False):
            if is_aux and child.is_variable:
                found.add(id(child))
    return found


def to_graph(outputs: Sequence[tuple[SymNode, int]],
             attrs: Mapping[str, Any] | None = None) -> Graph:
    """The `Graph` for these output entries: topologically ordered, shared nodes once."""
    nodes = topological([node for node, _ in outputs])
    position = {id(node): index for index, node in enumerate(nodes)}
    graph_nodes = tuple(
        Node(node.op, node.name, node.attrs,
             tuple(Entry(position[id(child)], index, version)
                   for child, index, version in node.inputs), node.params)
        for node in nodes)
    heads = tuple(Entry(position[id(node)], index, 0) for node, index in outputs)
    return Graph(graph_nodes, heads, MappingProxyType(dict(attrs or {})))


def from_graph(graph: Graph) -> list[tuple[SymNode, int]]:
    """Output entries of SymNodes equivalent to ``graph`` (its heads, in order)."""
    built: list[SymNode] = []
    for node in graph.nodes:
        inputs = tuple((built[entry.node], entry.index, entry.version) for entry in node.inputs)
        built.append(SymNode(node.op, node.name, node.attrs, inputs, node.params))
    return [(built[entry.node], entry.index) for entry in graph.heads]
