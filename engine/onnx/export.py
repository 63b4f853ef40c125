"""`export`: an MXNet model (after the folding passes) written as an ONNX file with a dynamic batch.

The graph goes through the device-independent passes (constant folding, BatchNorm folding,
dead-node elimination) and is then converted node by node. Shapes are inferred twice, at the
export batch size and at one more, so every dimension that follows the batch (Reshape targets,
RNN begin states) is written as an expression of the runtime batch instead of a constant.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.compiler import optimize_graph
from engine.errors import OnnxExportError, ShapeError
from engine.graph.infer import infer_dtypes, infer_shapes
from engine.graph.ir import Entry, Graph, Node
from engine.onnx.builder import BATCH_DIM, OnnxBuilder, require_onnx
from engine.onnx.context import CONVERTERS, NodeContext
from engine.onnx.refused import REFUSED
from engine.runtime.loader import load_model
from engine.runtime.model import Model

FOLDING_PASSES = ("fold_constants", "fold_batchnorm", "eliminate_dead_nodes")
DEFAULT_OPSET = 17
SUPPORTED_OPSETS = range(17, 22)
# Protobuf cannot serialise a message over 2 GiB: larger models keep weights in a side file.
EXTERNAL_DATA_THRESHOLD = 2 << 30


def export(model_or_files: Model | Sequence[Any], path: str | os.PathLike, *,
           opset: int = DEFAULT_OPSET, input_shapes: Mapping[str, Sequence[int]] | None = None,
           input_dtypes: Mapping[str, Any] | None = None, dynamic_batch: bool = True,
           external_data_threshold: int = EXTERNAL_DATA_THRESHOLD) -> Path:
    """Write a model as an ONNX file whose inputs have a symbolic first (batch) dimension.

    Args:
        model_or_files: a `Model` from `engine.load_model`, or a ``(symbol, params)`` pair in any
            form `load_model` accepts (paths, bytes, dicts).
        path: the ``.onnx`` file to write.
        opset: the ONNX opset to target (17 to 21).
        input_shapes: example shape of each input, needed where the files do not fix the
            non-batch dimensions (image sizes); the batch dimension stays dynamic.
        input_dtypes: dtype of each input where it differs from the model's declared one
            (token ids fed to an Embedding as int32 rather than float32).
        dynamic_batch: False writes every input shape exactly as given.
        external_data_threshold: initializers totalling more bytes than this are written to
            ``<path>.data`` beside the model (ONNX's external data; 2 GiB by default).

    Returns:
        The path written.

    Raises:
        OnnxExportError: an op has no ONNX mapping (names the node and op), a shape is unknown,
            or the opset is unsupported.
        ImportError: the ``onnx`` package is missing (``pip install hybridserve[onnx]``).

    Example:
        >>> engine.onnx.export(("lenet-symbol.json", "lenet-0000.params"), "lenet.onnx",
        ...                    input_shapes={"data": (1, 1, 28, 28)})
    """
    onnx = require_onnx()
    proto = to_onnx(_as_model(model_or_files), opset=opset, input_shapes=input_shapes,
                    input_dtypes=input_dtypes, dynamic_batch=dynamic_batch)
    target = Path(path)
    size = sum(len(tensor.raw_data) for tensor in proto.graph.initializer)
    if size > external_data_threshold:
        data_file = target.name + ".data"
        (target.parent / data_file).unlink(missing_ok=True)  # onnx appends to an existing one
        onnx.save_model(proto, target, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_file, size_threshold=0)
    else:
        onnx.save_model(proto, target)
    onnx.checker.check_model(str(target))
    return target


def _as_model(model_or_files: Model | Sequence[Any]) -> Model:
    if isinstance(model_or_files, Model):
        return model_or_files
    if isinstance(model_or_files, (tuple, list)) and len(model_or_files) == 2:
        return load_model(model_or_files[0], model_or_files[1], optimize=False)
    raise TypeError("model_or_files must be a Model or a (symbol, params) pair; got "
                    f"{type(model_or_files).__name__}")


def to_onnx(model: Model, *, opset: int = DEFAULT_OPSET,
            input_shapes: Mapping[str, Sequence[int]] | None = None,
            input_dtypes: Mapping[str, Any] | None = None, dynamic_batch: bool = True) -> Any:
    """The ONNX ``ModelProto`` of a model (see `export`)."""
    helper = require_onnx().helper
    if opset not in SUPPORTED_OPSETS:
        raise OnnxExportError(f"opset {opset} is not supported; choose "
                              f"{SUPPORTED_OPSETS.start} to {SUPPORTED_OPSETS.stop - 1}")
    graph = optimize_graph(model.graph.replace(constants=model.params), FOLDING_PASSES)
    for node in graph.nodes:  # refuse before shape inference, whose errors would be less clear
        if not node.is_variable:
            refuse_unmapped(node)
    shapes = example_shapes(model, input_shapes)
    base, other = _shapes_at_two_batches(graph, shapes, dynamic_batch)
    dtypes = infer_dtypes(graph, {**{name: np.asarray(value).dtype for name, value in
                                     graph.constants.items()},
                                  **{spec.name: spec.dtype for spec in model.inputs},
                                  **{name: np.dtype(dtype) for name, dtype in
                                     (input_dtypes or {}).items()}})
    builder = OnnxBuilder(opset)
    builder.base_batch = next((shape[0] for shape in shapes.values() if shape), 1)
    converted = GraphConversion(graph, builder, base, other, dtypes, dynamic_batch)
    onnx_graph = converted.run(model.output_names)
    return helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", opset)],
                             producer_name="hybridserve")


def example_shapes(model: Model, given: Mapping[str, Sequence[int]] | None) -> dict[str, tuple]:
    """Each input's example shape: given, or what the files fix (batch 1 where unknown)."""
    given = dict(given or {})
    unknown = sorted(set(given) - set(model.input_names))
    if unknown:
        raise OnnxExportError(f"input_shapes names {unknown[0]!r}, which is not an input; "
                              f"inputs are: {', '.join(model.input_names)}")
    shapes = {}
    for spec in model.inputs:
        if spec.name in given:
            shapes[spec.name] = tuple(int(dim) for dim in given[spec.name])
            continue
        shape = spec.shape
        if shape is None or any(dim < 0 for dim in shape[1:]):
            example = (1, *(dim if dim > 0 else 224 for dim in shape[1:])) if shape else (1, 224)
            raise OnnxExportError(
                f"input {spec.name!r} has shape {shape} in the files (-1: not fixed by the "
                f"graph); give its full shape, for example input_shapes={{{spec.name!r}: "
                f"{example}}} (--input-shape {spec.name}={','.join(map(str, example))} on the "
                "command line)")
        shapes[spec.name] = (max(shape[0], 1), *shape[1:]) if shape else ()
    return shapes


def _shapes_at_two_batches(graph: Graph, shapes: dict[str, tuple], dynamic: bool) -> tuple:
    known = {name: np.shape(value) for name, value in graph.constants.items()}
    base = infer_shapes(graph, {**known, **shapes})
    if not dynamic:
        return base, None
    if any(len(shape) == 0 for shape in shapes.values()):
        raise OnnxExportError("an input is a scalar, so it has no batch dimension; "
                              "export with dynamic_batch=False")
    grown = {name: (shape[0] + 1, *shape[1:]) for name, shape in shapes.items()}
    try:
        return base, infer_shapes(graph, {**known, **grown})
    except ShapeError as error:
        raise OnnxExportError(f"the graph does not take a batch on axis 0 of every input "
                              f"({error}); export with dynamic_batch=False") from None


def refuse_unmapped(node: Node) -> None:
    """Raise `OnnxExportError` naming the node and op when the op has no ONNX mapping."""
    if node.opdef.name in REFUSED:
        raise OnnxExportError(f"node {node.name!r} ({node.op}): the op has no ONNX mapping: "
                              f"{REFUSED[node.opdef.name]}")
    if node.opdef.name not in CONVERTERS:
        raise OnnxExportError(f"node {node.name!r} ({node.op}): the op has no ONNX mapping; "
                              "see docs/onnx.md for the supported ops")


class GraphConversion:
    """Converts one folded graph's nodes, in order, into an ONNX ``GraphProto``."""

    def __init__(self, graph: Graph, builder: OnnxBuilder, base: list, other: list | None,
                 dtypes: list, dynamic: bool) -> None:
        self.graph, self.builder, self.base, self.other = graph, builder, base, other
        self.dtypes, self.dynamic = dtypes, dynamic
        self.names: dict[tuple[int, int], str] = {}
        self.inputs: list[Any] = []

    def run(self, output_names: list[str]) -> Any:
        """Convert every node; name the heads ``output_names``."""
        from onnx import helper

        # Graph inputs, parameters and outputs keep their MXNet names; everything a converter
        # makes is named around them.
        for name in [*output_names, *self.graph.variable_names()]:
            self.builder.reserve(name)
        for index, node in enumerate(self.graph.nodes):
            if node.is_variable:
                self._variable(index)
            else:
                self._operator(index)
        outputs = []
        for name, entry in zip(output_names, self.graph.heads):
            self.builder.nodes.append(helper.make_node("Identity", [self._name(entry)], [name],
                                                       name=f"{name}__output"))
            outputs.append(self._value_info(name, entry))
        used = {name for node in self.builder.nodes for name in node.input}
        inputs = [value for value in self.inputs if value.name in used]
        initializers = [tensor for name, tensor in self.builder.initializers.items()
                        if name in used]
        return helper.make_graph(self.builder.nodes, "hybridserve", inputs, outputs,
                                 initializers)

    def _name(self, entry: Entry) -> str:
        return self.names[(entry.node, entry.index)]

    def _variable(self, index: int) -> None:
        from onnx import numpy_helper

        node = self.graph.nodes[index]
        self.names[(index, 0)] = node.name
        if node.name in self.builder.initializers or any(
                value.name == node.name for value in self.inputs):
            return  # a second node of the same variable
        if node.name in self.graph.constants:
            value = np.asarray(self.graph.constants[node.name])
            self.builder.initializers[node.name] = numpy_helper.from_array(
                value.copy(order="C"), node.name)
            return
        self.inputs.append(self._value_info(node.name, Entry(index, 0), input_dims=True))
        if self.builder.batch_source is None:
            self.builder.batch_source = node.name

    def _value_info(self, name: str, entry: Entry, input_dims: bool = False) -> Any:
        from onnx import helper

        shape = self.base[entry.node][entry.index]
        other = self.other[entry.node][entry.index] if self.other else None
        # A 0 dimension is one shape inference leaves unknown: sized by the data at run time.
        dims: list[Any] = [dim or None for dim in shape]
        if input_dims and self.dynamic:
            dims[0] = BATCH_DIM
        elif other is not None:
            dims = [dim if dim == later and dim else self._batch_name(dim, later)
                    for dim, later in zip(shape, other)]
        dtype = self.dtypes[entry.node][entry.index] or np.dtype(np.float32)
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtype), dims)

    def _batch_name(self, dim: int, later: int) -> str | None:
        """``batch`` for a dimension equal to the batch, None (unnamed) for one derived from it."""
        return BATCH_DIM if dim == self.builder.base_batch and later == dim + 1 else None

    def _operator(self, index: int) -> None:
        node = self.graph.nodes[index]
        refuse_unmapped(node)
        converter = CONVERTERS[node.opdef.name]
        ctx = self._context(index)
        outputs = converter(ctx)
        outputs = outputs if isinstance(outputs, list) else [outputs]
        assert len(outputs) == node.num_outputs(), f"{node.describe()}: converter outputs"
        for slot, name in enumerate(outputs):
            self.names[(index, slot)] = name

    def _context(self, index: int) -> NodeContext:
        node, graph = self.graph.nodes[index], self.graph

        def shape_of(table: list | None, entry: Entry) -> Any:
            return None if table is None else tuple(table[entry.node][entry.index])

        sources = [graph.nodes[entry.node] for entry in node.inputs]
        return NodeContext(
            builder=self.builder, node=node,
            inputs=[self._name(entry) for entry in node.inputs],
            in_shapes=[shape_of(self.base, entry) for entry in node.inputs],
            in_other=[shape_of(self.other, entry) for entry in node.inputs],
            out_shapes=[tuple(shape) for shape in self.base[index]],
            out_other=[shape_of(self.other, Entry(index, k)) for k in range(len(self.base[index]))],
            in_dtypes=[np.dtype(self.dtypes[e.node][e.index] or np.float32) for e in node.inputs],
            out_dtypes=[np.dtype(dtype or np.float32) for dtype in self.dtypes[index]],
            constants=[np.asarray(graph.constants[source.name])
                       if source.is_variable and source.name in graph.constants else None
                       for source in sources])
