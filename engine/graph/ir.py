"""The Graph IR: frozen nodes in topological order, referred to by index.

A `Graph` is what the JSON reader produces, what `sym` builds, what compiler passes transform
(``Graph -> Graph``) and what the runtime executes. Node names need not be unique (a Gluon layer
called twice yields two nodes of one name), so everything refers to nodes by position.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, NamedTuple

from engine.errors import ModelFormatError
from engine.ops.registry import Attrs, OpDef, get_op

VARIABLE = "null"
_EMPTY: Mapping[str, Any] = MappingProxyType({})


class Entry(NamedTuple):
    """Output ``index`` of node ``node``; ``version`` counts in-place writes (MXNet's field)."""

    node: int
    index: int = 0
    version: int = 0


@dataclass(frozen=True)
class Node:
    """One graph node.

    ``attrs`` holds the attributes as MXNet writes them (strings, annotations such as
    ``__shape__`` included); ``params`` holds the op's parsed, typed attributes (`Attrs`), computed
    once when the node is made. Variables have ``op == "null"`` and empty ``params``.
    """

    op: str
    name: str
    attrs: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    inputs: tuple[Entry, ...] = ()
    params: Attrs = field(default_factory=lambda: Attrs({}))

    @property
    def is_variable(self) -> bool:
        """Whether this node is a variable (an input, parameter or auxiliary state)."""
        return self.op == VARIABLE

    @property
    def subgraphs(self) -> tuple[Graph, ...]:
        """The graphs a control-flow node runs (``_foreach``'s body...); empty for other ops.

        They live in ``params`` (key ``subgraphs``) so that kernels, which see only the parsed
        attributes, can run them, and so that passes copying ``params`` keep them.
        """
        return self.params.get("subgraphs", ())

    @property
    def opdef(self) -> OpDef:
        """The registry record of this node's op (variables have none)."""
        return get_op(self.op, f"node {self.name!r}")

    def num_outputs(self) -> int:
        """Visible outputs of this node."""
        return 1 if self.is_variable else self.opdef.num_outputs(self.params)

    def describe(self) -> str:
        """``node 'fc1' (FullyConnected)``, for error messages."""
        return f"node {self.name!r}" + ("" if self.is_variable else f" ({self.op})")


def make_node(op: str, name: str, attrs: Mapping[str, Any] | None = None,
              inputs: tuple[Entry, ...] = (), subgraphs: tuple[Graph, ...] = ()) -> Node:
    """A node with its attributes parsed by the registry (``subgraphs`` added to its params).

    Raises:
        UnknownOperatorError: ``op`` is not registered.
        ModelFormatError: an attribute is unknown, missing or malformed.
    """
    raw = dict(attrs or {})
    if op == VARIABLE:
        return Node(op, name, MappingProxyType(raw), tuple(inputs))
    opdef = get_op(op, f"node {name!r}")
    params = opdef.parse_attrs(raw, f"node {name!r}")
    if subgraphs:
        params = Attrs({**params, "subgraphs": tuple(subgraphs)})
    return Node(op, name, MappingProxyType(raw), tuple(inputs), params)


@dataclass(frozen=True)
class Graph:
    """Nodes in topological order, the head entries (graph outputs), graph-level attributes.

    ``constants`` binds variable names to values known at load time (parameters, auxiliary
    states, folded results); compiler passes read and rewrite it along with the nodes.
    """

    nodes: tuple[Node, ...]
    heads: tuple[Entry, ...]
    attrs: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    constants: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    def replace(self, **changes: Any) -> Graph:
        """A copy with some fields replaced (nodes are shared: they are frozen)."""
        return replace(self, **changes)

    def variable_indices(self) -> list[int]:
        """Indices of every variable node, in node order (MXNet's ``arg_nodes``)."""
        return [index for index, node in enumerate(self.nodes) if node.is_variable]

    def variable_names(self) -> list[str]:
        """Names of every variable node, in node order, without repeats."""
        return list(dict.fromkeys(self.nodes[i].name for i in self.variable_indices()))

    def aux_variable_names(self) -> list[str]:
        """Variables wired into an auxiliary-state input of some op (BatchNorm's statistics)."""
        aux: dict[str, None] = {}
        for node in self.nodes:
            if node.is_variable or not node.opdef.aux:
                continue
            names = node.opdef.input_names(node.params)
            for slot, entry in zip(names, node.inputs):
                if slot in node.opdef.aux and self.nodes[entry.node].is_variable:
                    aux[self.nodes[entry.node].name] = None
        return list(aux)

    def output_names(self) -> list[str]:
        """MXNet's ``list_outputs`` names: ``<node>_<output>`` for each head."""
        names = []
        for entry in self.heads:
            node = self.nodes[entry.node]
            if node.is_variable:
                names.append(node.name)
            else:
                names.append(f"{node.name}_{node.opdef.output_names(node.params)[entry.index]}")
        return names


def verify(graph: Graph) -> Graph:
    """Check the invariants every pass relies on; return the graph unchanged.

    Raises:
        ModelFormatError: naming the node, for inputs that refer forward (not topological) or
            past the end, wrong input counts, output indices out of range, or bad heads.
    """
    count = len(graph.nodes)
    for index, node in enumerate(graph.nodes):
        if node.is_variable:
            if node.inputs:
                raise ModelFormatError(f"variable {node.name!r} must not have inputs")
            continue
        expected = node.opdef.input_names(node.params)
        if len(node.inputs) != len(expected):
            raise ModelFormatError(
                f"{node.describe()}: has {len(node.inputs)} inputs; expected {len(expected)} "
                f"({', '.join(expected)})")
        for entry in node.inputs:
            _check_entry(graph, entry, f"{node.describe()}", before=index)
    if not graph.heads:
        raise ModelFormatError("graph has no outputs (heads is empty)")
    for entry in graph.heads:
        _check_entry(graph, entry, "graph output", before=count)
    return graph


def _check_entry(graph: Graph, entry: Entry, who: str, before: int) -> None:
    if not 0 <= entry.node < len(graph.nodes):
        raise ModelFormatError(f"{who} reads node #{entry.node}, which does not exist "
                               f"(the graph has {len(graph.nodes)} nodes)")
    source = graph.nodes[entry.node]
    if entry.node >= before:
        raise ModelFormatError(f"{who} reads {source.name!r} before it is defined; "
                               "nodes must be topologically ordered")
    if not 0 <= entry.index < source.num_outputs():
        raise ModelFormatError(f"{who} reads output {entry.index} of {source.describe()}, "
                               f"which has {source.num_outputs()} outputs")
