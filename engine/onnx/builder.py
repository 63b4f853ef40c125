"""`OnnxBuilder`: collects ONNX nodes and initializers with unique names while a graph converts.

Converters call `op` for each ONNX node they emit and `const` for every constant tensor; the
builder owns naming so that converters never clash with each other or with the model's names.
"""

from __future__ import annotations

from typing import Any

import numpy as np

INT64 = np.int64
BATCH_DIM = "batch"


def require_onnx() -> Any:
    """The ``onnx`` module, or an ImportError that says how to install it."""
    try:
        import onnx
    except ImportError as error:
        raise ImportError("exporting to ONNX needs the onnx package: "
                          "pip install 'hybridserve[onnx]'") from error
    return onnx


class OnnxBuilder:
    """The ONNX nodes and initializers of one export, in emission (topological) order."""

    def __init__(self, opset: int) -> None:
        from onnx import helper, numpy_helper

        self._helper = helper
        self._numpy_helper = numpy_helper
        self.opset = opset
        self.nodes: list[Any] = []
        self.initializers: dict[str, Any] = {}
        self._taken: set[str] = set()
        self.batch_source: str | None = None  # a graph input whose axis 0 is the batch
        self.base_batch = 1  # the batch size shapes were inferred at
        self._batch: str | None = None

    @property
    def batch(self) -> str:
        """A 1-D int64 tensor ``[batch]``, read from the batch source input on first use."""
        if self._batch is None:
            assert self.batch_source is not None  # only asked for when some dim follows it
            shape = self.op("Shape", [self.batch_source], "batch_size")
            self._batch = self.op("Slice", [shape, self.ints([0], "zero"),
                                            self.ints([1], "one")], "batch_size")
        return self._batch

    def unique(self, hint: str) -> str:
        """``hint``, or ``hint`` with the smallest numeric suffix that is still free."""
        name, count = hint, 0
        while name in self._taken:
            count += 1
            name = f"{hint}_{count}"
        self._taken.add(name)
        return name

    def reserve(self, name: str) -> None:
        """Mark a name (a graph input) as used."""
        self._taken.add(name)

    def op(self, op_type: str, inputs: list[str], hint: str, outputs: int = 1,
           **attrs: Any) -> Any:
        """Emit one node; return its output name (or the list of names when ``outputs > 1``)."""
        names = [self.unique(f"{hint}_out{k}" if outputs > 1 else hint) for k in range(outputs)]
        self.nodes.append(self._helper.make_node(op_type, inputs, names,
                                                 name=self.unique(f"{hint}__{op_type}"),
                                                 **attrs))
        return names if outputs > 1 else names[0]

    def const(self, value: Any, hint: str, dtype: Any = None) -> str:
        """An initializer holding ``value`` (converted to ``dtype`` when given)."""
        array = np.asarray(value, dtype=dtype)
        name = self.unique(hint)
        # (np.ascontiguousarray would turn a 0-D array into a 1-D one)
        self.initializers[name] = self._numpy_helper.from_array(array.copy(order="C"), name)
        return name

    def ints(self, values: Any, hint: str) -> str:
        """A 1-D int64 initializer (axes, shapes, split sizes, slice bounds)."""
        return self.const(np.asarray(values, dtype=INT64).reshape(-1), hint)

    def shape_tensor(self, shape: tuple[int, ...], other: tuple[int, ...] | None, hint: str,
                     infer_one: bool = False) -> str:
        """A 1-D int64 tensor for ``shape``, following the batch where ``other`` differs.

        ``shape`` and ``other`` are one tensor's shape at two batch sizes (``batch`` and
        ``batch + 1``), so a differing dimension is ``slope * batch + offset``. With
        ``infer_one`` (a Reshape target) a single differing dimension is written as -1.
        """
        moving = [k for k in range(len(shape)) if other is not None and shape[k] != other[k]]
        if not moving:
            return self.ints(shape, f"{hint}_shape")
        if infer_one and len(moving) == 1:
            return self.ints([-1 if k in moving else d for k, d in enumerate(shape)],
                             f"{hint}_shape")
        assert other is not None
        pieces = []
        for k, dim in enumerate(shape):
            if k not in moving:
                pieces.append(self.ints([dim], f"{hint}_dim{k}"))
                continue
            slope = other[k] - dim
            offset = dim - slope * self.base_batch
            scaled = self.op("Mul", [self.batch, self.ints([slope], f"{hint}_slope{k}")],
                             f"{hint}_dim{k}")
            pieces.append(self.op("Add", [scaled, self.ints([offset], f"{hint}_offset{k}")],
                                  f"{hint}_dim{k}") if offset else scaled)
        return self.op("Concat", pieces, f"{hint}_shape", axis=0)
