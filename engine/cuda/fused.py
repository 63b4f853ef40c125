"""The GPU half of a fused elementwise node: its chain of steps as one generated kernel.

The op's bind (`engine.ops.internal.fused`) binds the head op as usual and, when its array module is
CuPy, adds the call `bind_chain` makes here.

Kernels are cached by their source key (the chain's expressions and the dtypes), so every plan
and model with the same chain shares one compiled kernel.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from engine.cuda.codegen import FusedSource, fused_source
from engine.ops.internal.fused import FusedStep

_KERNELS: dict[tuple, Any] = {}
_LOCK = threading.Lock()


def cached_kernel(source: FusedSource, cupy: Any) -> Any:
    """The `cupy.ElementwiseKernel` for ``source`` (built once per key; compiled on first use)."""
    kernel = _KERNELS.get(source.key)
    if kernel is None:
        with _LOCK:
            kernel = _KERNELS.get(source.key)
            if kernel is None:
                kernel = cupy.ElementwiseKernel(source.in_params, source.out_params,
                                                source.operation, source.name)
                _KERNELS[source.key] = kernel
    return kernel


def cache_size() -> int:
    """Number of distinct fused kernels built in this process."""
    return len(_KERNELS)


def bind_chain(steps: Sequence[FusedStep], operands: list[Any], out: Any,
               cupy: Any) -> list[Callable[[], Any]]:
    """The call applying a fused node's ``steps`` in place to ``out`` (the head op has already
    written it) as one generated kernel; ``operands`` are the steps' extra inputs in chain
    order."""
    source = fused_source(steps, out.dtype, [operand.dtype for operand in operands])
    kernel = cached_kernel(source, cupy)
    return [partial(kernel, *operands, out)]
