"""`StagedPlan`: a compiled graph whose shapes depend on the data, run as a chain of stages.

Shape inference cannot size what follows a node such as ``_contrib_boolean_mask`` (see
`OpDef.dynamic_shape`): how many rows it keeps is known only once it has run. A staged plan
cuts the graph after its first data-dependent nodes (`cut_graph`):

* the static stage, every node that depends on none of them, compiled as a `Plan` for the input
  signature (memory planning, bound kernels and, on a GPU, CUDA graph capture);
* the data-dependent nodes of the cut, run by their kernels on the host, where the static
  stage's outputs arrive;
* the rest, a graph whose inputs are the values crossing the cut, compiled once their shapes are
  known, per `Signature` of them (an LRU cache): a `Plan`, or again a `StagedPlan` when it holds
  further data-dependent nodes.

A rest whose inputs hold an empty dimension (a mask that kept no row) runs through the
reference interpreter instead: shape inference reads a 0 dimension as unknown, so no plan can be
compiled for it. docs/dynamic_shapes.md describes the design.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from engine.errors import EngineError, ExecutionError
from engine.graph.ir import VARIABLE, Entry, Graph, Node, make_node
from engine.runtime.interpreter import evaluate
from engine.runtime.lru import DEFAULT_CAPACITY, LRUCache
from engine.runtime.plan import capture_blocker
from engine.runtime.signature import Signature

Key = tuple[int, int]  # (node index, output index) in the graph being cut
StageCompiler = Callable[[Graph, Signature], Any]  # a `Plan` or a `StagedPlan` for a graph


def dynamic_nodes(graph: Graph) -> list[Node]:
    """The nodes of ``graph`` whose output shapes depend on their input values."""
    return [node for node in graph.nodes
            if not node.is_variable and node.opdef.shape_depends_on_data(node.params)]


def shape_blocker(graph: Graph) -> str | None:
    """Why ``graph``'s shapes cannot all be known from its input shapes (its first
    data-dependent node and what that node does), or None when they can."""
    nodes = dynamic_nodes(graph)
    if not nodes:
        return None
    node = nodes[0]
    return f"{node.describe()} {node.opdef.shape_depends_on_data(node.params)}"


@dataclass(frozen=True)
class Cut:
    """A graph cut after its first data-dependent nodes (see the module docstring)."""

    static: Graph  # heads: the values `crossing` names, in that order
    crossing: tuple[Key, ...]  # static values read after the static stage
    dynamic: tuple[int, ...]  # data-dependent nodes run on the host, in graph order
    rest: Graph | None  # the remaining nodes; None when no node follows the cut
    rest_inputs: tuple[tuple[str, Key], ...]  # rest's fed variables and the values they take


def cut_graph(graph: Graph) -> Cut:
    """Split ``graph`` after its first data-dependent nodes (those reading no other's output)."""
    nodes = graph.nodes
    dependent = [False] * len(nodes)
    frontier = []
    for index, node in enumerate(nodes):
        if node.is_variable:
            continue
        upstream = any(dependent[entry.node] for entry in node.inputs)
        dynamic = bool(node.opdef.shape_depends_on_data(node.params))
        dependent[index] = upstream or dynamic
        if dynamic and not upstream:
            frontier.append(index)
    later = [index for index, flag in enumerate(dependent) if flag and index not in frontier]
    read_after = [(entry.node, entry.index) for index in frontier + later
                  for entry in nodes[index].inputs]
    read_after += [(entry.node, entry.index) for entry in graph.heads]
    crossing = tuple(dict.fromkeys(key for key in read_after if not dependent[key[0]]))
    static = _subgraph(graph, [i for i, flag in enumerate(dependent) if not flag], crossing)
    if not later:
        return Cut(static, crossing, tuple(frontier), None, ())
    rest, rest_inputs = _rest_graph(graph, later)
    return Cut(static, crossing, tuple(frontier), rest, rest_inputs)


def _subgraph(graph: Graph, keep: list[int], heads: tuple[Key, ...]) -> Graph:
    """The nodes ``keep`` of ``graph`` (closed under inputs), with ``heads`` as its outputs."""
    position = {index: new for new, index in enumerate(keep)}
    nodes = tuple(_rewired(graph.nodes[index], position) for index in keep)
    return graph.replace(nodes=nodes, heads=tuple(Entry(position[node], slot)
                                                  for node, slot in heads))


def _rewired(node: Node, position: Mapping[int, int]) -> Node:
    if not node.inputs:
        return node
    return replace(node, inputs=tuple(Entry(position[entry.node], entry.index, entry.version)
                                      for entry in node.inputs))


def _rest_graph(graph: Graph, later: list[int]) -> tuple[Graph, tuple[tuple[str, Key], ...]]:
    """The ``later`` nodes, with a variable for each value they (or the heads) read from
    before the cut: parameters stay constants under their names, other values are fed."""
    nodes: list[Node] = []
    position: dict[int, int] = {}
    fed: dict[Key, str] = {}
    crossing: dict[Key, int] = {}
    later_set = set(later)

    def variable_for(key: Key) -> int:
        if key not in crossing:
            producer = graph.nodes[key[0]]
            name = producer.name if producer.is_variable else f"{producer.name}:{key[1]}"
            if name not in graph.constants:
                fed[key] = name
            crossing[key] = len(nodes)
            nodes.append(make_node(VARIABLE, name))
        return crossing[key]

    def entry_for(entry: Entry) -> Entry:
        if entry.node in later_set:
            return Entry(position[entry.node], entry.index, entry.version)
        return Entry(variable_for((entry.node, entry.index)))

    for index in later:
        node = graph.nodes[index]
        inputs = tuple(entry_for(entry) for entry in node.inputs)
        position[index] = len(nodes)
        nodes.append(replace(node, inputs=inputs))
    heads = tuple(entry_for(entry) for entry in graph.heads)
    rest = graph.replace(nodes=tuple(nodes), heads=heads)
    return rest, tuple((name, key) for key, name in fed.items())


class StagedPlan:
    """A graph with data-dependent shapes compiled for one input signature, run in stages.

    ``compile_stage(graph, signature)`` compiles each stage (a `Plan`, or a `StagedPlan` for a
    stage with further data-dependent nodes) with the model's device and memory options; rests
    are cached per signature of their inputs, at most ``cache_size`` of them. ``device_name``
    is what the stats report (the stages run there; the data-dependent nodes on the host).
    Thread-safe: a run holds the plan's lock, as a `Plan`'s does. ``run`` takes and returns
    numpy arrays.
    """

    def __init__(self, graph: Graph, signature: Signature, compile_stage: StageCompiler,
                 cache_size: int = DEFAULT_CAPACITY, device_name: str = "cpu") -> None:
        self.graph = graph
        self.device_name = device_name
        self.signature = signature
        self.cut = cut_graph(graph)
        self._compile_stage = compile_stage
        has_ops = any(not node.is_variable for node in self.cut.static.nodes)
        self.static = compile_stage(self.cut.static, signature) if has_ops else None
        self._rests: LRUCache[Signature, Any] = LRUCache(cache_size)
        self._lock = threading.Lock()
        self.runs = 0

    @property
    def busy(self) -> bool:
        """Whether a thread is running this plan now."""
        return self._lock.locked()

    def run(self, feed: Mapping[str, Any], copy_outputs: bool = True) -> list[Any]:
        """Run the static stage, the data-dependent nodes, then the rest compiled for the
        shapes they gave; return the outputs in head order."""
        with self._lock:
            self.runs += 1
            values = self._run_static(feed)
            for index in self.cut.dynamic:
                self._run_node(index, values)
            if self.cut.rest is None:
                outputs = [values[(entry.node, entry.index)] for entry in self.graph.heads]
                return [np.array(output) for output in outputs] if copy_outputs else outputs
            rest_feed = {name: values[key] for name, key in self.cut.rest_inputs}
            return self._run_rest(rest_feed, copy_outputs)

    def _run_static(self, feed: Mapping[str, Any]) -> dict[Key, Any]:
        """The static stage's outputs (its plan's, or inputs and constants read directly)."""
        if self.static is not None:
            outputs = self.static.run(feed, copy_outputs=False)
            return dict(zip(self.cut.crossing, outputs))
        values = {}
        for key in self.cut.crossing:
            name = self.graph.nodes[key[0]].name
            values[key] = feed[name] if name in feed else self.graph.constants[name]
        return values

    def _run_node(self, index: int, values: dict[Key, Any]) -> None:
        node = self.graph.nodes[index]
        args = [np.asarray(values[(entry.node, entry.index)]) for entry in node.inputs]
        try:
            outputs = node.opdef.compute(np, node.params, args)
        except EngineError as error:
            raise ExecutionError(f"while running {node.describe()}: {error}") from error
        except Exception as error:
            raise ExecutionError(f"while running {node.describe()}: "
                                 f"{type(error).__name__}: {error}") from error
        values.update(((index, slot), output) for slot, output in enumerate(outputs))

    def _run_rest(self, feed: dict[str, Any], copy_outputs: bool) -> list[Any]:
        assert self.cut.rest is not None
        if any(0 in np.shape(value) for value in feed.values()):
            # An empty dimension reads as unknown to shape inference: no plan fits it. (Its
            # outputs may be the static stage's buffers, passed through: copied like a plan's.)
            outputs = evaluate(self.cut.rest, {**self.graph.constants, **feed}, np)
            return [np.array(output) for output in outputs] if copy_outputs else outputs
        return self.rest_for(feed).run(feed, copy_outputs)

    def rest_for(self, feed: Mapping[str, Any]) -> Any:
        """The compiled rest for these values crossing the cut (compiled on first use)."""
        signature = Signature.of(feed)
        plan = self._rests.get(signature)
        if plan is None:
            assert self.cut.rest is not None
            plan = self._compile_stage(self.cut.rest, signature)
            self._rests.put(signature, plan)
        return plan

    def stages(self) -> list[Any]:
        """The compiled stages held now: the static one, then each cached rest."""
        rests = [plan for _, plan in self._rests.items()]
        return ([self.static] if self.static is not None else []) + rests

    @property
    def steps(self) -> list[Any]:
        """Every step of the stages compiled so far (the host-run nodes are not steps)."""
        return [step for stage in self.stages() for step in stage.steps]

    @property
    def memory(self) -> StagedMemory:
        """Planned and unplanned activation bytes, summed over the compiled stages."""
        stages = self.stages()
        return StagedMemory(sum(stage.memory.planned_bytes for stage in stages),
                            sum(stage.memory.naive_bytes for stage in stages))

    @property
    def workspace(self) -> StagedMemory:
        """Working memory of the compiled stages (``nbytes``: the largest stage's)."""
        return StagedMemory(0, 0, max((stage.workspace.nbytes for stage in self.stages()),
                                      default=0))

    def execution_stats(self) -> dict[str, Any]:
        """Device and stages; never a CUDA graph as a whole, since the host runs the
        data-dependent nodes between stages (the stages themselves may be captured)."""
        return {"device": self.device_name, "cuda_graph": False,
                "cuda_graph_error": capture_blocker(self.graph), "eager_runs": self.runs,
                "staged": shape_blocker(self.graph),
                "stages": [stage.execution_stats() for stage in self.stages()]}

    def profile(self, feed: Mapping[str, Any], repeat: int = 10) -> dict[str, float]:
        """Mean seconds per op type over ``repeat`` runs: each stage's own profile, and the
        data-dependent nodes timed on the host."""
        totals: dict[str, float] = {}
        if self.static is not None:
            totals.update(self.static.profile(feed, repeat))
        values = self._run_static(feed)
        for index in self.cut.dynamic:
            start = time.perf_counter()
            for _ in range(repeat):
                self._run_node(index, values)
            label = self.graph.nodes[index].op
            totals[label] = totals.get(label, 0.0) + (time.perf_counter() - start) / repeat
        if self.cut.rest is not None:
            rest_feed = {name: values[key] for name, key in self.cut.rest_inputs}
            if not any(0 in np.shape(value) for value in rest_feed.values()):
                for label, seconds in self.rest_for(rest_feed).profile(rest_feed,
                                                                       repeat).items():
                    totals[label] = totals.get(label, 0.0) + seconds
        return totals


@dataclass(frozen=True)
class StagedMemory:
    """Byte counts over a staged plan's compiled stages, read like a `MemoryPlan`'s."""

    planned_bytes: int
    naive_bytes: int
    nbytes: int = 0
