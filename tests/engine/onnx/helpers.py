"""Running exported ONNX files with ONNX Runtime, for the export tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

# ONNX Runtime's element types for the dtypes these tests feed.
ORT_DTYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64,
              "tensor(float16)": np.float16, "tensor(int32)": np.int32,
              "tensor(int64)": np.int64, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8,
              "tensor(bool)": np.bool_}


def check(path: Path) -> onnx.ModelProto:
    """The model at ``path`` after `onnx.checker` (full check, with shape inference)."""
    onnx.checker.check_model(str(path), full_check=True)
    return onnx.load(str(path))


def run(path: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of the model, feeding each input it declares (cast to its declared type)."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {spec.name: np.asarray(feed[spec.name]).astype(ORT_DTYPES[spec.type])
              for spec in session.get_inputs()}
    return session.run(None, inputs)


def input_dims(model: onnx.ModelProto) -> dict[str, list[Any]]:
    """Each graph input's dims: ints, or the symbolic name."""
    return {value.name: [dim.dim_param or dim.dim_value
                         for dim in value.type.tensor_type.shape.dim]
            for value in model.graph.input}


def one_op_symbol(op: str, attrs: dict[str, str], inputs: list[str],
                  name: str = "node") -> dict[str, Any]:
    """The symbol JSON (as a dict) of one op node reading the named variables."""
    nodes = [{"op": "null", "name": input_name, "inputs": []} for input_name in inputs]
    nodes.append({"op": op, "name": name, "attrs": attrs,
                  "inputs": [[k, 0, 0] for k in range(len(inputs))]})
    return {"nodes": nodes, "arg_nodes": list(range(len(inputs))),
            "node_row_ptr": list(range(len(nodes) + 1)), "heads": [[len(inputs), 0, 0]],
            "attrs": {"mxnet_version": ["int", 10901]}}
