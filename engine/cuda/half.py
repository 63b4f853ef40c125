"""A plan's graph in half precision (``fp16``), rewritten once when a GPU plan compiles.

Every float32 value of the graph becomes float16: the float32 parameters are converted on the
host (after the optimiser has folded BatchNorm into the convolutions, in float32), each float32
input is cast to float16 by the plan's first steps and each float32 output back to float32 by
its last, so the plan's input and output buffers keep the dtypes the model declares and the
casts are kernels inside the plan's CUDA graph. Everything between runs on float16 buffers:
cuDNN convolutions with half tensors and float compute, cuBLAS GEMMs with half operands and
float32 accumulation (`engine.cuda.blas`), generated elementwise kernels that compute in float
and store half (`engine.cuda.codegen`), CuPy's reductions with their float accumulators.

An op with no half path runs in float32 with casts around it (`keeps_float32`): the ops that
call cuSOLVER (no half types there), the int8 ops (their ranges are float32 on the host),
control flow (its subgraphs keep their own float32 parameters), windowed average, sum and Lp
pooling (they add their windows in the data's dtype), and any op whose dtype inference
refuses half inputs. A parameter read only by such ops stays float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from engine.graph.infer import infer_dtypes
from engine.graph.ir import Entry, Graph, Node, make_node
from engine.ops.math.linalg import CUPY_LINALG
from engine.ops.quantized.ranges import ON_HOST

HALF_PRECISIONS = {"fp16": np.dtype(np.float16)}
_FLOAT32 = np.dtype(np.float32)
# Why an op's kernel cannot take half operands, by its `OpDef.uncapturable` reason.
_NO_HALF_PATH = (CUPY_LINALG, ON_HOST)


def keeps_float32(node: Node) -> bool:
    """Whether ``node`` runs in float32 inside a half plan (see the module docstring)."""
    if node.subgraphs or _sums_windows(node):
        return True
    return any(op.uncapturable in _NO_HALF_PATH for op in node.opdef.components(node.params))


def _sums_windows(node: Node) -> bool:
    """A windowed average, sum or Lp pooling: it adds its window's terms in the data's dtype,
    where CuPy's reductions (a global pooling) accumulate half in float."""
    return (node.op == "Pooling" and not node.params.global_pool
            and node.params.pool_type != "max")


def half_graph(graph: Graph, input_dtypes: Mapping[str, Any], precision: str,
               converted: dict | None = None) -> Graph:
    """``graph`` computing in the half type of ``precision`` between float32 inputs and outputs.

    ``converted`` (shared by a model's plans: its `Workspace.derived` cache) keeps the
    parameters already converted, so each is converted once per model, not once per plan.
    """
    half = HALF_PRECISIONS[precision]
    constant_dtypes = {name: np.asarray(value).dtype for name, value in graph.constants.items()}
    original = infer_dtypes(graph, {**constant_dtypes, **input_dtypes})
    return _Rewrite(graph, original, half, {} if converted is None else converted).run()


