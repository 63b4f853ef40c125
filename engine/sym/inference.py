"""``Symbol.infer_shape``/``infer_type``: MXNet's (arguments, outputs, auxiliary) triples.

Works on a symbol's output entries and graph, not on `Symbol` itself, so that `symbol` imports
this module and not the other way round.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.errors import InputError
from engine.graph.infer import infer_dtypes, infer_shapes
from engine.graph.ir import Graph
from engine.sym.node import SymNode, aux_nodes, topological


def infer(outputs: Sequence[tuple[SymNode, int]], graph: Graph, kind: str,
          args: tuple[Any, ...], kwargs: dict[str, Any], partial: bool) -> tuple[Any, Any, Any]:
    """Run graph inference for ``kind`` ('shape' or 'dtype') over ``graph`` (the graph of the
    symbol whose output entries are ``outputs``) and arrange MXNet's triple."""
    nodes = topological([node for node, _ in outputs])  # the graph's node order
    aux = aux_nodes(nodes)
    arguments = [node.name for node in nodes if node.is_variable and id(node) not in aux]
    inputs = [node.name for node in nodes if node.is_variable]
    known = _known(arguments, inputs, args, kwargs, kind)
    values = (infer_shapes if kind == "shape" else infer_dtypes)(graph, known)
    arg_values = [values[i][0] for i, node in enumerate(nodes)
                  if node.is_variable and id(node) not in aux]
    aux_values = [values[i][0] for i, node in enumerate(nodes)
                  if node.is_variable and id(node) in aux]
    out_values = [values[entry.node][entry.index] for entry in graph.heads]
    every = arg_values + out_values + aux_values
    complete = all(_complete(value, kind) for value in every)
    if not complete and not partial:
        unknown = [name for name, value in zip(arguments, arg_values, strict=True)
                   if not _complete(value, kind)]
        warnings.warn(f"infer_{kind}: cannot decide the {kind} of "
                      f"{', '.join(unknown) or 'some outputs'}; give more input {kind}s or use "
                      f"infer_{kind}_partial", stacklevel=3)
        return None, None, None
    convert = _shape_out if kind == "shape" else _dtype_out
    return ([convert(v) for v in arg_values], [convert(v) for v in out_values],
            [convert(v) for v in aux_values])


def _known(arguments: list[str], inputs: list[str], args: tuple[Any, ...],
           kwargs: dict[str, Any], kind: str) -> dict[str, Any]:
    if len(args) > len(arguments):
        raise InputError(f"infer_{kind}: {len(args)} positional values for "
                         f"{len(arguments)} arguments ({', '.join(arguments)})")
    known = {name: value for name, value in zip(arguments, args, strict=False)
             if value is not None}
    for name, value in kwargs.items():
        if name not in inputs:
            raise InputError(f"infer_{kind}: unknown argument {name!r}; the symbol's inputs are "
                             f"{', '.join(inputs)}")
        if value is not None:
            known[name] = value
    if kind == "shape":
        return {name: tuple(int(dim) for dim in value) for name, value in known.items()}
    return {name: np.dtype(value) for name, value in known.items()}


def _complete(value: Any, kind: str) -> bool:
    if value is None:
        return False
    return kind != "shape" or all(dim > 0 for dim in value)


def _shape_out(value: Any) -> tuple[int, ...]:
    return () if value is None else tuple(value)


def _dtype_out(value: Any) -> Any:
    return None if value is None else np.dtype(value).type
