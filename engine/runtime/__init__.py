"""Running graphs: the reference interpreter, `Model` and `load_model`."""

from engine.runtime.loader import load_model
from engine.runtime.model import Model, TensorSpec

__all__ = ["Model", "TensorSpec", "load_model"]
