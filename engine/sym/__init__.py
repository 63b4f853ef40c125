"""``engine.sym``: MXNet's symbolic namespace, with every registry op as a function.

Example::

    from engine import sym
    data = sym.var('data')
    net = sym.FullyConnected(data, num_hidden=10, name='fc1')   # creates fc1_weight, fc1_bias
    net = sym.relu(net)
    net.list_arguments()            # ['data', 'fc1_weight', 'fc1_bias']
    net.infer_shape(data=(2, 5))    # fills in fc1_weight (10, 5) and fc1_bias (10,)
    text = net.tojson()
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from engine.nd.namespace import NP_PREFIXES, NPX_PREFIXES, OpNamespace, fill_module
from engine.sym.naming import NameManager, Prefix
from engine.sym.register import op_function
from engine.sym.symbol import Symbol, Variable, make_op_node, var


def Group(symbols: Sequence[Symbol]) -> Symbol:  # noqa: N802 - MXNet's spelling
    """One symbol whose outputs are the outputs of ``symbols``, in order."""
    outputs = []
    for symbol in symbols:
        if not isinstance(symbol, Symbol):
            raise TypeError(f"Group expects Symbols, got {type(symbol).__name__}")
        outputs.extend(symbol._outputs)
    if not outputs:
        raise ValueError("Group needs at least one symbol")
    return Symbol(outputs)


def fromjson(json_text: str | bytes) -> Symbol:
    """A Symbol from MXNet symbol JSON (legacy layouts included)."""
    from engine.graph.json_format import graph_from_json

    return Symbol.from_graph(graph_from_json(json_text))


load_json = fromjson


def load(fname: str | os.PathLike[str]) -> Symbol:
    """A Symbol from a ``*-symbol.json`` file."""
    with open(fname, "rb") as handle:
        return fromjson(handle.read())


def zeros(shape: Any, dtype: Any = None, name: str | None = None, **kwargs: Any) -> Symbol:
    """A constant of zeros (MXNet's ``_zeros`` node)."""
    return _filled("_zeros", shape, dtype, name, kwargs)


def ones(shape: Any, dtype: Any = None, name: str | None = None, **kwargs: Any) -> Symbol:
    """A constant of ones (MXNet's ``_ones`` node)."""
    return _filled("_ones", shape, dtype, name, kwargs)


def full(shape: Any, val: float, dtype: Any = None, name: str | None = None,
         **kwargs: Any) -> Symbol:
    """A constant filled with ``val`` (MXNet's ``_full`` node)."""
    return _filled("_full", shape, dtype, name, {**kwargs, "value": val})


def _filled(op: str, shape: Any, dtype: Any, name: str | None, attrs: dict[str, Any]) -> Symbol:
    values = {"shape": shape, **attrs}
    if dtype is not None:
        values["dtype"] = dtype
    return make_op_node(op, {}, values, name)


_HANDWRITTEN = {"Group", "fromjson", "load_json", "load", "zeros", "ones", "full", "var",
                "Variable"}

_make, __getattr__ = fill_module(globals(), "engine.sym", op_function, _HANDWRITTEN)

npx = OpNamespace("engine.sym.npx", NPX_PREFIXES, _make)
np = OpNamespace("engine.sym.np", NP_PREFIXES, _make)


__all__ = ["Group", "NameManager", "Prefix", "Symbol", "Variable", "fromjson", "full", "load",
           "load_json", "np", "npx", "ones", "var", "zeros"]
