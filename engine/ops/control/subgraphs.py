"""How the control-flow operators reach their subgraphs: through what the layers above provide.

An operator's kernel and shape rule see only arrays and attributes, and the registry sits
below the graph code and the runtime, so they cannot import the interpreter or shape inference.
Instead the reference interpreter (`engine.runtime.interpreter`) provides `evaluate`, and shape
inference (`engine.graph.infer`) provides `infer_shapes` and `infer_dtypes`, each when it is
imported: whatever runs a control-flow node has loaded them already.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from engine.errors import ExecutionError, ShapeError

Evaluate = Callable[[Any, Mapping[str, Any], Any], list[Any]]
Infer = Callable[[Any, Mapping[str, Any]], list[list[Any]]]

_provided: dict[str, Callable[..., Any]] = {}


def provide_evaluation(evaluate: Evaluate) -> None:
    """``evaluate(graph, feed, xp)`` runs a subgraph; the runtime's interpreter gives it."""
    _provided["evaluate"] = evaluate


def provide_inference(infer_shapes: Infer, infer_dtypes: Infer) -> None:
    """``infer_shapes(graph, known)`` and ``infer_dtypes(graph, known)`` (per node, per output)
    for a subgraph; shape inference gives them."""
    _provided["infer_shapes"] = infer_shapes
    _provided["infer_dtypes"] = infer_dtypes


def evaluate(graph: Any, feed: Mapping[str, Any], xp: Any) -> list[Any]:
    """The head values of ``graph`` on ``feed`` (variable name → array)."""
    if "evaluate" not in _provided:
        raise ExecutionError("a control-flow operator needs a runtime to run its subgraph; "
                             "load the model with engine.load_model (engine.runtime)")
    return _provided["evaluate"](graph, feed, xp)


def infer_shapes(graph: Any, known: Mapping[str, Any]) -> list[list[Any]]:
    """Per node and output, the shapes of ``graph`` from its known input shapes."""
    return _inference("infer_shapes")(graph, known)


def infer_dtypes(graph: Any, known: Mapping[str, Any]) -> list[list[Any]]:
    """Per node and output, the dtypes of ``graph`` from its known input dtypes."""
    return _inference("infer_dtypes")(graph, known)


def _inference(name: str) -> Callable[..., Any]:
    if name not in _provided:
        raise ShapeError("a control-flow operator needs shape inference for its subgraphs; "
                         "it comes with engine.graph.infer")
    return _provided[name]
