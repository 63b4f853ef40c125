"""Tracing a HybridBlock into a graph, and filling deferred parameter shapes from it.

`trace` calls the block with Symbol variables (``data``, or ``data0``, ``data1``, ...), flattens
whatever nested outputs ``hybrid_forward`` returns, and collects *shape hooks*: layers that
compute their own weight shapes from an input width (the RNN layers) register the input symbol
and a callback while tracing; `fill_deferred` runs graph shape inference, then the hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.errors import EngineError
from engine.gluon.parameter import Parameter
from engine.graph.infer import infer_shapes
from engine.graph.ir import Graph
from engine.sym import Group, Symbol
from engine.sym.node import topological

ShapeHook = tuple[Symbol, Callable[[tuple[int, ...]], None]]
_HOOKS: list[list[ShapeHook]] = []


def add_shape_hook(symbol: Symbol, callback: Callable[[tuple[int, ...]], None]) -> None:
    """While tracing, call ``callback(shape of symbol)`` once shapes are inferred."""
    if _HOOKS:
        _HOOKS[-1].append((symbol, callback))


@dataclass
class Traced:
    """A traced block: its outputs as one Symbol, input names, output nesting, shape hooks."""

    symbol: Symbol
    input_names: list[str]
    template: Any
    hooks: list[ShapeHook] = field(default_factory=list)

    def graph(self) -> Graph:
        """The traced graph."""
        return self.symbol.to_graph()


def input_names(count: int) -> list[str]:
    """MXNet's names for a hybridized block's inputs: ``data``, or ``data0``, ``data1``, ..."""
    return ["data"] if count == 1 else [f"data{index}" for index in range(count)]


def trace(call: Callable[..., Any], names: Sequence[str]) -> Traced:
    """Call ``call`` on Symbol variables named ``names`` and capture the outputs."""
    from engine import sym

    _HOOKS.append([])
    try:
        out = call(*[sym.var(name) for name in names])
    finally:
        hooks = _HOOKS.pop()
    flat: list[Symbol] = []
    template = flatten(out, flat, "hybrid_forward's output")
    return Traced(flat[0] if len(flat) == 1 else Group(flat), list(names), template, hooks)


def flatten(value: Any, into: list[Any], what: str) -> Any:
    """Append the leaves of nested lists/tuples to ``into``; return a template to rebuild."""
    if isinstance(value, (list, tuple)):
        return (type(value), [flatten(item, into, what) for item in value])
    if isinstance(value, Symbol) and len(value) > 1:
        into.extend(value)
        return (list, [len(into) - len(value) + index for index in range(len(value))])
    if value is None:
        raise EngineError(f"{what} contains None; return Symbols/NDArrays only")
    into.append(value)
    return len(into) - 1


def rebuild(template: Any, leaves: Sequence[Any]) -> Any:
    """Put ``leaves`` back into the nesting recorded by `flatten`."""
    if isinstance(template, int):
        return leaves[template]
    kind, items = template
    return kind(rebuild(item, leaves) for item in items)


def _positions(traced: Traced) -> dict[int, int]:
    nodes = topological([node for node, _ in traced.symbol._outputs])
    return {id(node): index for index, node in enumerate(nodes)}


def fill_deferred(traced: Traced, graph: Graph, shapes: dict[str, tuple[int, ...]],
                  params: Sequence[Parameter]) -> None:
    """Complete deferred parameter shapes from input ``shapes`` and initialize them."""
    pending = [param for param in params if param.is_deferred]
    if not pending:
        return
    known = dict(shapes)
    known.update({param.name: param.shape for param in params
                  if param.shape is not None and all(dim > 0 for dim in param.shape)})
    inferred = infer_shapes(graph, known)
    if traced.hooks:
        position = _positions(traced)
        for symbol, callback in traced.hooks:
            node, index = symbol._outputs[0]
            shape = inferred[position[id(node)]][index]
            if shape is not None:
                callback(tuple(shape))
        known.update({param.name: param.shape for param in params
                      if param.shape is not None and all(dim > 0 for dim in param.shape)})
        inferred = infer_shapes(graph, known)
    by_name = {graph.nodes[index].name: index for index in graph.variable_indices()}
    for param in pending:
        index = by_name.get(param.name)
        if index is not None and inferred[index][0] is not None:
            param.shape = inferred[index][0]
        param._finish_deferred_init()
        if param.is_deferred:
            raise EngineError(f"cannot infer the shape of parameter {param.name!r} (got "
                              f"{param.shape}) from inputs {shapes}; give the layer its input "
                              "size (in_units=/in_channels=/input_size=)")
