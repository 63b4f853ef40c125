"""GPU execution through CuPy: fused-kernel generation, plan execution and CUDA graph replay.

`codegen` is pure Python (tested without a GPU); `fused`, `executor` and `graphs` use CuPy only
when a GPU plan is built.

This package's name is also MXNet's context constructor, ``engine.gpu(0)``. Importing a
submodule binds ``engine.gpu`` to this package, so the package itself is callable and returns
the same `Context` as `engine.context.gpu`: both spellings keep working.
"""

from __future__ import annotations

import sys
import types

from engine.context import Context
from engine.context import gpu as _gpu_context


class _CallablePackage(types.ModuleType):
    def __call__(self, device_id: int = 0) -> Context:
        """GPU number ``device_id`` as a `Context` (MXNet's ``mx.gpu(0)``)."""
        return _gpu_context(device_id)


sys.modules[__name__].__class__ = _CallablePackage
