"""`Rewriter`: builds a new graph from an old one while keeping entry references straight."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.graph.ir import VARIABLE, Entry, Graph, Node


class Rewriter:
    """Copy, replace or drop nodes of ``graph`` in order; `finish` returns the new graph.

    Old entries are translated to new ones through `entry`; a pass either `keep`s a node (its
    inputs translated), `add`s a new node, or `alias`es an old output to an existing new entry.
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes: list[Node] = []
        self.constants: dict[str, Any] = dict(graph.constants)
        self._entries: dict[tuple[int, int], Entry] = {}

    def entry(self, old: Entry) -> Entry:
        """The new entry standing for an old one."""
        return self._entries[(old.node, old.index)]

    def add(self, node: Node) -> int:
        """Append a node whose inputs already refer to new entries; return its index."""
        self.nodes.append(node)
        return len(self.nodes) - 1

    def keep(self, old_index: int) -> int:
        """Copy old node ``old_index`` with translated inputs."""
        node = self.graph.nodes[old_index]
        inputs = tuple(self.entry(e)._replace(version=e.version) for e in node.inputs)
        new_index = self.add(node if inputs == node.inputs else Node(
            node.op, node.name, node.attrs, inputs, node.params))
        for slot in range(node.num_outputs()):
            self._entries[(old_index, slot)] = Entry(new_index, slot)
        return new_index

    def alias(self, old: Entry, new: Entry) -> None:
        """Make every later reference to ``old`` read ``new`` instead."""
        self._entries[(old.node, old.index)] = new

    def constant(self, name: str, value: Any) -> Entry:
        """A new variable node bound to ``value`` in the graph's constants."""
        self.constants[name] = value
        return Entry(self.add(Node(VARIABLE, name)), 0)

    def finish(self, attrs: Mapping[str, Any] | None = None) -> Graph:
        """The rewritten graph, dropping constants no variable refers to."""
        heads = tuple(self.entry(entry) for entry in self.graph.heads)
        names = {node.name for node in self.nodes if node.op == VARIABLE}
        constants = {name: value for name, value in self.constants.items() if name in names}
        return Graph(tuple(self.nodes), heads, self.graph.attrs if attrs is None else attrs,
                     constants)


def consumers(graph: Graph) -> dict[tuple[int, int], list[int]]:
    """For each (node, output) entry, the indices of the nodes reading it (heads excluded)."""
    readers: dict[tuple[int, int], list[int]] = {}
    for index, node in enumerate(graph.nodes):
        for entry in node.inputs:
            readers.setdefault((entry.node, entry.index), []).append(index)
    return readers


def head_entries(graph: Graph) -> set[tuple[int, int]]:
    """The (node, output) pairs that are graph outputs."""
    return {(entry.node, entry.index) for entry in graph.heads}
