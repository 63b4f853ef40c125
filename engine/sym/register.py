"""Symbolic functions for every registry op, made by the shared factory in `engine.nd.opfunc`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.nd.opfunc import bind_call, make_function
from engine.ops.registry import OpDef
from engine.sym.symbol import Symbol, make_op_node

NAMESPACE = "engine.sym"
CONTROLS = ("name", "attr")


def invoke(opdef: OpDef, called_as: str, args: tuple[Any, ...],
           kwargs: dict[str, Any]) -> Symbol:
    """A new node for ``opdef``; inputs not given become variables named ``<node>_<input>``."""
    kwargs = dict(kwargs)
    name = kwargs.pop("name", None)
    annotations = kwargs.pop("attr", None)
    call = bind_call(opdef, f"sym.{called_as}", args, kwargs)
    return make_op_node(called_as, call.inputs, call.raw_attrs, name, annotations)


def op_function(name: str, opdef: OpDef) -> Callable[..., Any]:
    """The ``sym.<name>`` function for one registered name (canonical or alias)."""
    return make_function(opdef, name, NAMESPACE, invoke, CONTROLS)
