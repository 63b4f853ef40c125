"""Graph compiler: passes `Graph -> Graph`, each switchable by name through ``optimize=``.

Passes run in the order of `PASSES`. ``plan_memory`` is not a graph rewrite but the buffer
reuse done when a plan is compiled, and ``pack_weights`` (`pack_weights.pack_dense_weights`)
one that only a CPU model computing in float32 applies to its optimised graph; both are named
here so they can be switched off like the rest.
Shape and dtype inference for the given input shapes always runs when a plan is compiled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.compiler.eliminate_dead_nodes import eliminate_dead_nodes
from engine.compiler.fold_batchnorm import fold_batchnorm
from engine.compiler.fold_constants import fold_constants
from engine.compiler.fuse_elementwise import fuse_elementwise
from engine.compiler.layout_weights import layout_weights
from engine.graph.ir import Graph, verify

GRAPH_PASSES: dict[str, Callable[[Graph], Graph]] = {
    "fold_constants": fold_constants,
    "fold_batchnorm": fold_batchnorm,
    "eliminate_dead_nodes": eliminate_dead_nodes,
    "layout_weights": layout_weights,  # before fusion: it looks for FullyConnected nodes
    "fuse_elementwise": fuse_elementwise,
}
PASSES = (*GRAPH_PASSES, "pack_weights", "plan_memory")


def select_passes(optimize: bool | Sequence[str]) -> tuple[str, ...]:
    """Pass names for an ``optimize=`` value (True: all, False: none, or a list of names)."""
    if optimize is True:
        return PASSES
    if optimize is False:
        return ()
    unknown = [name for name in optimize if name not in PASSES]
    if unknown:
        raise ValueError(f"unknown pass {unknown[0]!r}; passes are: {', '.join(PASSES)}")
    return tuple(name for name in PASSES if name in optimize)


def optimize_graph(graph: Graph, passes: Sequence[str], check: bool = False) -> Graph:
    """Run the named graph passes in order (``verify`` after each one when ``check``)."""
    for name in passes:
        if name in GRAPH_PASSES:
            graph = GRAPH_PASSES[name](graph)
            if check:
                verify(graph)
    return graph


__all__ = ["PASSES", "optimize_graph", "select_passes"]
