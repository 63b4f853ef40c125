"""`Binding`: an exported graph bound to its parameters, and what that makes of its two ends.

Which variables are parameters (the params file's arrays, refused when extra, missing or not
numeric) and which are the model's inputs, the outputs' names (made unique), and a
`TensorSpec` of each input and output from shape and dtype inference with the parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.errors import ModelFormatError, ShapeError
from engine.graph.complete import complete_input_shapes
from engine.graph.infer import declared_dtype, infer_dtypes, infer_shapes
from engine.graph.ir import Graph
from engine.runtime.parameters import Parameters

# Op input slots that only ever hold learned parameters or auxiliary states: a variable wired
# only into these and absent from the params file is a missing parameter, not a model input.
PARAMETER_SLOTS = frozenset({"weight", "bias", "gamma", "beta", "moving_mean", "moving_var",
                             "parameters"})


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape (-1 where unknown, None when nothing is known) and dtype of an input/output."""

    name: str
    shape: tuple[int, ...] | None
    dtype: np.dtype


class Binding:
    """A graph's parameters, inputs and outputs, checked and described once, at load.

    Raises:
        ModelFormatError: extra, missing or non-numeric parameters, or parameters whose shapes
            do not fit the graph.
    """

    def __init__(self, graph: Graph, params: Mapping[str, np.ndarray]) -> None:
        self.graph = graph
        # A dict of arrays, until the model holds them in their final forms (`Parameters`).
        self.params: dict[str, np.ndarray] | Parameters = bind_params(graph, params)
        self.input_names = [name for name in graph.variable_names() if name not in self.params]
        self.output_names = unique(graph.output_names())
        self.param_shapes = {name: array.shape for name, array in self.params.items()}
        self.param_dtypes = {name: array.dtype for name, array in self.params.items()}
        self.declared_dtypes = declared_input_dtypes(graph, self.input_names)
        self.inputs, self.outputs = self._describe()

    @property
    def param_bytes(self) -> int:
        """Bytes the parameters hold (a dense weight held packed: its panels, `Parameters`)."""
        if isinstance(self.params, Parameters):
            return self.params.nbytes
        return sum(int(array.nbytes) for array in self.params.values())

    def _describe(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        graph = self.graph
        try:
            inputs = complete_input_shapes(graph, self.param_shapes, self.input_names)
            shapes = infer_shapes(graph, {**self.param_shapes, **inputs})
            dtypes = infer_dtypes(graph, {**self.param_dtypes, **self.declared_dtypes})
        except ShapeError as error:
            raise ModelFormatError(f"parameters do not fit the graph: {error}") from None
        index = {graph.nodes[i].name: i for i in graph.variable_indices()}
        specs = [TensorSpec(name, _spec_shape(shapes[index[name]][0]),
                            np.dtype(dtypes[index[name]][0] or np.float32))
                 for name in self.input_names]
        outputs = [TensorSpec(name, _spec_shape(shapes[entry.node][entry.index]),
                              np.dtype(dtypes[entry.node][entry.index] or np.float32))
                   for name, entry in zip(self.output_names, graph.heads)]
        return specs, outputs


def own_parameters(params: dict[str, np.ndarray]) -> None:
    """Copy out the parameters that view a buffer they fill less than half of (updated in
    place), so that the buffer goes: those read from a ``.params`` file are views into the
    file's one buffer, which a single small view left (a bias, once the weights are laid out
    anew) would keep whole."""
    views: dict[int, list[str]] = {}
    buffers: dict[int, Any] = {}
    for name, array in params.items():
        if not isinstance(array, np.ndarray):  # a packed weight's panels are its own
            continue
        root = _buffer_of(array)
        if root is not None:
            views.setdefault(id(root), []).append(name)
            buffers[id(root)] = root
    for key, names in views.items():
        if 2 * sum(params[name].nbytes for name in names) < memoryview(buffers[key]).nbytes:
            for name in names:
                params[name] = params[name].copy()


def _buffer_of(array: np.ndarray) -> Any:
    """The object other than an array whose memory `array` views (a file's bytes), or None."""
    base = array.base
    while isinstance(base, np.ndarray):
        base = base.base
    return None if base is None or isinstance(base, np.ndarray) else base


def bind_params(graph: Graph, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Match parameter arrays to graph variables; refuse extra and missing parameters."""
    variables = set(graph.variable_names())
    extra = sorted(name for name in params if name not in variables)
    if extra:
        raise ModelFormatError(f"parameter {extra[0]!r} is not a variable of the graph "
                               f"({len(extra)} unused parameter(s))")
    for name, array in params.items():
        if array.dtype.kind not in "biuf":
            raise ModelFormatError(f"parameter {name!r} has dtype {array.dtype}; parameters "
                                   "must be numeric")
    if params:
        for name, node, slot in _parameter_slots(graph):
            if name not in params:
                raise ModelFormatError(f"parameter {name!r} (input {slot!r} of "
                                       f"{node.describe()}) is missing from the params file")
    return dict(params)


def _parameter_slots(graph: Graph) -> list[tuple[str, Any, str]]:
    """Variables that feed only parameter slots: (variable name, consuming node, slot name)."""
    feeds: dict[str, list[tuple[Any, str]]] = {}
    for node in graph.nodes:
        if node.is_variable:
            continue
        for slot, entry in zip(node.opdef.input_names(node.params), node.inputs):
            source = graph.nodes[entry.node]
            if source.is_variable:
                feeds.setdefault(source.name, []).append((node, slot))
    return [(name, uses[0][0], uses[0][1]) for name, uses in feeds.items()
            if all(slot in PARAMETER_SLOTS for _, slot in uses)]


def declared_input_dtypes(graph: Graph, input_names: list[str]) -> dict[str, np.dtype]:
    """The dtypes the graph declares for some of its inputs (``__dtype__``), by name."""
    declared = {}
    for index in graph.variable_indices():
        node = graph.nodes[index]
        dtype = declared_dtype(node)
        if node.name in input_names and dtype is not None:
            declared[node.name] = dtype
    return declared


def unique(names: list[str]) -> list[str]:
    """``names`` with a count appended to each repeat (``out``, ``out1``, ...)."""
    seen: dict[str, int] = {}
    unique_names = []
    for name in names:
        count = seen.get(name, 0)
        seen[name] = count + 1
        unique_names.append(name if count == 0 else f"{name}{count}")
    return unique_names


def _spec_shape(shape: tuple[int, ...] | None) -> tuple[int, ...] | None:
    return None if shape is None else tuple(dim if dim > 0 else -1 for dim in shape)
