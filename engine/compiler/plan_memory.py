"""Memory planning: which storage buffer holds each intermediate value of a plan.

Liveness decides reuse: once the last reader of a value has run, its buffer returns to a free
pool and the next value of any dtype that fits takes it (best fit; the largest free buffer grows
when none fits). An op marked ``inplace`` writes over its first input when that input dies at
this op. Views (reshape-like ops) get no buffer: they share their source's, which then stays
alive until the last reader of any view of it. A node reading the output of the
``writes_ahead`` op just before it (whose step may write that reader's output while it still
reads its own input 0) takes no buffer of that op's input 0, though it be free by then.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from engine.graph.ir import Graph

EntryKey = tuple[int, int]
_FOREVER = 1 << 62


@dataclass(frozen=True)
class MemoryPlan:
    """Buffer sizes in bytes, each activation's buffer, and the bytes saved against naive."""

    buffer_sizes: tuple[int, ...]
    buffer_of: dict[EntryKey, int]
    naive_bytes: int

    @property
    def planned_bytes(self) -> int:
        """Bytes of all buffers together."""
        return sum(self.buffer_sizes)


def nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Bytes of an array of this shape and dtype."""
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def naive_bytes(graph: Graph, shapes: list[list[tuple[int, ...]]],
                dtypes: list[list[np.dtype]]) -> int:
    """Bytes an imperative run holds if every op output gets storage of its own (views share)."""
    return sum(nbytes(shape, dtype)
               for node, node_shapes, node_dtypes in zip(graph.nodes, shapes, dtypes)
               if not node.is_variable and not node.opdef.view
               for shape, dtype in zip(node_shapes, node_dtypes))


def plan_memory(graph: Graph, shapes: list[list[tuple[int, ...]]], dtypes: list[list[np.dtype]],
                reuse: bool = True, writes_ahead: Collection[int] = ()) -> MemoryPlan:
    """Assign every non-view, non-variable output a buffer; reuse buffers when ``reuse``.
    ``writes_ahead``: nodes whose step may write the next node's outputs while it still
    reads its input 0, as ops that say so (`OpDef.writes_ahead`) may."""
    root = _view_roots(graph)
    last_use = _last_uses(graph, root)
    sizes: list[int] = []
    buffer_of: dict[EntryKey, int] = {}
    owner: dict[int, EntryKey] = {}
    free: list[int] = []
    for index, node in enumerate(graph.nodes):
        if node.is_variable or node.opdef.view:
            continue
        apart = _writers_first_inputs(graph, index, root, buffer_of, writes_ahead) \
            if reuse else set()
        for slot in range(len(shapes[index])):
            size = nbytes(shapes[index][slot], dtypes[index][slot])
            buffer = _inplace_buffer(graph, index, root, last_use, buffer_of, sizes, size) \
                if reuse and slot == 0 else None
            if buffer is None:
                buffer = _take([b for b in free if b not in apart], sizes, size) \
                    if reuse else None
                if buffer is not None:
                    free.remove(buffer)
            if buffer is None:
                sizes.append(size)
                buffer = len(sizes) - 1
            buffer_of[(index, slot)] = buffer
            owner[buffer] = (index, slot)
        if reuse:
            for buffer, key in list(owner.items()):
                if last_use.get(key, index) == index:  # unread outputs die at once
                    del owner[buffer]
                    free.append(buffer)
    return MemoryPlan(tuple(sizes), buffer_of, naive_bytes(graph, shapes, dtypes))


def _view_roots(graph: Graph) -> dict[EntryKey, EntryKey]:
    """Each view output's storage source (a non-view activation or a variable)."""
    root: dict[EntryKey, EntryKey] = {}
    for index, node in enumerate(graph.nodes):
        if not node.is_variable and node.opdef.view:
            source = node.inputs[0]
            root[(index, 0)] = root.get((source.node, source.index), (source.node, source.index))
    return root


def _last_uses(graph: Graph, root: dict[EntryKey, EntryKey]) -> dict[EntryKey, int]:
    """Index of the last node reading each storage root (heads live forever)."""
    last: dict[EntryKey, int] = {}
    for index, node in enumerate(graph.nodes):
        for entry in node.inputs:
            key = (entry.node, entry.index)
            last[root.get(key, key)] = index
    for entry in graph.heads:
        key = (entry.node, entry.index)
        last[root.get(key, key)] = _FOREVER
    return last


def _inplace_buffer(graph: Graph, index: int, root: dict, last_use: dict, buffer_of: dict,
                    sizes: list[int], size: int) -> int | None:
    node = graph.nodes[index]
    if not node.opdef.inplace or not node.inputs:
        return None
    source = node.inputs[0]
    key = root.get((source.node, source.index), (source.node, source.index))
    buffer = buffer_of.get(key)
    if buffer is None or last_use.get(key) != index or sizes[buffer] < size:
        return None
    if any((e.node, e.index) != (source.node, source.index)
           and root.get((e.node, e.index), (e.node, e.index)) == key for e in node.inputs):
        return None  # another input reads the same storage
    return buffer


def _writers_first_inputs(graph: Graph, index: int, root: dict[EntryKey, EntryKey],
                          buffer_of: dict[EntryKey, int],
                          writes_ahead: Collection[int] = ()) -> set[int]:
    """The buffer of input 0 of the ``writes_ahead`` op just before node ``index`` (no op
    between), where this node reads its output: that op's step may write this node's
    outputs while it still reads that input. A node further on writes its own."""
    previous = next((before for before in range(index - 1, -1, -1)
                     if not graph.nodes[before].is_variable), None)
    apart = set()
    for entry in graph.nodes[index].inputs:
        writer = graph.nodes[entry.node]
        if entry.node != previous or not writer.inputs or not (
                entry.node in writes_ahead or writer.opdef.may_write_ahead(writer.params)):
            continue
        first = writer.inputs[0]
        buffer = buffer_of.get(root.get((first.node, first.index), (first.node, first.index)))
        if buffer is not None:
            apart.add(buffer)
    return apart


def _take(free: list[int], sizes: list[int], size: int) -> int | None:
    """Best fit from ``free`` (the caller removes it from its pool), or the largest grown."""
    if not free:
        return None
    fitting = [buffer for buffer in free if sizes[buffer] >= size]
    if fitting:
        buffer = min(fitting, key=lambda b: sizes[b])
    else:
        buffer = max(free, key=lambda b: sizes[b])
        sizes[buffer] = size
    return buffer
