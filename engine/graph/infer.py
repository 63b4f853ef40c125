"""Shape and dtype inference over a whole graph, with partially known shapes.

Each op's ``infer_shape`` maps partially known input shapes to completed inputs and outputs. A
graph pass runs them forward and writes what an op learns about its inputs back to the producing
entries (that is how a FullyConnected weight learns its width from the data), repeating until
nothing changes. Variable shapes start from the caller's ``known`` mapping, else from the
variable's ``__shape__`` annotation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from engine.errors import ModelFormatError, ShapeError
from engine.graph.ir import Graph, Node
from engine.ops.attrs import parse_int_tuple
from engine.ops.control import subgraphs
from engine.ops.registry import Attrs
from engine.ops.shapes import merge

MaybeShape = tuple[int, ...] | None
MaybeDType = np.dtype | None

# MXNet's dtype codes, as written in ``__dtype__`` annotations.
DTYPE_CODES = {0: "float32", 1: "float64", 2: "float16", 3: "uint8", 4: "int32", 5: "int8",
               6: "int64", 7: "bool", 8: "int16", 9: "uint16", 10: "uint32", 11: "uint64"}
_MAX_ROUNDS = 8


class NodeShapeError(ShapeError):
    """A `ShapeError` found at one node; keeps the node's name, op and input shapes so that a
    caller can say which of its own inputs led there."""

    def __init__(self, node: Node, inputs: Sequence[Any], detail: str) -> None:
        super().__init__(f"{node.describe()}: {detail}")
        self.node_name = node.name
        self.op = node.op
        names = node.opdef.input_names(node.params)
        # Internally an unknown dimension is 0; a reader expects "?" there.
        self.input_shapes = ", ".join(f"{name} {_readable(shape)}"
                                      for name, shape in zip(names, inputs))


def _readable(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(str(dim) if dim else "?" for dim in value) + \
            ("," if len(value) == 1 else "") + ")"
    return "?" if value is None else str(np.dtype(value).name)


def declared_shape(node: Node) -> MaybeShape:
    """A variable's ``__shape__`` annotation (unknown dims as 0), or None."""
    text = node.attrs.get("__shape__")
    if text is None:
        return None
    try:
        shape = parse_int_tuple(text)
    except ValueError:
        raise ModelFormatError(f"variable {node.name!r}: bad __shape__ {text!r}") from None
    # NumPy-mode files write -1 for an unknown dimension; internally unknown is 0.
    shape = tuple(max(dim, 0) for dim in shape)
    return shape if shape else None


def declared_dtype(node: Node) -> MaybeDType:
    """A variable's ``__dtype__`` annotation as a numpy dtype, or None."""
    text = node.attrs.get("__dtype__")
    if text is None:
        return None
    try:
        return np.dtype(DTYPE_CODES[int(text)])
    except (KeyError, ValueError):
        raise ModelFormatError(f"variable {node.name!r}: unknown __dtype__ {text!r}") from None


def infer_shapes(graph: Graph, known: Mapping[str, tuple[int, ...]]) -> list[list[MaybeShape]]:
    """Shapes of every node's visible outputs (variables: their own shape).

    Raises:
        ShapeError: an op finds its input shapes inconsistent; the message names the node.
    """
    start = {name: tuple(shape) for name, shape in known.items()}
    return _propagate(graph, start, declared_shape, "infer_shape", _merge_shape)


def infer_dtypes(graph: Graph, known: Mapping[str, Any]) -> list[list[MaybeDType]]:
    """Dtypes of every node's visible outputs (variables: their own dtype)."""
    start = {name: np.dtype(dtype) for name, dtype in known.items()}
    # MXNet does not enforce ``__dtype__`` (a model cast to float16 after export keeps "0"), so
    # a declared dtype only fills in for variables whose dtype is not given.
    return _propagate(graph, start, declared_dtype, "infer_dtype", _merge_dtype,
                      given_wins=True)


def _differs(new: Any, old: Any) -> bool:
    # Not ``new != old``: numpy reads ``np.dtype('float64') == None`` as a float64 comparison.
    if new is None or old is None:
        return new is not old
    return bool(new != old)


def _merge_shape(first: Any, second: Any, what: str) -> Any:
    return merge(first, second, what)


def _merge_dtype(first: Any, second: Any, what: str) -> Any:
    if first is None:
        return second
    if second is None or np.dtype(first) == np.dtype(second):
        return first
    raise ShapeError(f"{what} disagree: {np.dtype(first).name} vs {np.dtype(second).name}")


def _propagate(graph: Graph, known: Mapping[str, Any], declared: Callable[[Node], Any],
               method: str, unify: Callable[[Any, Any, str], Any],
               given_wins: bool = False) -> list[list[Any]]:
    values: list[list[Any]] = []
    for node in graph.nodes:
        if node.is_variable:
            given = known.get(node.name)
            if given_wins and given is not None:
                values.append([given])
                continue
            values.append([unify(given, declared(node),
                                 f"variable {node.name!r}: given and declared")])
        else:
            values.append([None] * node.num_outputs())
    for _ in range(_MAX_ROUNDS):
        if not _one_round(graph, values, method, unify):
            break
    return values


def _one_round(graph: Graph, values: list[list[Any]], method: str,
               unify: Callable[[Any, Any, str], Any]) -> bool:
    changed = False
    for index, node in enumerate(graph.nodes):
        if node.is_variable:
            continue
        current = [values[entry.node][entry.index] for entry in node.inputs]
        try:
            inputs, outputs = getattr(node.opdef, method)(node.params, list(current))
            for entry, old, new in zip(node.inputs, current, inputs):
                merged = unify(old, new, f"input {graph.nodes[entry.node].name!r}")
                if _differs(merged, old):
                    values[entry.node][entry.index] = merged
                    changed = True
            for slot, new in enumerate(outputs):
                old = values[index][slot]
                merged = unify(old, new, f"output {slot}")
                if _differs(merged, old):
                    values[index][slot] = merged
                    changed = True
        except ShapeError as error:
            raise NodeShapeError(node, current, str(error)) from None
        except ModelFormatError:
            raise
        except (ValueError, TypeError, IndexError, ZeroDivisionError) as error:
            raise NodeShapeError(node, current, f"cannot infer {method[6:]}s from inputs "
                                 f"{current}: {error}") from None
    return changed


def specialize_sources(node: Node, shapes: Sequence[tuple[int, ...] | None]) -> Attrs:
    """Attributes of a node, with a creation op's partially known ``shape`` made concrete.

    Creation ops such as ``_zeros`` with ``shape=(1, 0, 32)`` (Gluon's RNN state) learn their
    unknown dimensions from shape inference over the whole graph.
    """
    params = node.params
    if node.inputs or "shape" not in params or shapes[0] is None:
        return params
    return Attrs({**params, "shape": tuple(shapes[0])})


# Control-flow operators infer their subgraphs' shapes and dtypes through these.
subgraphs.provide_inference(infer_shapes, infer_dtypes)
