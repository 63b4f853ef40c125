"""Imperative functions for every registry op, made by the shared factory in `opfunc`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.context import Context, resolve_context
from engine.nd.ndarray import NDArray, run_kernel
from engine.nd.opfunc import bind_call, make_function
from engine.ops.registry import OpDef

NAMESPACE = "engine.nd"
CONTROLS = ("name", "out", "ctx")


def invoke(opdef: OpDef, called_as: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run ``opdef`` now on NDArray inputs; ``name=`` is ignored, ``out=`` receives the result.

    The op runs on its inputs' context; ``ctx=`` places an op without inputs (``nd._zeros``).
    """
    kwargs = dict(kwargs)
    kwargs.pop("name", None)
    out = kwargs.pop("out", None)
    ctx = kwargs.pop("ctx", None)
    if ctx is not None:
        ctx = resolve_context(ctx)
    if ctx is not None and any(param.name == "ctx" for param in opdef.params):
        kwargs["ctx"] = str(ctx)
    where = f"nd.{called_as}"
    call = bind_call(opdef, where, args, kwargs)
    missing = call.missing()
    if missing:
        raise TypeError(f"{where}: missing input(s) {', '.join(map(repr, missing))}; "
                        f"it takes {', '.join(call.input_names)}")
    given = [call.inputs[name] for name in call.input_names]
    placed = next((value.context for value in given if isinstance(value, NDArray)), ctx)
    inputs = [_as_ndarray(value, where, name, placed) for name, value in zip(call.input_names,
                                                                            given, strict=True)]
    return run_kernel(opdef, call.attrs, inputs, out, where, ctx)


def _as_ndarray(value: Any, where: str, name: str, ctx: Context | None) -> NDArray:
    """An NDArray input as is; a numpy input on the context of the op's other inputs."""
    if isinstance(value, NDArray):
        return value
    if isinstance(value, np.ndarray):
        return NDArray(value, ctx)
    raise TypeError(f"{where}: input {name!r} must be an NDArray, got {type(value).__name__}")


def op_function(name: str, opdef: OpDef) -> Callable[..., Any]:
    """The ``nd.<name>`` function for one registered name (canonical or alias)."""
    return make_function(opdef, name, NAMESPACE, invoke, CONTROLS)
