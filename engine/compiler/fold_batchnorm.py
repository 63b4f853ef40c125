"""Pass: fold an inference-mode BatchNorm into the Convolution or FullyConnected before it.

``BN(conv(x, W) + b) = conv(x, W * s) + (b - mean) * s + beta`` with
``s = gamma / sqrt(var + eps)`` per output channel (gamma taken as 1 under ``fix_gamma``).
"""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from engine.compiler.rewrite import Rewriter, consumers, head_entries
from engine.graph.ir import Entry, Graph, Node
from engine.ops.registry import Attrs

FOLDABLE_PRODUCERS = ("Convolution", "FullyConnected")


def fold_batchnorm(graph: Graph) -> Graph:
    """Rewrite every foldable producer → BatchNorm pair into one producer with new weights."""
    pairs = _foldable_pairs(graph)
    if not pairs:
        return graph
    rewriter = Rewriter(graph)
    folded_producers = set(pairs.values())
    for index, node in enumerate(graph.nodes):
        if index in folded_producers:
            continue  # emitted together with its BatchNorm
        if index not in pairs:
            rewriter.keep(index)
            continue
        producer_index = pairs[index]
        new_entry = _emit_folded(rewriter, graph, graph.nodes[producer_index], node)
        rewriter.alias(Entry(index, 0), new_entry)
    return rewriter.finish()


def _foldable_pairs(graph: Graph) -> dict[int, int]:
    """BatchNorm index → producer index, for pairs whose weights and statistics are constants."""
    readers = consumers(graph)
    heads = head_entries(graph)
    pairs = {}
    for index, node in enumerate(graph.nodes):
        if node.op != "BatchNorm" or node.params.axis != 1 or node.params.output_mean_var:
            continue
        source = node.inputs[0]
        producer = graph.nodes[source.node]
        if producer.op not in FOLDABLE_PRODUCERS or readers.get((source.node, 0)) != [index]:
            continue
        if (source.node, 0) in heads or not _is_foldable_layout(producer):
            continue
        constant_inputs = [*node.inputs[1:], *producer.inputs[1:]]
        if all(_constant_name(graph, entry) for entry in constant_inputs):
            pairs[index] = source.node
    return pairs


def _is_foldable_layout(producer: Node) -> bool:
    if producer.op == "FullyConnected":
        return bool(producer.params.flatten)  # output is (N, C): BatchNorm's axis 1 is C
    return producer.params.get("layout") in (None, "NCW", "NCHW", "NCDHW")


def _constant_name(graph: Graph, entry: Entry) -> str | None:
    node = graph.nodes[entry.node]
    return node.name if node.is_variable and node.name in graph.constants else None


def _emit_folded(rewriter: Rewriter, graph: Graph, producer: Node, batchnorm: Node) -> Entry:
    constants = graph.constants
    gamma, beta, mean, var = (np.asarray(constants[_constant_name(graph, entry)])
                              for entry in batchnorm.inputs[1:])
    params = batchnorm.params
    if params.fix_gamma:
        gamma = np.ones_like(gamma)
    scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + params.eps)
    weight = np.asarray(constants[_constant_name(graph, producer.inputs[1])])
    bias = (np.asarray(constants[_constant_name(graph, producer.inputs[2])])
            if len(producer.inputs) > 2 else np.zeros(weight.shape[0], weight.dtype))
    new_weight = (weight * scale.reshape(-1, *[1] * (weight.ndim - 1))).astype(weight.dtype)
    new_bias = ((bias - mean) * scale + beta).astype(weight.dtype)
    inputs = (rewriter.entry(producer.inputs[0]),
              rewriter.constant(f"{batchnorm.name}_folded_weight", new_weight),
              rewriter.constant(f"{batchnorm.name}_folded_bias", new_bias))
    attrs = MappingProxyType({**producer.attrs, "no_bias": "False"})
    folded = Node(producer.op, producer.name, attrs, inputs,
                  Attrs({**producer.params, "no_bias": False}))
    return Entry(rewriter.add(folded), 0)
