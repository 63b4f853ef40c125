"""The factory behind `nd` and `sym`: one Python function per registry op, with a real signature.

Functions are closures over their `OpDef` with ``__signature__`` and ``__doc__`` rendered from the
schema (never source text run through ``exec``). A call is bound by `bind_call`: positional
arguments are inputs in the op's input order, keyword arguments named like inputs are inputs,
every other keyword is an attribute parsed by `OpDef.parse_attrs`. Variadic ops (those with a
``num_args`` attribute) take their inputs as ``*args`` and get ``num_args`` filled in.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.ops.registry import REQUIRED, Attrs, OpDef

CONTROL_KEYWORDS = ("name", "out", "attr", "ctx")


@dataclass
class BoundCall:
    """An op call split into attributes and inputs (inputs given as ``None`` count as missing)."""

    raw_attrs: dict[str, Any]
    attrs: Attrs
    input_names: tuple[str, ...]
    inputs: dict[str, Any]

    def missing(self) -> list[str]:
        """Input names that were not given."""
        return [name for name in self.input_names if name not in self.inputs]


def is_variadic(opdef: OpDef) -> bool:
    """Ops whose inputs are a list counted by ``num_args`` (Concat, add_n, stack, ...)."""
    return any(param.name == "num_args" for param in opdef.params)


def bind_call(opdef: OpDef, called_as: str, args: tuple[Any, ...],
              kwargs: Mapping[str, Any]) -> BoundCall:
    """Split a call's arguments into the op's attributes and inputs.

    Raises:
        TypeError: too many positional inputs, an input given twice, or an unknown keyword.
        ModelFormatError: an attribute is missing or malformed (from `OpDef.parse_attrs`).
    """
    param_names = {param.name for param in opdef.params}
    raw_attrs = {key: value for key, value in kwargs.items() if key in param_names}
    keyword_inputs = {key: value for key, value in kwargs.items() if key not in param_names}
    variadic = is_variadic(opdef)
    if variadic:
        if len(args) == 1 and isinstance(args[0], (list, tuple)):
            args = tuple(args[0])
        raw_attrs.setdefault("num_args", len(args))
    attrs = opdef.parse_attrs(raw_attrs, called_as)
    names = opdef.input_names(attrs)
    extra = [value for value in args[len(names):] if value is not None]
    if extra:
        raise TypeError(f"{called_as}: takes {len(names)} inputs ({', '.join(names)}) "
                        f"but {len(args)} positional arguments were given")
    inputs = {name: value for name, value in zip(names, args, strict=False) if value is not None}
    for key, value in keyword_inputs.items():
        if key not in names:
            raise TypeError(f"{called_as}: unknown argument {key!r}; inputs are "
                            f"{', '.join(names) or 'none'}; attributes are "
                            f"{', '.join(sorted(param_names)) or 'none'}")
        if key in inputs:
            raise TypeError(f"{called_as}: input {key!r} is given twice")
        if value is not None:
            inputs[key] = value
    return BoundCall(raw_attrs, attrs, names, inputs)


def static_input_names(opdef: OpDef) -> tuple[str, ...]:
    """Input names for the signature: every input the op can take, in order (best effort)."""
    if not callable(opdef.inputs):
        return opdef.inputs
    base = {param.name: (None if param.default is REQUIRED else param.default)
            for param in opdef.params}
    variants = [base] + [{**base, param.name: not param.default} for param in opdef.params
                         if isinstance(param.default, bool)]
    names: list[str] = []
    for values in variants:
        try:
            found = list(opdef.input_names(Attrs(values)))
        except Exception:  # noqa: BLE001 - a probe with placeholder attributes may fail
            continue
        for position, name in enumerate(found):
            if name not in names:
                before = found[position - 1] if position else None
                at = names.index(before) + 1 if before in names else len(names)
                names.insert(at, name)
    return tuple(names) or ("data",)


def make_signature(opdef: OpDef, controls: tuple[str, ...]) -> inspect.Signature:
    """``(data=None, weight=None, *, num_hidden, no_bias=False, ..., name=None, out=None)``."""
    kind = inspect.Parameter
    parameters: list[inspect.Parameter] = []
    if is_variadic(opdef):
        parameters.append(kind("data", kind.VAR_POSITIONAL))
    else:
        parameters += [kind(name, kind.POSITIONAL_OR_KEYWORD, default=None)
                       for name in static_input_names(opdef)]
    for param in opdef.params:
        default = kind.empty if param.default is REQUIRED else param.default
        parameters.append(kind(param.name, kind.KEYWORD_ONLY, default=default))
    taken = {parameter.name for parameter in parameters}
    parameters += [kind(name, kind.KEYWORD_ONLY, default=None) for name in controls
                   if name not in taken]
    return inspect.Signature(parameters)


def _type_name(parser: Callable[..., Any]) -> str:
    name = getattr(parser, "__name__", "value")
    for prefix in ("optional_parse_", "parse_"):
        if name.startswith(prefix):
            rest = name[len(prefix):]
            return f"{rest} or None" if prefix.startswith("optional") else rest
    return name


def make_doc(opdef: OpDef, called_as: str, namespace: str) -> str:
    """A docstring rendered from the op's schema."""
    summary = opdef.doc or f"The registry operator {opdef.name!r}."
    lines = [summary, "", f"Registry op {opdef.name!r}, called as {namespace}.{called_as}.", ""]
    inputs = ("*data",) if is_variadic(opdef) else static_input_names(opdef)
    lines.append("Inputs: " + ", ".join(inputs))
    if opdef.aux:
        lines.append("Auxiliary states: " + ", ".join(opdef.aux))
    if opdef.params:
        lines += ["", "Attributes:"]
        for param in opdef.params:
            default = "required" if param.default is REQUIRED else f"default {param.default!r}"
            text = f"    {param.name} ({_type_name(param.parse)}, {default})"
            lines.append(f"{text}: {param.doc}" if param.doc else text)
    return "\n".join(lines)


def make_function(opdef: OpDef, called_as: str, namespace: str,
                  invoke: Callable[[OpDef, str, tuple[Any, ...], dict[str, Any]], Any],
                  controls: tuple[str, ...]) -> Callable[..., Any]:
    """A namespace function for one op that forwards to ``invoke(opdef, called_as, args, kw)``."""

    def function(*args: Any, **kwargs: Any) -> Any:
        return invoke(opdef, called_as, args, kwargs)

    function.__name__ = called_as
    function.__qualname__ = called_as
    function.__module__ = namespace
    function.__doc__ = make_doc(opdef, called_as, namespace)
    function.__signature__ = make_signature(opdef, controls)  # type: ignore[attr-defined]
    return function
