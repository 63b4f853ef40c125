"""`Symbol`: an immutable handle on output entries of a DAG of symbolic nodes.

Operators build new nodes as MXNet 1.x does: ``a + b`` on two symbols is ``elemwise_add`` (named
``_plus0``), ``a + 2`` is ``_plus_scalar`` (``_plusscalar0``), ``2 - a`` is ``_rminus_scalar``.
What only data can answer (``.shape``, ``.asnumpy()``, item assignment, ``+=``) raises an error
that says why and names the alternative.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from engine.graph.ir import Graph
from engine.nd import operators
from engine.ops.attrs import format_attr
from engine.ops.catalog import mxnet_saved_name
from engine.ops.registry import get_op
from engine.sym import messages
from engine.sym.inference import infer
from engine.sym.naming import node_name
from engine.sym.node import SymNode, aux_nodes, from_graph, to_graph, topological

_NUMBER = (int, float, np.integer, np.floating, np.bool_, bool)
NUMPY_PREFIXES = ("_npx_", "_npi_", "_np_")


class Symbol:
    """One or more outputs of a symbolic graph; build with `var` and the op functions."""

    __slots__ = ("_outputs", "_graph_attrs")

    def __init__(self, outputs: Sequence[tuple[SymNode, int]],
                 graph_attrs: Mapping[str, Any] | None = None) -> None:
        self._outputs = tuple(outputs)
        # Graph-level attributes of a loaded file (``is_np_shape``), written back by tojson.
        self._graph_attrs = MappingProxyType(dict(graph_attrs or {}))

    # --- structure ---------------------------------------------------------------------------
    @property
    def name(self) -> str | None:
        """The node name when every output comes from one node, else None (a group)."""
        nodes = {id(node) for node, _ in self._outputs}
        return self._outputs[0][0].name if len(nodes) == 1 else None

    def __len__(self) -> int:
        return len(self._outputs)

    def __iter__(self) -> Iterator[Symbol]:
        return (Symbol([entry]) for entry in self._outputs)

    def __getitem__(self, index: Any) -> Symbol:
        if isinstance(index, str):
            labels = self.list_outputs()
            if index not in labels:
                raise ValueError(f"no output named {index!r}; outputs are {', '.join(labels)}")
            return Symbol([self._outputs[labels.index(index)]])
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
            raise TypeError(messages.INDEX.format(got=type(index).__name__,
                                                  why="a Symbol's items are its outputs"))
        if not -len(self._outputs) <= index < len(self._outputs):
            raise IndexError(f"output index {index} is out of range; the symbol has "
                             f"{len(self._outputs)} outputs")
        return Symbol([self._outputs[index]])

    def __setitem__(self, index: Any, value: Any) -> None:
        raise TypeError(messages.SETITEM)

    def __repr__(self) -> str:
        name = self.name
        if name is None:
            return f"<Symbol group [{', '.join(str(part.name) for part in self)}]>"
        return f"<Symbol {name}>"

    def __bool__(self) -> bool:
        raise TypeError(messages.BOOL)

    __hash__ = object.__hash__

    def __copy__(self) -> Symbol:
        return self

    def __deepcopy__(self, memo: Any) -> Symbol:
        return self

    def _nodes(self) -> list[SymNode]:
        return topological([node for node, _ in self._outputs])

    def list_outputs(self) -> list[str]:
        """Output labels: ``<node>_output`` (``<node>_<name>`` for named outputs)."""
        return [node.output_label(index) for node, index in self._outputs]

    def list_inputs(self) -> list[str]:
        """Every variable name (arguments and auxiliary states) in graph order."""
        return [node.name for node in self._nodes() if node.is_variable]

    def list_arguments(self) -> list[str]:
        """Variables that are not auxiliary states, in graph order."""
        nodes = self._nodes()
        aux = aux_nodes(nodes)
        return [node.name for node in nodes if node.is_variable and id(node) not in aux]

    def list_auxiliary_states(self) -> list[str]:
        """Variables wired into auxiliary-state slots (BatchNorm's moving statistics)."""
        nodes = self._nodes()
        aux = aux_nodes(nodes)
        return [node.name for node in nodes if node.is_variable and id(node) in aux]

    def get_internals(self) -> Symbol:
        """A group of every output of every node, in graph order."""
        return Symbol([(node, index) for node in self._nodes()
                       for index in range(len(node.output_names()))])

    def get_children(self) -> Symbol | None:
        """The inputs of this symbol's node as a group, or None for a variable."""
        node = self._outputs[0][0]
        if not node.inputs:
            return None
        return Symbol([(child, index) for child, index, _ in node.inputs])

    def attr(self, key: str) -> str | None:
        """An attribute (op parameter or ``__annotation__``) of this symbol's node, or None."""
        return self._single_node("attr").attrs.get(key)

    def list_attr(self) -> dict[str, str]:
        """The attributes of this symbol's node, as MXNet strings."""
        return dict(self._single_node("list_attr").attrs)

    def attr_dict(self) -> dict[str, dict[str, str]]:
        """Node name -> attributes, for every node with attributes."""
        return {node.name: dict(node.attrs) for node in self._nodes() if node.attrs}

    def _single_node(self, what: str) -> SymNode:
        if self.name is None:
            raise ValueError(f"{what}() needs a symbol with a single node; this is a group of "
                             f"{len(self)} outputs")
        return self._outputs[0][0]

    # --- conversion --------------------------------------------------------------------------
    def to_graph(self) -> Graph:
        """The `Graph` of this symbol: nodes in topological order, shared subexpressions once."""
        attrs = dict(self._graph_attrs)
        from engine.npx import is_np_shape

        if is_np_shape():
            attrs["is_np_shape"] = ("int", 1)
        return to_graph(self._outputs, attrs)

    @staticmethod
    def from_graph(graph: Graph) -> Symbol:
        """A Symbol whose outputs are ``graph``'s heads (graph attributes kept)."""
        attrs = {key: value for key, value in graph.attrs.items() if key != "mxnet_version"}
        return Symbol(from_graph(graph), attrs)

    def tojson(self) -> str:
        """The symbol JSON MXNet 1.9.1 writes for this graph."""
        from engine.graph.json_format import graph_to_json

        return graph_to_json(self.to_graph())

    def save(self, fname: str | os.PathLike[str]) -> None:
        """Write ``tojson()`` to ``fname``."""
        with open(fname, "w", encoding="utf-8") as handle:
            handle.write(self.tojson())

    # --- inference ---------------------------------------------------------------------------
    def infer_shape(self, *args: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
        """(argument shapes, output shapes, auxiliary shapes); all None (and a warning) if
        some shape cannot be decided. Known shapes are given by position or by name."""
        return infer(self._outputs, self.to_graph(), "shape", args, kwargs, partial=False)

    def infer_shape_partial(self, *args: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
        """Like `infer_shape`, with unknown shapes as ``()`` and unknown dims as 0."""
        return infer(self._outputs, self.to_graph(), "shape", args, kwargs, partial=True)

    def infer_type(self, *args: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
        """(argument dtypes, output dtypes, auxiliary dtypes) as NumPy types; None if unknown."""
        return infer(self._outputs, self.to_graph(), "dtype", args, kwargs, partial=False)

    def infer_type_partial(self, *args: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
        """Like `infer_type`, with None for dtypes that cannot be decided."""
        return infer(self._outputs, self.to_graph(), "dtype", args, kwargs, partial=True)

    # --- what only data has ------------------------------------------------------------------
    @property
    def shape(self) -> Any:
        """Not available on a Symbol (raises AttributeError naming the alternatives)."""
        raise AttributeError(messages.SHAPE)

    @property
    def dtype(self) -> Any:
        """Not available on a Symbol (raises AttributeError naming the alternatives)."""
        raise AttributeError(messages.DTYPE)

    @property
    def context(self) -> Any:
        """Not available on a Symbol (raises AttributeError naming the alternatives)."""
        raise AttributeError(messages.CONTEXT)

    ctx = context

    @property
    def asnumpy(self) -> Any:
        """Not available on a Symbol (raises AttributeError naming the alternatives)."""
        raise AttributeError(messages.ASNUMPY)

    # --- operators (the binary and in-place ones: `operators.add_operators` below) --------
    def __neg__(self) -> Symbol:
        return self.__mul__(-1.0)

    def __abs__(self) -> Symbol:
        return apply_op("abs", [self], {})


def _binary(symbol: Symbol, other: Any, symbol_op: str, scalar_op: str,
            reflected: bool = False) -> Symbol:
    if isinstance(other, Symbol):
        return apply_op(symbol_op, [other, symbol] if reflected else [symbol, other], {})
    if isinstance(other, _NUMBER):
        return apply_op(scalar_op, [symbol], {"scalar": other})
    return NotImplemented


# A Symbol's ``a + b`` is MXNet's elementwise ``_Plus``, as the symbolic API writes it.
_OPS = {
    "add": ("_Plus", "_PlusScalar", "_PlusScalar"),
    "sub": ("_Minus", "_MinusScalar", "_RMinusScalar"),
    "mul": ("_Mul", "_MulScalar", "_MulScalar"),
    "div": ("_Div", "_DivScalar", "_RDivScalar"),
    "mod": ("_Mod", "_ModScalar", "_RModScalar"),
    "pow": ("_Power", "_PowerScalar", "_RPowerScalar"),
    "equal": ("_equal", "_equal_scalar", "_equal_scalar"),
    "not_equal": ("_not_equal", "_not_equal_scalar", "_not_equal_scalar"),
    "greater": ("_greater", "_greater_scalar", "_greater_scalar"),
    "greater_equal": ("_greater_equal", "_greater_equal_scalar", "_greater_equal_scalar"),
    "lesser": ("_lesser", "_lesser_scalar", "_lesser_scalar"),
    "lesser_equal": ("_lesser_equal", "_lesser_equal_scalar", "_lesser_equal_scalar"),
}


def _refuse_in_place(method: str, operation: str, spelling: str) -> Any:
    """``a op= b`` on a Symbol: refused, naming the plain operator to use instead."""
    def refuse(self: Symbol, other: Any) -> Symbol:
        raise TypeError(messages.INPLACE.format(op=f"{spelling}=", plain=spelling))

    refuse.__name__ = refuse.__qualname__ = method
    return refuse


operators.add_operators(Symbol, _OPS, _binary, _refuse_in_place)


def stored_op_name(called_as: str, canonical: str) -> str:
    """The op name a node records: the name MXNet 1.9.1 saves (an alias's target), else the
    canonical name, except that NumPy-mode names (``_npx_relu``, ``_npi_add``) are kept as
    called, since MXNet writes them so."""
    saved = mxnet_saved_name(called_as)
    if saved is not None:
        return saved
    return called_as if called_as.startswith(NUMPY_PREFIXES) else canonical


def name_hint(called_as: str) -> str:
    """MXNet's automatic-name hint: the lower-cased function name (NumPy prefixes dropped)."""
    for prefix in NUMPY_PREFIXES:
        if called_as.startswith(prefix):
            return called_as[len(prefix):].lower()
    return called_as.lower()


def single_entry(value: Any, where: str, slot: str) -> tuple[SymNode, int]:
    """The one output entry of a Symbol used as an op input."""
    if not isinstance(value, Symbol):
        raise TypeError(f"{where}: input {slot!r} must be a Symbol, got {type(value).__name__}"
                        " (scalars go through operators such as x + 1, or attributes)")
    if len(value._outputs) != 1:
        raise TypeError(f"{where}: input {slot!r} must have exactly one output; {value!r} has "
                        f"{len(value._outputs)} (pick one with symbol[i])")
    return value._outputs[0]


def make_op_node(called_as: str, inputs: Mapping[str, Symbol], attrs: Mapping[str, Any],
                 name: str | None, annotations: Mapping[str, Any] | None = None) -> Symbol:
    """A new node applying op ``called_as``; missing inputs become variables ``<node>_<input>``.

    Attribute values are stored as MXNet strings and parsed back, so a JSON round trip is exact.
    """
    opdef = get_op(called_as)
    node = node_name(name, name_hint(called_as))
    raw = {key: format_attr(value) for key, value in attrs.items()}
    raw.update({key: format_attr(value) for key, value in (annotations or {}).items()})
    params = opdef.parse_attrs(raw, f"node {node!r}")
    names = opdef.input_names(params)
    entries = []
    for slot, is_aux in zip(names, [slot in opdef.aux for slot in names], strict=True):
        value = inputs.get(slot)
        if value is None:
            value = var(f"{node}_{slot}")
        source, index = single_entry(value, f"sym.{called_as} ({node!r})", slot)
        entries.append((source, index, 1 if is_aux else 0))
    created = SymNode(stored_op_name(called_as, opdef.name), node, MappingProxyType(raw),
                      tuple(entries), params)
    return Symbol([(created, index) for index in range(opdef.num_outputs(params))])


def apply_op(called_as: str, inputs: Sequence[Symbol], attrs: Mapping[str, Any],
             name: str | None = None) -> Symbol:
    """A node for op ``called_as`` with positional symbol inputs (used by the operators)."""
    opdef = get_op(called_as)
    names = opdef.input_names(opdef.parse_attrs({key: format_attr(value)
                                                 for key, value in attrs.items()}))
    return make_op_node(called_as, dict(zip(names, inputs, strict=True)), attrs, name)


def var(name: str, attr: Mapping[str, str] | None = None, shape: Any = None,
        lr_mult: float | None = None, wd_mult: float | None = None, dtype: Any = None,
        init: Any = None, stype: str | None = None, **kwargs: Any) -> Symbol:
    """A variable (input, parameter or auxiliary state) named ``name``.

    ``shape``, ``dtype``, ``init``, ``lr_mult``, ``wd_mult`` and ``stype`` are recorded as MXNet's
    annotations ``__shape__``, ``__dtype__`` (a dtype code), ``__init__``, ... Extra keyword
    attributes must be spelled ``__name__``. Example: ``var('data', shape=(1, 512))``.
    """
    from engine.sym.annotations import variable_attrs

    if not isinstance(name, str) or not name:
        raise TypeError(f"var: name must be a non-empty string, got {name!r}")
    raw = variable_attrs(attr, shape, lr_mult, wd_mult, dtype, init, stype, kwargs)
    return Symbol([(SymNode("null", name, MappingProxyType(raw)), 0)])


Variable = var
