"""Imperative functions for every registry op, made by the shared factory in `opfunc`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.nd.ndarray import NDArray, run_kernel
from engine.nd.opfunc import bind_call, make_function
from engine.ops.registry import OpDef, all_ops

NAMESPACE = "engine.nd"
CONTROLS = ("name", "out")


def invoke(opdef: OpDef, called_as: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run ``opdef`` now on NDArray inputs; ``name=`` is ignored, ``out=`` receives the result."""
    kwargs = dict(kwargs)
    kwargs.pop("name", None)
    out = kwargs.pop("out", None)
    where = f"nd.{called_as}"
    call = bind_call(opdef, where, args, kwargs)
    missing = call.missing()
    if missing:
        raise TypeError(f"{where}: missing input(s) {', '.join(map(repr, missing))}; "
                        f"it takes {', '.join(call.input_names)}")
    inputs = [_as_ndarray(call.inputs[name], where, name) for name in call.input_names]
    return run_kernel(opdef, call.attrs, inputs, out, where)


def _as_ndarray(value: Any, where: str, name: str) -> NDArray:
    if isinstance(value, NDArray):
        return value
    if isinstance(value, np.ndarray):
        return NDArray(value)
    raise TypeError(f"{where}: input {name!r} must be an NDArray, got {type(value).__name__}")


def op_function(name: str, opdef: OpDef) -> Callable[..., Any]:
    """The ``nd.<name>`` function for one registered name (canonical or alias)."""
    return make_function(opdef, name, NAMESPACE, invoke, CONTROLS)


def op_functions() -> dict[str, Callable[..., Any]]:
    """A function for every registered op name, aliases included."""
    return {name: op_function(name, opdef) for name, opdef in all_ops().items()}
