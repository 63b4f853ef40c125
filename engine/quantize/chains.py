"""The layers an int8 graph quantizes, each with the nodes oneDNN fuses into it.

A chain is a Convolution followed by, each optional and in this order, a BatchNorm over its
channels, a relu or a clip from 0 (relu6: oneDNN's bounded relu, the clip's top cut by the
fused node's uint8 output, whose calibrated range ends at or below it), a residual sum with
another tensor and a relu after the sum; or a
FullyConnected with a relu. A node joins its chain only when the chain's value so far feeds it
alone (nothing else reads the value it replaces, and it is no graph output).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from engine.graph.ir import Entry, Graph, Node

SUM_OPS = ("elemwise_add", "_plus", "_Plus")


def is_global_average(node: Node) -> bool:
    """Whether ``node`` is a global average pooling over NCHW data (a network's head)."""
    return (node.op == "Pooling" and node.params.pool_type == "avg"
            and bool(node.params.global_pool) and node.params.get("layout") in (None, "NCHW"))


@dataclass(frozen=True)
class Chain:
    """One quantized layer: node indices of the float graph, from the product to the last
    fused node (whose output the fused node replaces)."""

    main: int
    batchnorm: int | None = None
    act: int | None = None
    add: int | None = None
    postsum_act: int | None = None
    summand: Entry | None = None  # the residual's value, the add's other input

    @property
    def last(self) -> int:
        """The float node whose output this chain's fused node stands for."""
        return max(index for index in (self.main, self.batchnorm, self.act, self.add,
                                       self.postsum_act) if index is not None)

    @property
    def members(self) -> tuple[int, ...]:
        """Every float node the fused node replaces."""
        return tuple(index for index in (self.main, self.batchnorm, self.act, self.add,
                                         self.postsum_act) if index is not None)


def find_chains(graph: Graph) -> list[Chain]:
    """Every Convolution (2-D, channels first) and FullyConnected of ``graph`` as a chain, in
    node order."""
    uses = _uses(graph)
    readers: dict[Entry, list[int]] = {}
    for index, node in enumerate(graph.nodes):
        for entry in node.inputs:
            readers.setdefault(Entry(entry.node, entry.index), []).append(index)
    chains: list[Chain] = []
    claimed: set[int] = set()  # a sum both its operands' chains could end in joins the first
    for index, node in enumerate(graph.nodes):
        if (node.op == "Convolution" and len(node.params.kernel) == 2
                and node.params.get("layout") in (None, "NCHW")):
            chain = _conv_chain(graph, index, uses, readers, claimed)
        elif node.op == "FullyConnected":
            chain = Chain(index, act=_single_reader(graph, index, uses, readers, _is_relu))
        else:
            continue
        claimed.update(chain.members)
        chains.append(chain)
    return chains


def _conv_chain(graph: Graph, index: int, uses: Counter, readers: dict,
                claimed: set[int]) -> Chain:
    batchnorm = _single_reader(graph, index, uses, readers, _is_channel_batchnorm)
    last = index if batchnorm is None else batchnorm
    act = _single_reader(graph, last, uses, readers, _is_conv_activation)
    last = last if act is None else act
    add = _single_reader(graph, last, uses, readers, _is_sum)
    if add is None or add in claimed:
        return Chain(index, batchnorm, act)
    left, right = (Entry(entry.node, entry.index) for entry in graph.nodes[add].inputs)
    summand = right if left == Entry(last, 0) else left
    postsum = _single_reader(graph, add, uses, readers, _is_relu)
    return Chain(index, batchnorm, act, add, postsum, summand)


def _single_reader(graph: Graph, index: int, uses: Counter, readers: dict,
                   accepts) -> int | None:
    """The one node reading output 0 of node ``index``, when it is the only use of that
    value and ``accepts`` it; else None."""
    entry = Entry(index, 0)
    if uses[entry] != 1 or len(readers.get(entry, ())) != 1:
        return None
    reader = readers[entry][0]
    node = graph.nodes[reader]
    return reader if accepts(node, entry) else None


def _uses(graph: Graph) -> Counter:
    """How many times each value is read (graph outputs count)."""
    uses: Counter = Counter()
    for node in graph.nodes:
        uses.update(Entry(entry.node, entry.index) for entry in node.inputs)
    uses.update(Entry(entry.node, entry.index) for entry in graph.heads)
    return uses


def _is_relu(node: Node, entry: Entry) -> bool:
    return node.op == "Activation" and node.params.act_type == "relu"


def _is_conv_activation(node: Node, entry: Entry) -> bool:
    """relu, or a clip from 0 to a positive top (relu6)."""
    return _is_relu(node, entry) or (node.op == "clip" and node.params.a_min == 0
                                     and node.params.a_max > 0)


def _is_channel_batchnorm(node: Node, entry: Entry) -> bool:
    return (node.op == "BatchNorm" and node.params.axis == 1
            and Entry(node.inputs[0].node, node.inputs[0].index) == entry)


def _is_sum(node: Node, entry: Entry) -> bool:
    if node.op not in SUM_OPS or len(node.inputs) != 2:
        return False
    left, right = (Entry(item.node, item.index) for item in node.inputs)
    return left != right  # x + x is no residual
