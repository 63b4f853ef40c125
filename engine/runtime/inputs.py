"""`InputChecker`: what a call's inputs pass before a plan runs them.

Names (unknown and missing ones refused), dtypes (converted where `coerce` allows) and shapes:
shape inference runs once per input `Signature` (an LRU cache), and a misfit names the inputs
behind the failing node, the node and the shapes it was given. With ``keep_batch`` (a server's
models) shapes that give an output another number of rows than the inputs are refused too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from engine.errors import InputError, ShapeError
from engine.graph.complete import upstream_inputs
from engine.graph.infer import NodeShapeError, infer_shapes
from engine.ops.shapes import is_known
from engine.runtime.binding import Binding, TensorSpec
from engine.runtime.lru import LRUCache
from engine.runtime.signature import Signature


class UnknownShape(NamedTuple):
    """A node whose output shape inference leaves unknown: what it says, and the inputs the
    node reads (through any path), whose shapes may be at fault."""

    message: str
    inputs: tuple[str, ...]


class InputChecker:
    """The checks of one model's inputs, and its cache of inferred shapes per signature."""

    def __init__(self, binding: Binding, keep_batch: bool, cache_size: int) -> None:
        self.graph = binding.graph
        self.inputs = binding.inputs
        self.input_names = binding.input_names
        self.output_names = binding.output_names
        self.keep_batch = keep_batch
        # Where the batch lies in each input and output, by name, for `keep_batch` (absent
        # names: axis 0); None: the tensors have no batch dimension, nothing to keep.
        self.batch_axes: dict[str, int] | None = {}
        self._param_shapes = binding.param_shapes
        self._declared = binding.declared_dtypes
        self.shape_cache: LRUCache[Signature, list] = LRUCache(cache_size)

    def check(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """``inputs`` as arrays in the model's input order, dtypes converted where allowed.

        Raises:
            InputError: unknown or missing names, or a dtype that cannot be converted.
        """
        unknown = [name for name in inputs if name not in self.input_names]
        if unknown:
            raise InputError(f"unknown input {unknown[0]!r}; the model's inputs are: "
                             f"{', '.join(self.input_names)}")
        missing = [name for name in self.input_names if name not in inputs]
        if missing:
            raise InputError(f"missing input {missing[0]!r}; the model's inputs are: "
                             f"{', '.join(self.input_names)}")
        feed = {}
        for spec in self.inputs:
            array = np.asarray(inputs[spec.name])
            feed[spec.name] = coerce(spec, array, spec.name in self._declared)
        return feed

    def shapes_for(self, feed: Mapping[str, np.ndarray]) -> list:
        """Shape inference for these inputs' shapes, once per signature (cached)."""
        return self.signature_shapes(Signature.of(feed))

    def signature_shapes(self, signature: Signature) -> list:
        """Every node's output shapes for inputs of ``signature`` (cached).

        Raises:
            InputError: the shapes do not fit (`misfit` says where), or with ``keep_batch``
                an output would not keep the inputs' rows.
        """
        shapes = self.shape_cache.get(signature)
        if shapes is None:
            known = {**self._param_shapes, **signature.shapes()}
            try:
                shapes = infer_shapes(self.graph, known)
            except ShapeError as error:
                raise InputError(self.misfit(known, error, signature.names())) from None
            if self.keep_batch:
                self._check_batch(known, shapes, signature.names())
            self.shape_cache.put(signature, shapes)
        return shapes

    def output_shapes(self, input_shapes: Mapping[str, tuple[int, ...]]
                      ) -> dict[str, tuple[int, ...] | None]:
        """Output shapes for these input shapes, from shape inference alone (not cached).

        Raises:
            InputError: the shapes do not fit; names the inputs, the node, its op and shapes.
        """
        known = {**self._param_shapes, **{name: tuple(shape)
                                          for name, shape in input_shapes.items()}}
        try:
            shapes = infer_shapes(self.graph, known)
        except ShapeError as error:
            raise InputError(self.misfit(known, error, list(input_shapes))) from None
        return {name: shapes[entry.node][entry.index]
                for name, entry in zip(self.output_names, self.graph.heads)}

    def unknown_shape(self, input_shapes: Mapping[str, tuple[int, ...]]
                      ) -> UnknownShape | None:
        """The first node whose output shape these input shapes leave unknown (a plan cannot
        be compiled for them), or None when shape inference knows every one.

        Raises:
            InputError: the shapes do not fit (`misfit` says where).
        """
        known = {**self._param_shapes, **{name: tuple(shape)
                                          for name, shape in input_shapes.items()}}
        try:
            shapes = infer_shapes(self.graph, known)
        except ShapeError as error:
            raise InputError(self.misfit(known, error, list(input_shapes))) from None
        for node, outputs in zip(self.graph.nodes, shapes):
            for slot, shape in enumerate(outputs):
                if not is_known(shape):
                    return UnknownShape(
                        f"{node.describe()}: shape of output {slot} is unknown ({shape})",
                        tuple(name for name in upstream_inputs(self.graph, node.name)
                              if name in input_shapes))
        return None

    def _check_batch(self, known: Mapping[str, tuple[int, ...]], shapes: list,
                     inputs: list[str]) -> None:
        """With `keep_batch`, refuse shapes that would give an output another number of rows
        than the inputs have (a reshape folding features into the batch): a server splits
        outputs by rows along their batch axes, so such a request cannot be answered."""
        axes = self.batch_axes
        if axes is None:
            return
        rows = {known[name][axes.get(name, 0)] for name in inputs
                if len(known[name]) > axes.get(name, 0)}
        if len(rows) != 1:
            return
        want = rows.pop()
        for name, entry in zip(self.output_names, self.graph.heads):
            shape, axis = shapes[entry.node][entry.index], axes.get(name, 0)
            if shape and len(shape) > axis and shape[axis] and shape[axis] != want:
                given = ", ".join(f"{key!r} shape {list(known[key])}" for key in inputs)
                where = "first" if axis == 0 else f"at axis {axis}"
                raise InputError(f"input(s) {given} would give output {name!r} shape "
                                 f"{list(shape)}: {shape[axis]} rows for {want}; outputs must "
                                 f"keep the inputs' batch dimension {where}")

    def misfit(self, known: Mapping[str, tuple[int, ...]], error: ShapeError,
               inputs: list[str]) -> str:
        """Why these input shapes do not fit: the inputs behind the failing node with their
        shapes, the node and its op (in `error`), and the shapes the node was given."""
        names = inputs
        seen = ""
        if isinstance(error, NodeShapeError):
            names = [name for name in upstream_inputs(self.graph, error.node_name)
                     if name in inputs] or inputs
            seen = f" (its inputs there: {error.input_shapes})"
        shapes = ", ".join(f"{name!r} shape {list(known[name])}" for name in names)
        verb = "does" if len(names) == 1 else "do"
        noun = "input" if len(names) == 1 else "inputs"
        return f"{noun} {shapes} {verb} not fit the model: {error}{seen}"


def coerce(spec: TensorSpec, array: np.ndarray, declared: bool) -> np.ndarray:
    """``array`` converted to the input's dtype where the graph declares it (or from float64),
    else as it is; non-numeric arrays, and declared dtypes not reached by a same-kind cast, are
    refused (`InputError`)."""
    if array.dtype == spec.dtype:
        return array
    if array.dtype == object or not (np.issubdtype(array.dtype, np.number)
                                     or array.dtype == np.bool_):
        raise InputError(f"input {spec.name!r}: dtype {array.dtype} is not numeric; "
                         f"expected {spec.dtype.name}")
    if declared and not np.can_cast(array.dtype, spec.dtype, "same_kind"):
        raise InputError(f"input {spec.name!r}: dtype {array.dtype.name} cannot be converted to "
                         f"the declared {spec.dtype.name}")
    if declared or array.dtype == np.float64:
        return array.astype(spec.dtype)
    return array
