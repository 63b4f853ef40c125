"""`NodeContext`, what a converter sees of one node, and the table of converters by op name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.errors import OnnxExportError
from engine.graph.ir import Node
from engine.onnx.builder import OnnxBuilder
from engine.ops.registry import Attrs

Shape = tuple[int, ...]
Converter = Callable[["NodeContext"], "str | list[str]"]
CONVERTERS: dict[str, Converter] = {}


def converts(*op_names: str) -> Callable[[Converter], Converter]:
    """Register a converter for MXNet ops by their canonical registry names."""

    def register(function: Converter) -> Converter:
        for name in op_names:
            assert name not in CONVERTERS, f"two converters for {name}"
            CONVERTERS[name] = function
        return function

    return register


@dataclass
class NodeContext:
    """One MXNet node being converted: its ONNX input names, shapes, dtypes and constants.

    Shapes come from shape inference at the export batch size; ``*_other`` at one more, so a
    converter can tell which dimensions follow the batch (see `OnnxBuilder.shape_tensor`).
    """

    builder: OnnxBuilder
    node: Node
    inputs: list[str]
    in_shapes: list[Shape]
    in_other: list[Shape | None]
    out_shapes: list[Shape]
    out_other: list[Shape | None]
    in_dtypes: list[np.dtype]
    out_dtypes: list[np.dtype]
    constants: list[np.ndarray | None]

    @property
    def params(self) -> Attrs:
        """The node's parsed attributes."""
        return self.node.params

    @property
    def op_name(self) -> str:
        """The op's canonical registry name (aliases such as ``_npx_relu`` resolved)."""
        return self.node.opdef.name

    @property
    def hint(self) -> str:
        """A name prefix for the ONNX tensors this node produces."""
        return self.node.name

    def fail(self, reason: str) -> OnnxExportError:
        """An error naming this node and its op (raise it)."""
        return OnnxExportError(f"node {self.node.name!r} ({self.node.op}): {reason}")

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs: Any) -> Any:
        """Emit an ONNX node named after this MXNet node."""
        return self.builder.op(op_type, inputs, self.hint, outputs, **attrs)

    def scalar(self, value: float, like: int = 0) -> str:
        """A 0-D constant of input ``like``'s dtype."""
        return self.builder.const(np.asarray(value, dtype=self.in_dtypes[like]),
                                  f"{self.hint}_scalar")

    def ints(self, values: Any) -> str:
        """A 1-D int64 constant."""
        return self.builder.ints(values, f"{self.hint}_ints")

    def rank(self, index: int = 0) -> int:
        """Number of dimensions of input ``index``."""
        return len(self.in_shapes[index])

    def static_dim(self, index: int, axis: int) -> int:
        """Size of ``axis`` of input ``index``, which the conversion bakes in as a constant.

        Raises:
            OnnxExportError: the size follows the batch, so a constant would be wrong.
        """
        other = self.in_other[index]
        if other is not None and other[axis] != self.in_shapes[index][axis]:
            raise self.fail(f"needs the size of axis {axis} of input {index} at export time, but "
                            "it follows the batch; export with dynamic_batch=False")
        return self.in_shapes[index][axis]

    def out_shape_tensor(self, index: int = 0, infer_one: bool = False) -> str:
        """Output ``index``'s shape as a tensor that follows the batch size."""
        return self.builder.shape_tensor(self.out_shapes[index], self.out_other[index],
                                         self.hint, infer_one)

    def reduce(self, op_type: str, data: str, axes: list[int] | None, keepdims: bool) -> str:
        """A Reduce* node over ``axes`` (all axes when None), opset-aware about ``axes``."""
        keep = int(keepdims)
        if axes is None:
            return self.op(op_type, [data], keepdims=keep)
        if self.builder.opset >= 18 or op_type == "ReduceSum":
            return self.op(op_type, [data, self.ints(axes)], keepdims=keep)
        return self.op(op_type, [data], axes=list(axes), keepdims=keep)

    def unsqueeze(self, data: str, axes: list[int]) -> str:
        """Insert size-1 axes."""
        return self.op("Unsqueeze", [data, self.ints(axes)])

    def squeeze(self, data: str, axes: list[int]) -> str:
        """Remove size-1 axes."""
        return self.op("Squeeze", [data, self.ints(axes)])

    def cast(self, data: str, dtype: Any) -> str:
        """Cast to a numpy dtype."""
        from onnx import helper

        return self.op("Cast", [data], to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))

    def constant(self, index: int, what: str) -> np.ndarray:
        """The value of input ``index``, which this conversion needs known at export time."""
        value = self.constants[index]
        if value is None:
            raise self.fail(f"input {index} ({what}) must be a parameter known at export time")
        return value


def normalize_axis(axis: int, rank: int) -> int:
    """A non-negative axis."""
    return axis + rank if axis < 0 else axis
