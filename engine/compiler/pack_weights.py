"""Pack dense weights: each constant FullyConnected weight our GEMM multiplies, held only as the
column panels it reads (`engine.kernels.packed_weight`).

Where a plan binds a dense layer whose weight is a plain constant, our GEMM packs it into
panels the first time (`gemm_bind.product_with_weight`) and every plan shares them, beside the
weight itself: two copies of one weight. With the panels in the graph's constants in place of
the weight, every plan of any batch size binds them, and nothing holds the weight in its plain
form. Only a CPU model whose plans compute in float32 reads the panels, so this is not one of
the graph passes `optimize_graph` runs: `Model` applies it (``pack_weights`` among its passes).
"""

from __future__ import annotations

from engine.compiler.layout_weights import weights_read_only_by
from engine.graph.ir import Graph, Node
from engine.kernels import packed_weight
from engine.kernels.workspace import ARENA_FROM_BYTES, HugePageArena


def pack_dense_weights(graph: Graph) -> Graph:
    """``graph`` with its constant dense weights our GEMM multiplies (`packed_weight.packs`)
    held as `packed_weight.PackedWeight`s; the graph itself where it has none."""
    packed = packed_dense_weights(graph)
    if not packed:
        return graph
    return graph.replace(constants={**graph.constants, **packed})


def packed_dense_weights(graph: Graph) -> dict[str, packed_weight.PackedWeight]:
    """The packed form of each constant dense weight of ``graph`` our GEMM multiplies and
    that is not packed yet, by name: all in one arena on huge pages, in the order the graph's
    nodes read them (a run's order), as the weights a plan streams (`HugePageArena`), where
    they come to `ARENA_FROM_BYTES` or more."""
    names = [name for name in _in_reading_order(graph, dense_weight_names(graph))
             if packed_weight.packs(graph.constants[name])]
    total = sum(graph.constants[name].nbytes for name in names)
    arena = HugePageArena() if total >= ARENA_FROM_BYTES else None
    return {name: packed_weight.pack(graph.constants[name], arena) for name in names}


def _in_reading_order(graph: Graph, names: set[str]) -> list[str]:
    """``names`` (constants of ``graph``) in the order of the first node reading each."""
    order: dict[str, None] = {}
    for node in graph.nodes:
        for entry in node.inputs:
            name = graph.nodes[entry.node].name
            if name in names:
                order.setdefault(name)
    return [*order, *sorted(names - order.keys())]


def dense_weight_names(graph: Graph) -> set[str]:
    """Names of the constants that only FullyConnected layers read, as their weight: by a
    FullyConnected node, or by a fused chain whose head is one (`fuse_elementwise`)."""
    return weights_read_only_by(graph, _dense_layer)


def _dense_layer(node: Node) -> bool:
    """Whether ``node`` is a FullyConnected layer, alone or at the head of a fused chain (whose
    inputs start with the head's)."""
    if node.is_variable:
        return False
    if node.opdef.name == "FullyConnected":
        return True
    head = getattr(node.params, "head", None)  # a fused chain's attributes carry its head op
    return head is not None and head.op.name == "FullyConnected"
