"""Pass: merge an op and the chain of elementwise ops that consumes it into one node.

``relu(fc(x) + bias)``-style epilogues and plain elementwise chains become one
`FUSED_ELEMENTWISE` node: one step in a plan, no intermediate buffers, and on the GPU one kernel.
A consumer joins a chain only when it is elementwise, keeps the running value's shape (unary and
same-shape binary ops; broadcasting ops could grow it), reads the running value exactly once,
and is its only reader; it must also keep the dtype it reads (see `_keeps_dtype`).
"""

from __future__ import annotations

import numpy as np

from engine.compiler.rewrite import Rewriter, consumers, head_entries
from engine.graph.ir import Entry, Graph, Node
from engine.ops.internal.fused import FUSED_ELEMENTWISE, FusedStep
from engine.ops.registry import Attrs
from engine.ops.shapes import same_shape


def fuse_elementwise(graph: Graph) -> Graph:
    """Replace every chain of two or more fusable nodes by one fused node."""
    chains = _find_chains(graph)
    if not chains:
        return graph
    members = {index for chain in chains for index in chain[:-1]}
    by_last = {chain[-1]: chain for chain in chains}
    rewriter = Rewriter(graph)
    for index in range(len(graph.nodes)):
        if index in members:
            continue
        if index in by_last:
            rewriter.alias(Entry(index, 0), _emit_chain(rewriter, graph, by_last[index]))
        else:
            rewriter.keep(index)
    return rewriter.finish()


def _can_head(node: Node) -> bool:
    # An op whose output shape depends on the data stays a node of its own: a staged plan cuts
    # the graph right after it (`engine.runtime.staged`).
    return not node.is_variable and node.num_outputs() == 1 and not node.opdef.view \
        and node.op != FUSED_ELEMENTWISE.name \
        and not node.opdef.shape_depends_on_data(node.params)


def _can_step(node: Node) -> bool:
    op = node.opdef
    if op.expression(node.params) is None or node.num_outputs() != 1:
        return False
    return (len(node.inputs) == 1 or op.infer_shape is same_shape) and _keeps_dtype(node)


def _keeps_dtype(node: Node) -> bool:
    """Whether the op gives the dtype it reads: a step runs in place on the buffer of the
    chain's output, whose dtype is the last step's (a NumPy-mode comparison's bool buffer
    would hold the head's values as booleans before the comparison reads them)."""
    probe = np.dtype(np.float32)
    _, outputs = node.opdef.infer_dtype(node.params, [probe] * len(node.inputs))
    return outputs[0] is None or np.dtype(outputs[0]) == probe


def _find_chains(graph: Graph) -> list[list[int]]:
    readers = consumers(graph)
    heads = head_entries(graph)
    claimed: set[int] = set()
    chains = []
    for index, node in enumerate(graph.nodes):
        if index in claimed or not _can_head(node):
            continue
        chain, current = [index], index
        while (current, 0) not in heads:
            following = readers.get((current, 0), [])
            if len(following) != 1 or following[0] in claimed:
                break
            step = graph.nodes[following[0]]
            reads = [e for e in step.inputs if (e.node, e.index) == (current, 0)]
            if len(reads) != 1 or not _can_step(step):
                break
            chain.append(following[0])
            current = following[0]
        if len(chain) > 1:
            claimed.update(chain)
            chains.append(chain)
    return chains


def _emit_chain(rewriter: Rewriter, graph: Graph, chain: list[int]) -> Entry:
    head = graph.nodes[chain[0]]
    inputs = [rewriter.entry(entry) for entry in head.inputs]
    steps = []
    previous = chain[0]
    for index in chain[1:]:
        node = graph.nodes[index]
        position = next(k for k, e in enumerate(node.inputs) if e.node == previous)
        inputs += [rewriter.entry(e) for k, e in enumerate(node.inputs) if k != position]
        steps.append(FusedStep(node.opdef, node.params, position, len(node.inputs)))
        previous = index
    params = Attrs({"head": FusedStep(head.opdef, head.params, 0, len(head.inputs)),
                    "steps": tuple(steps)})
    last = graph.nodes[chain[-1]]
    fused = Node(FUSED_ELEMENTWISE.name, last.name, {}, tuple(inputs), params)
    return Entry(rewriter.add(fused), 0)
