"""Pass: drop nodes that no graph output depends on."""

from __future__ import annotations

from engine.compiler.rewrite import Rewriter
from engine.graph.ir import Graph


def eliminate_dead_nodes(graph: Graph) -> Graph:
    """Keep only the nodes the heads reach; the same graph object if nothing is dead."""
    live = [False] * len(graph.nodes)
    for entry in graph.heads:
        live[entry.node] = True
    for index in range(len(graph.nodes) - 1, -1, -1):
        if live[index]:
            for entry in graph.nodes[index].inputs:
                live[entry.node] = True
    if all(live):
        return graph
    rewriter = Rewriter(graph)
    for index, alive in enumerate(live):
        if alive:
            rewriter.keep(index)
    return rewriter.finish()
