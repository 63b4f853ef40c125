"""Pass: store FullyConnected weights column-major, so the matmul reads ``Wᵀ`` contiguously.

FullyConnected computes ``x · Wᵀ`` with ``W`` of shape (units, inputs). Row-major ``W`` makes
``Wᵀ`` a strided view, and OpenBLAS runs slower on it (the seed MLP's 64-row batch: 25%, one
row: 0.4 µs per layer). The values, shape and meaning of ``W`` do not change, only its memory
order, so every kernel and shape rule stays as it is. A weight held as our GEMM's panels
(`engine.kernels.packed_weight`) has its own order and is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.graph.ir import Graph, Node
from engine.kernels.packed_weight import PackedWeight


def layout_weights(graph: Graph) -> Graph:
    """A graph whose constant FullyConnected weights are Fortran-ordered copies."""
    relaid = column_major_weights(graph)
    if not relaid:
        return graph
    return graph.replace(constants={**graph.constants, **relaid})


def column_major_weights(graph: Graph) -> dict[str, np.ndarray]:
    """Fortran-ordered copies of the constant FullyConnected weights not already so. A model
    binds its parameters in this order up front, so that the pass finds nothing to copy and
    no weight is held in both orders."""
    names = weights_read_only_by(graph, lambda node: node.op == "FullyConnected")
    return {name: np.asfortranarray(graph.constants[name]) for name in names
            if not isinstance(graph.constants[name], PackedWeight)  # our GEMM's panels
            and np.ndim(graph.constants[name]) == 2
            and not np.asarray(graph.constants[name]).flags.f_contiguous}


def weights_read_only_by(graph: Graph, takes_weight: Callable[[Node], bool]) -> set[str]:
    """Names of the constants that only nodes ``takes_weight`` accepts read, and only as their
    weight (input 1): a constant any other node or input slot reads is left out."""
    weights: set[str] = set()
    other_readers: set[str] = set()
    for node in graph.nodes:
        for slot, entry in enumerate(node.inputs):
            source = graph.nodes[entry.node]
            if not source.is_variable or source.name not in graph.constants:
                continue
            if slot == 1 and takes_weight(node):
                weights.add(source.name)
            else:
                other_readers.add(source.name)
    return weights - other_readers
