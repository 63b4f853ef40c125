"""Run a `_fused_elementwise` node on the GPU: the head op, then one generated kernel.

Kernels are cached by their source key (the chain's expressions and the dtypes), so every plan
and model with the same chain shares one compiled kernel.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from engine.cuda.codegen import FusedSource, fused_source
from engine.graph.ir import Node
from engine.ops.fused import FUSED_ELEMENTWISE

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


def split_inputs(node: Node, args: list[Any]) -> tuple[list[Any], list[Any]]:
    """(the head op's inputs, the steps' extra operands in chain order)."""
    head_count = node.params.head.arity
    return list(args[:head_count]), list(args[head_count:])


def bind_fused(node: Node, params: Any, args: list[Any], out: Any, cupy: Any,
               head_calls: list[Callable[[], Any]]) -> list[Callable[[], Any]]:
    """Calls running the fused node into ``out``: the head op as the plan bound it (a cuDNN or
    GEMM convolution, say), then one generated kernel for every step of the chain."""
    assert node.op == FUSED_ELEMENTWISE.name
    _, extras = split_inputs(node, args)
    source = fused_source(params.steps, out.dtype, [extra.dtype for extra in extras])
    kernel = cached_kernel(source, cupy)
    return [*head_calls, partial(kernel, *extras, out)]
