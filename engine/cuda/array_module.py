"""The array module GPU kernels receive: CuPy, with its matrix products made capturable.

Kernels are written once against ``xp`` (numpy or this). Everything but `matmul`, `dot`,
`tensordot` and `einsum` is CuPy's own object; the first three go through `engine.cuda.blas`,
whose cuBLAS calls a CUDA graph can capture where CuPy's refuse to run during capture, and
`einsum` is CuPy's except while the stream captures (`engine.cuda.einsum` then). It also
carries what ops bind differently on a GPU without importing `engine.cuda` themselves:
`bind_elementwise_chain`, a fused chain's steps as one generated kernel.
"""

from __future__ import annotations

import types
from functools import partial
from typing import Any

from engine.cuda import blas
from engine.cuda.einsum import einsum as capturable_einsum
from engine.cuda.fused import bind_chain


class CapturableCupy(types.ModuleType):
    """``cupy`` with `engine.cuda.blas`'s products; other names are looked up once, then kept."""

    def __init__(self, cupy: Any) -> None:
        super().__init__(getattr(cupy, "__name__", "cupy"))
        self._cupy = cupy
        self.matmul = partial(blas.matmul, cupy)
        self.dot = partial(blas.dot, cupy)
        self.tensordot = partial(blas.tensordot, cupy)
        self.bind_elementwise_chain = partial(bind_chain, cupy=self)

    def einsum(self, subscripts: str, *operands: Any, **options: Any) -> Any:
        """CuPy's einsum, or the cuBLAS-free one while the current stream captures."""
        if self._cupy.cuda.get_current_stream().is_capturing():
            return capturable_einsum(self._cupy, subscripts, *operands)
        return self._cupy.einsum(subscripts, *operands, **options)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._cupy, name)
        setattr(self, name, value)
        return value


_modules: dict[int, CapturableCupy] = {}


def capturable(cupy: Any) -> CapturableCupy:
    """The one `CapturableCupy` over ``cupy`` (one per CuPy module, so ``xp`` stays identical)."""
    module = _modules.get(id(cupy))
    if module is None or module._cupy is not cupy:
        module = _modules[id(cupy)] = CapturableCupy(cupy)
    return module
