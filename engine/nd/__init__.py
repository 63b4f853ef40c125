"""``engine.nd``: MXNet's imperative namespace, with every registry op as a function.

Example::

    from engine import nd
    x = nd.random.normal(shape=(1, 512))
    y = nd.FullyConnected(x, nd.ones((10, 512)), nd.zeros((10,)), num_hidden=10)
    nd.relu(y).asnumpy()

Op functions are generated from the registry (`engine.nd.register`); names registered after
import are resolved on first access.
"""

from __future__ import annotations

from engine.context import Context, cpu, current_context, gpu
from engine.nd import random
from engine.nd.creation import (
    arange,
    array,
    concat,
    empty,
    full,
    ones,
    ones_like,
    stack,
    zeros,
    zeros_like,
)
from engine.nd.io import load, save
from engine.nd.namespace import NP_PREFIXES, NPX_PREFIXES, OpNamespace, fill_module
from engine.nd.ndarray import NDArray
from engine.nd.numpy_api import FUNCTIONS as _NUMPY_FUNCTIONS
from engine.nd.placement import synchronize_all
from engine.nd.register import op_function


def waitall() -> None:
    """Wait for all pending computation: the queued work of every GPU holding NDArrays."""
    synchronize_all()


random_normal = random.normal
random_uniform = random.uniform

_HANDWRITTEN = {"arange", "array", "concat", "empty", "full", "ones", "ones_like", "stack",
                "zeros", "zeros_like", "random", "load", "save", "waitall"}

_make, __getattr__ = fill_module(globals(), "engine.nd", op_function, _HANDWRITTEN)

npx = OpNamespace("engine.nd.npx", NPX_PREFIXES, _make, {"waitall": waitall})
np = OpNamespace("engine.nd.np", NP_PREFIXES, _make, _NUMPY_FUNCTIONS)


__all__ = ["Context", "NDArray", "arange", "array", "concat", "cpu", "current_context", "empty",
           "full", "gpu", "load", "np", "npx", "ones", "ones_like", "random", "random_normal",
           "random_uniform", "save", "stack", "waitall", "zeros", "zeros_like"]
