"""``precision="bf16"`` on a GPU: the Convolution and Dense products on bf16 operands.

The same meaning as on the CPU (`engine.runtime.precision`): the operands of the Convolution
and FullyConnected products are rounded to bf16 and the products sum in float32; everything
else, outputs included, stays float32. CuPy has no bf16 dtype, so bf16 values are stored as
``uint16`` bit patterns, made by one generated kernel (`TO_BF16`, round to nearest even, NaN
kept quiet) that needs no CUDA header. The products read them as cuBLAS's ``CUDA_R_16BF`` and
cuDNN's ``BFLOAT16``, with float32 results.

A plan gives the nodes holding those products a `Bf16Products` in place of its array module:
its ``matmul`` (what the Dense op and the GEMM convolution call) converts a parameter once per
model and an activation on every call, then runs a bf16 GEMM (`engine.cuda.blas.matmul`);
the plan's cuDNN context sees it and builds its convolutions on bf16 operands, converting the
input into one staging buffer the plan sizes for its largest convolution input.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from engine.cuda import blas
from engine.graph.ir import Graph, Node

BF16_PRODUCT_OPS = frozenset({"Convolution", "FullyConnected"})
KERNEL_NAME = "hybridserve_float_to_bf16"
# Round to nearest even on the bits: add 0x7fff plus the lowest kept bit, keep the upper half;
# a NaN keeps its upper half with the quiet bit set, so the carry cannot make it infinite.
TO_BF16 = ("const unsigned int bits = __float_as_uint(x);\n"
           "y = (bits & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((bits >> 16) | 0x40u)\n"
           "    : (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);")


def product_op(node: Node) -> str | None:
    """"Convolution" or "FullyConnected" when ``node`` is one, alone or as the head of a fused
    chain, whose product runs in bf16; None otherwise. Grouped (depthwise) convolutions stay
    float32, as on the CPU."""
    if node.is_variable:
        return None
    name, attrs = node.op, node.params
    head = getattr(attrs, "head", None)  # a fused chain's attributes carry its head op
    if head is not None:
        name, attrs = head.op.name, head.attrs
    if name == "Convolution" and attrs.num_group != 1:
        return None
    return name if name in BF16_PRODUCT_OPS else None


def staging_elements(graph: Graph, shapes: list) -> int:
    """The largest input of ``graph``'s bf16 convolutions: the plan's staging buffer's size."""
    largest = 0
    for node in graph.nodes:
        if product_op(node) == "Convolution":
            entry = node.inputs[0]
            largest = max(largest, math.prod(shapes[entry.node][entry.index]))
    return largest


def to_bf16_kernel(cupy: Any) -> Any:
    """The conversion kernel (float32 ``x`` to bf16 bits ``y``; CuPy compiles it once per
    source and device)."""
    return cupy.ElementwiseKernel("float32 x", "uint16 y", TO_BF16, KERNEL_NAME)


class Bf16Products:
    """A plan's array module for its product nodes in bf16: CuPy (capturable products) with
    ``matmul`` on bf16 operands. Everything else is the wrapped module's.

    ``constants`` are the model's parameters on the device (by name): an operand pointing at
    one is converted once and kept in ``derived`` (shared by the model's plans); any other
    operand is converted on every call. ``staging`` elements of bf16 hold a convolution's
    converted input (shared by the plan's convolutions, which run one after another).
    """

    def __init__(self, xp: Any, constants: Mapping[str, Any], derived: dict,
                 staging: int) -> None:
        self.xp = xp
        self._cupy = getattr(xp, "_cupy", xp)  # CuPy itself, which `blas` finds cuBLAS by
        self._constants = constants
        self._derived = derived
        self._pointers: set[int] = set()
        self._staging = xp.empty(max(1, staging), np.uint16)
        self._kernel = to_bf16_kernel(xp)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.xp, name)

    def is_constant(self, array: Any) -> bool:
        """Whether ``array`` starts where one of the model's parameters does (a view of it)."""
        if len(self._pointers) != len(self._constants):
            self._pointers = {int(value.data.ptr) for value in self._constants.values()}
        return int(array.data.ptr) in self._pointers

    def constant_bits(self, array: Any) -> Any:
        """A parameter (or a view of one) as bf16 bits, converted once per model."""
        key = ("bf16 bits", int(array.data.ptr), array.shape, array.strides)
        entry = self._derived.get(key)
        if entry is None:  # (source, converted), as `Workspace.derived` keeps them
            bits = self.xp.empty(array.shape, np.uint16)
            self._kernel(array, bits)
            entry = self._derived[key] = (array, bits)
        return entry[1]

    def staged(self, array: Any) -> tuple[Any, Callable[[], Any]]:
        """The staging buffer viewed as ``array``'s bf16 bits, and the call converting it."""
        view = self._staging[:array.size].reshape(array.shape)
        return view, _Convert(self._kernel, array, view)

    def bits(self, array: Any) -> Any:
        """``array`` as bf16 bits: a parameter's kept conversion, or a fresh one."""
        if self.is_constant(array):
            return self.constant_bits(array)
        bits = self.xp.empty(array.shape, np.uint16)
        self._kernel(array, bits)
        return bits

    def matmul(self, left: Any, right: Any, out: Any = None) -> Any:
        """``left @ right`` with both operands rounded to bf16 and float32 sums, for float32
        operands of two or more dimensions; anything else as the wrapped module does it."""
        if not (left.dtype == right.dtype == np.float32 and left.ndim >= 2 and right.ndim >= 2
                and (out is None or out.dtype == np.float32)):
            return self.xp.matmul(left, right, out=out)
        return blas.matmul(self._cupy, self.bits(left), self.bits(right), out,
                           operand_type=blas.BF16)


class _Convert:
    """One conversion launch into a fixed target (a plan step)."""

    __slots__ = ("kernel", "source", "target")

    def __init__(self, kernel: Any, source: Any, target: Any) -> None:
        self.kernel, self.source, self.target = kernel, source, target

    def __call__(self) -> None:
        self.kernel(self.source, self.target)


__all__ = ["BF16_PRODUCT_OPS", "Bf16Products", "KERNEL_NAME", "TO_BF16", "product_op",
           "staging_elements", "to_bf16_kernel"]
