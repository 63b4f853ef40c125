"""A numpy stand-in for the slice of CuPy the GPU executor uses, to run its code on the CPU.

Arrays are numpy arrays with CuPy's ``set``/``get``; ``ElementwiseKernel`` executes the generated
source with `test_codegen.run_generated`; streams, devices and pinned memory are no-ops. It checks
the GPU path's Python (binding, staging, fused kernels, graph fallback), not CUDA itself.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np

from engine.cuda.codegen import FusedSource


class FakeArray(np.ndarray):
    """A numpy array that also speaks CuPy's host-transfer methods."""

    def set(self, host: np.ndarray, stream: Any = None) -> None:
        np.copyto(self, host)

    def get(self, stream: Any = None, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            return np.array(self)
        np.copyto(out, self)
        return out


class _Block:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.captures = 0

    def __enter__(self) -> _Block:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def malloc(self, size: int) -> None:
        raise MemoryError("the fake pool allocates nothing")

    def begin_capture(self, mode: Any = None) -> None:
        raise RuntimeError("stream capture is not simulated")

    def end_capture(self) -> None:
        return None


class ElementwiseKernel:
    """Runs the generated body with numpy, in place on the output."""

    launches = 0

    def __init__(self, in_params: str, out_params: str, operation: str, name: str) -> None:
        self.source = FusedSource(name, in_params, out_params, operation, ())

    def __call__(self, *args: Any) -> Any:
        from tests.engine.gpu.test_codegen import run_generated

        *extras, out = args
        ElementwiseKernel.launches += 1
        with np.errstate(all="ignore"):
            out[...] = run_generated(self.source, np.asarray(out), [np.asarray(e) for e in extras])
        return out


def _wrap(array: Any) -> FakeArray:
    return np.asarray(array).view(FakeArray)


def make() -> tuple[types.ModuleType, types.ModuleType]:
    """(fake cupy, fake cupyx)."""
    cupy = types.ModuleType("fake_cupy")
    cupy.__getattr__ = lambda name: getattr(np, name)  # type: ignore[attr-defined]
    cupy.empty = lambda shape, dtype=float: _wrap(np.empty(shape, dtype))
    cupy.asarray = lambda value, dtype=None: _wrap(np.array(value, dtype=dtype))
    cupy.ascontiguousarray = lambda value: _wrap(np.ascontiguousarray(value))
    cupy.ElementwiseKernel = ElementwiseKernel
    cupy.cuda = types.SimpleNamespace(
        Device=_Block, Stream=_Block, MemoryPool=_Block, using_allocator=_Block,
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1))
    cupyx = types.ModuleType("fake_cupyx")
    cupyx.empty_pinned = lambda shape, dtype=float: np.empty(shape, dtype)
    return cupy, cupyx
