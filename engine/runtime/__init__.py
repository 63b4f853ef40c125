"""Running graphs: the reference interpreter, `Model` and `load_model`."""

import engine.cuda  # noqa: F401  (registers the GPU backend with engine.device)
from engine.runtime.binding import TensorSpec
from engine.runtime.loader import load_model
from engine.runtime.model import Model

__all__ = ["Model", "TensorSpec", "load_model"]
