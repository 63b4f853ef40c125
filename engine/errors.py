"""One error hierarchy for the whole engine.

Every message says where (node, input, parameter, byte offset), what was expected and what was
found, so that the service layer can pass it to a client unchanged.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class ModelFormatError(EngineError, ValueError):
    """A symbol JSON or `.params` file (or an in-memory graph) is malformed or inconsistent."""


class UnknownOperatorError(ModelFormatError):
    """A graph names an operator the registry does not have."""


class ParamsFormatError(ModelFormatError):
    """A `.params` file is truncated, mis-tagged or otherwise unreadable."""


class ShapeError(ModelFormatError):
    """Shapes or dtypes do not fit an operator (found during inference of shapes or dtypes)."""


class InputError(EngineError, ValueError):
    """Inputs given to `Model.infer` do not match the model: names, shapes or dtypes."""


class ExecutionError(EngineError, RuntimeError):
    """A kernel failed while running a node; the message names the node and its op."""


class OnnxExportError(EngineError, ValueError):
    """A graph cannot be written as ONNX; the message names the node, its op and why."""