class _Rewrite:
    """One pass over the nodes in order, building the half graph."""

    def __init__(self, graph: Graph, original: list, half: np.dtype, converted: dict) -> None:
        self.graph, self.original, self.half, self.converted = graph, original, half, converted
        self.nodes: list[Node] = []
        self.dtypes: dict[Entry, Any] = {}  # dtype of each entry of the new graph
        self.mapping: dict[tuple[int, int], Entry] = {}  # old (node, slot) -> new entry
        self.casts: dict[tuple[Entry, str], Entry] = {}
        self.constants = dict(graph.constants)
        self.float32_readers = _read_only_by_float32_ops(graph)

    def run(self) -> Graph:
        for index, node in enumerate(self.graph.nodes):
            if node.is_variable:
                self._variable(index, node)
            elif keeps_float32(node):
                self._in_float32(index, node)
            else:
                self._in_half(index, node)
        heads = []
        for head in self.graph.heads:
            entry = self.mapping[(head.node, head.index)]
            declared = self.original[head.node][head.index]
            heads.append(self._cast(entry, declared) if declared is not None else entry)
        return self.graph.replace(nodes=tuple(self.nodes), heads=tuple(heads),
                                  constants=self.constants)

    def _add(self, node: Node, dtypes: list) -> int:
        self.nodes.append(node)
        index = len(self.nodes) - 1
        for slot, dtype in enumerate(dtypes):
            self.dtypes[Entry(index, slot)] = dtype
        return index

    def _cast(self, entry: Entry, dtype: Any) -> Entry:
        """``entry`` as ``dtype``: itself, or the output of one Cast node (made once)."""
        if dtype is None or self.dtypes.get(entry) is None or self.dtypes[entry] == dtype:
            return entry
        key = (entry, np.dtype(dtype).name)
        if key not in self.casts:
            source = self.nodes[entry.node].name
            node = make_node("Cast", f"{source}_{entry.index}_as_{np.dtype(dtype).name}",
                             {"dtype": np.dtype(dtype).name}, (entry,))
            self.casts[key] = Entry(self._add(node, [np.dtype(dtype)]), 0)
        return self.casts[key]

    def _variable(self, index: int, node: Node) -> None:
        dtype = self.original[index][0]
        entry = Entry(self._add(node, [dtype]), 0)
        self.mapping[(index, 0)] = entry
        if dtype != _FLOAT32 or index in self.float32_readers:
            return
        if node.name in self.graph.constants:
            key = ("half constant", self.half.name, node.name)
            if key not in self.converted:  # (source, converted), as `Workspace.derived` keeps
                source = np.asarray(self.graph.constants[node.name])
                self.converted[key] = (source, source.astype(self.half))
            self.constants[node.name] = self.converted[key][1]
            self.dtypes[entry] = self.half
        else:  # an input: the plan's buffer stays float32, cast by the plan's first steps
            self.mapping[(index, 0)] = self._cast(entry, self.half)

    def _in_float32(self, index: int, node: Node) -> None:
        inputs = tuple(self._cast(self.mapping[(e.node, e.index)], self.original[e.node][e.index])
                       for e in node.inputs)
        self._place(index, node, inputs, list(self.original[index]))

    def _in_half(self, index: int, node: Node) -> None:
        # A float32 value from an op that kept float32 (or makes it whatever its inputs) is
        # cast to half where a half op reads it, so a float32 output is not cast twice.
        inputs = tuple(self._cast(self.mapping[(e.node, e.index)], self.half)
                       if self.original[e.node][e.index] == _FLOAT32
                       else self.mapping[(e.node, e.index)] for e in node.inputs)
        try:
            _, outputs = node.opdef.infer_dtype(node.params, [self.dtypes[e] for e in inputs])
        except Exception:  # the op refuses half inputs: run it in float32 instead
            self._in_float32(index, node)
            return
        self._place(index, node, inputs, list(outputs))

    def _place(self, index: int, node: Node, inputs: tuple[Entry, ...], dtypes: list) -> None:
        """Add ``node`` reading ``inputs`` in place of old node ``index``."""
        new = self._add(replace(node, inputs=inputs), dtypes)
        for slot in range(len(dtypes)):
            self.mapping[(index, slot)] = Entry(new, slot)


def _read_only_by_float32_ops(graph: Graph) -> set[int]:
    """Variables every reader of which runs in float32 (they are not converted)."""
    readers: dict[int, list[Node]] = {}
    for node in graph.nodes:
        for entry in node.inputs:
            readers.setdefault(entry.node, []).append(node)
    return {index for index, nodes in readers.items()
            if graph.nodes[index].is_variable and all(keeps_float32(node) for node in nodes)}


__all__ = ["HALF_PRECISIONS", "half_graph", "keeps_float32"]
