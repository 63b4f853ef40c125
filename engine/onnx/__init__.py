"""Export MXNet models to ONNX without MXNet (needs the optional ``onnx`` package).

Importing this package registers every converter; `export` writes a file, `to_onnx` returns
the ``ModelProto``.
"""

from __future__ import annotations

from engine.errors import OnnxExportError
from engine.onnx import (  # noqa: F401
    convert_attention,
    convert_boxes,
    convert_detection,
    convert_dynamic,
    convert_extra,
    convert_heads,
    convert_linalg,
    convert_math,
    convert_mod,
    convert_nn,
    convert_proposal,
    convert_rnn,
    convert_tensor,
    convert_vision,
)
from engine.onnx.context import CONVERTERS
from engine.onnx.export import DEFAULT_OPSET, export, to_onnx


def supported_ops() -> list[str]:
    """Canonical names of every MXNet op with an ONNX mapping."""
    return sorted(CONVERTERS)


__all__ = ["DEFAULT_OPSET", "OnnxExportError", "export", "supported_ops", "to_onnx"]
