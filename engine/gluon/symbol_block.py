"""`SymbolBlock`: a block made from a Symbol graph (``SymbolBlock.imports`` of exported files).

Its parameters are the graph's non-input variables, named exactly as the variables. Called on
arrays it runs the graph through the runtime `Model` (always compiled); called on Symbols it
returns the graph with its inputs replaced by them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from engine import sym
from engine.errors import EngineError
from engine.gluon.hybrid import HybridBlock
from engine.gluon.parameter import Parameter
from engine.gluon.trace import Traced
from engine.graph.infer import declared_shape
from engine.graph.ir import Node
from engine.sym import Symbol
from engine.sym.node import SymNode, aux_nodes, topological


class SymbolBlock(HybridBlock):
    """A block computing ``outputs`` from the variables ``inputs``.

    Example:
        >>> net = SymbolBlock.imports("my_mlp-symbol.json", ["data"], "my_mlp-0000.params")
        >>> net(nd.ones((1, 512)))
    """

    def __init__(self, outputs: Symbol | Sequence[Symbol], inputs: Symbol | Sequence[Symbol],
                 params: Mapping[str, Parameter] | None = None) -> None:
        super().__init__(prefix="")
        outputs_list = [outputs] if isinstance(outputs, Symbol) else list(outputs)
        inputs_list = [inputs] if isinstance(inputs, Symbol) else list(inputs)
        self._symbol = outputs_list[0] if len(outputs_list) == 1 else sym.Group(outputs_list)
        self._input_names = [_input_name(symbol) for symbol in inputs_list]
        known = set(self._symbol.list_inputs())
        missing = [name for name in self._input_names if name not in known]
        if missing:
            raise EngineError(f"SymbolBlock: input {missing[0]!r} is not a variable of the "
                              f"graph; its variables are {', '.join(sorted(known))}")
        nodes = self._symbol._nodes()
        aux = aux_nodes(nodes)
        for node in nodes:
            if not node.is_variable or node.name in self._input_names:
                continue
            param = (params or {}).get(node.name) or _make_param(node, id(node) in aux)
            self._reg_params[node.name] = param
            self._params.update({node.name: param})
        self._active = True

    @staticmethod
    def imports(symbol_file: str | os.PathLike[str], input_names: str | Sequence[str],
                param_file: str | os.PathLike[str] | None = None, ctx: Any = None,
                allow_missing: bool = False, ignore_extra: bool = False) -> SymbolBlock:
        """A SymbolBlock from an exported ``-symbol.json`` and (optionally) its ``.params``."""
        names = [input_names] if isinstance(input_names, str) else list(input_names)
        block = SymbolBlock(sym.load(symbol_file), [sym.var(name) for name in names])
        if param_file is not None:
            block.collect_params().load(param_file, ctx, allow_missing, ignore_extra)
        return block

    def hybridize(self, active: bool = True, **kwargs: Any) -> None:
        """A SymbolBlock always runs compiled; this only clears the compiled model."""
        self._cached = None

    def forward(self, x: Any, *args: Any) -> Any:
        """Symbols in: the graph on them. Arrays in: the compiled graph's outputs."""
        if isinstance(x, Symbol):
            return self._call_symbolic(x, *args)
        return self._call_cached(x, *args)

    def _trace(self, count: int) -> Traced:
        if count != len(self._input_names):
            raise EngineError(f"SymbolBlock takes {len(self._input_names)} inputs "
                              f"({', '.join(self._input_names)}); got {count}")
        heads = len(self._symbol)
        template: Any = 0 if heads == 1 else (list, list(range(heads)))
        return Traced(self._symbol, list(self._input_names), template)

    def _call_symbolic(self, *args: Any) -> Symbol:
        if len(args) != len(self._input_names):
            raise EngineError(f"SymbolBlock takes {len(self._input_names)} inputs; got "
                              f"{len(args)}")
        given = {name: _entry(arg, name) for name, arg in zip(self._input_names, args)}
        rebuilt: dict[int, tuple[SymNode, int]] = {}
        for node in topological([node for node, _ in self._symbol._outputs]):
            if node.is_variable:
                rebuilt[id(node)] = given.get(node.name, (node, 0))
                continue
            inputs = []
            for child, index, version in node.inputs:
                source, offset = rebuilt[id(child)]
                inputs.append((source, offset if child.is_variable else index, version))
            rebuilt[id(node)] = (SymNode(node.op, node.name, node.attrs, tuple(inputs),
                                         node.params), 0)
        return Symbol([(rebuilt[id(node)][0], index) for node, index in self._symbol._outputs])


def _input_name(symbol: Symbol) -> str:
    if not isinstance(symbol, Symbol) or symbol.name is None:
        raise EngineError(f"SymbolBlock inputs must be variables (sym.var), got {symbol!r}")
    return symbol.name


def _entry(value: Any, name: str) -> tuple[SymNode, int]:
    if not isinstance(value, Symbol) or len(value) != 1:
        raise EngineError(f"SymbolBlock input {name!r} must be a single-output Symbol")
    return value._outputs[0]


def _make_param(node: SymNode, is_aux: bool) -> Parameter:
    shape = declared_shape(Node("null", node.name, node.attrs))
    return Parameter(node.name, grad_req="null" if is_aux else "write", shape=shape,
                     allow_deferred_init=True)
