"""Convolution through cuDNN's graph API (``nvidia-cudnn-frontend``): one graph per node.

CuPy 14 has no cuDNN module, so a plan on the GPU builds, at compile time, one cuDNN graph per
Convolution node (convolution, then the bias when there is one), asks cuDNN's heuristics for
plans, keeps the first that builds, and sizes its workspace. A run is then one ``execute`` with
raw device pointers on a handle bound to the plan's stream: no allocation, no host copy, so the
plan can still be captured as a CUDA graph. Where cuDNN or its frontend is missing, or declines
a graph, the caller falls back to im2col and cuBLAS GEMM (`engine.kernels.conv_bind`).

TF32 tensor-core engines are excluded for float32 unless the device allows TF32, as for GEMMs.
In a bf16 plan (`engine.cuda.bf16`) a convolution converts its input into the plan's staging
buffer and runs on bf16 operands (its weight converted once) with a float32 output.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from engine.cuda.bf16 import Bf16Products

Ints = tuple[int, ...]
Geometry = tuple[Ints, Ints, Ints, Ints]  # kernel, stride, dilate, pad
_DATA_TYPES = {"float32": "FLOAT", "float16": "HALF"}


@cache
def _import_cudnn() -> tuple[Any, str | None]:
    """(the cudnn frontend module or None, why it cannot be used or None); probed once."""
    try:
        cudnn = importlib.import_module("cudnn")
    except ImportError as error:
        return None, f"nvidia-cudnn-frontend is not installed ({error})"
    try:
        cudnn.backend_version()
    except Exception as error:  # libcudnn missing or unloadable: the frontend raises its own
        return None, f"the cuDNN library cannot be loaded: {type(error).__name__}: {error}"
    return cudnn, None


def unavailable_reason() -> str | None:
    """Why convolutions cannot go through cuDNN here, or None when they can."""
    return _import_cudnn()[1]


def element_strides(array: Any) -> list[int]:
    """``array``'s strides in elements (cuDNN's unit; numpy and CuPy count bytes)."""
    return [stride // array.itemsize for stride in array.strides]


def describe(cudnn: Any, data: Any, weight: Any, bias: Any, out: Any, geometry: Geometry,
             tf32: bool, handle: Any = None,
             bf16_operands: bool = False) -> tuple[Any, dict[str, Any]]:
    """The cuDNN graph computing ``out = conv(data, weight) + bias``, and its tensors by role.

    With ``bf16_operands`` ``data`` and ``weight`` are ``uint16`` arrays of bf16 bit patterns
    (`engine.cuda.bf16`) and ``out`` and ``bias`` are float32. Pure description: nothing here
    needs a GPU, so shapes can be checked on any machine.

    Raises:
        ValueError: a dtype cuDNN is not asked to handle here, or an output shape that
            disagrees with ``out`` (a bug in the geometry, not the user's input).
    """
    name = np.dtype(out.dtype).name
    if bf16_operands:
        if name != "float32" or data.dtype != np.uint16 or weight.dtype != np.uint16:
            raise ValueError(f"a bf16 cuDNN convolution takes uint16 bf16 bits to float32; got "
                             f"data {data.dtype}, weight {weight.dtype}, output {out.dtype}")
    elif name not in _DATA_TYPES or data.dtype != out.dtype or weight.dtype != out.dtype:
        raise ValueError(f"cuDNN convolution is used for {', '.join(_DATA_TYPES)} only; "
                         f"got data {data.dtype}, weight {weight.dtype}, output {out.dtype}")
    io_type = getattr(cudnn.data_type, _DATA_TYPES[name])
    operand_type = cudnn.data_type.BFLOAT16 if bf16_operands else io_type
    compute = cudnn.data_type.FLOAT
    graph = cudnn.pygraph(io_data_type=operand_type, intermediate_data_type=compute,
                          compute_data_type=compute, handle=handle)
    kernel, stride, dilate, pad = geometry
    tensors = {
        "data": graph.tensor(name="data", dim=list(data.shape), stride=element_strides(data),
                             data_type=operand_type),
        "weight": graph.tensor(name="weight", dim=list(weight.shape),
                               stride=element_strides(weight), data_type=operand_type),
    }
    result = graph.conv_fprop(image=tensors["data"], weight=tensors["weight"], padding=list(pad),
                              stride=list(stride), dilation=list(dilate), compute_data_type=compute,
                              name="convolution")
    if list(result.get_dim()) != list(out.shape):
        raise ValueError(f"cuDNN infers output {list(result.get_dim())}; the plan has "
                         f"{list(out.shape)}")
    if bias is not None:
        shape = [1, out.shape[1]] + [1] * (out.ndim - 2)
        tensors["bias"] = graph.tensor(name="bias", dim=shape,
                                       stride=[out.shape[1]] + [1] * (out.ndim - 1),
                                       data_type=io_type)
        result = graph.bias(name="add_bias", input=result, bias=tensors["bias"])
    result.set_output(True).set_data_type(io_type).set_dim(list(out.shape))
    result.set_stride(element_strides(out))
    tensors["out"] = result
    if name == "float32" and not tf32 and not bf16_operands:
        graph.deselect_numeric_notes([cudnn.numerical_note.TENSOR_CORE])
    return graph, tensors


def supports(data: Any, weight: Any, out: Any, geometry: Geometry) -> bool:
    """Whether a convolution is one this module hands to cuDNN (2-D or 3-D, float32/16)."""
    return (out.ndim in (4, 5) and np.dtype(out.dtype).name in _DATA_TYPES
            and data.dtype == weight.dtype == out.dtype and len(geometry[0]) == out.ndim - 2)


@dataclass
class CudnnConvolutions:
    """A plan's cuDNN context: one handle on the plan's stream, the graphs it built, and why
    any convolution was left to the GEMM fallback."""

    stream_pointer: int
    tf32: bool
    handle: Any = None
    built: int = 0
    declined: list[str] = field(default_factory=list)

    def bind(self, xp: Any, data: Any, weight: Any, bias: Any, out: Any,
             geometry: Geometry) -> list[Callable[[], Any]] | None:
        """A call running the convolution through cuDNN, or None when cuDNN declines it."""
        cudnn, reason = _import_cudnn()
        if reason or not supports(data, weight, out, geometry):
            return None
        steps: list[Callable[[], Any]] = []
        products = xp if isinstance(xp, Bf16Products) else None
        if products is not None and out.dtype == np.float32:
            if not products.is_constant(weight):  # converted once: it must never change
                return None  # the GEMM path converts such a weight on every run
            data, convert = products.staged(data)
            weight = products.constant_bits(weight)
            steps.append(convert)
        else:
            products = None
        arrays = {"data": data, "weight": weight, "bias": bias, "out": out}
        try:
            graph, tensors = describe(cudnn, data, weight, bias, out, geometry, self.tf32,
                                      self._handle(cudnn), bf16_operands=products is not None)
            graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            scratch = xp.empty(max(1, graph.get_workspace_size()), np.uint8)
            pointers = {tensors[role]: int(arrays[role].data.ptr) for role in tensors}
            call = _Execute(graph, pointers, scratch, self.handle)
            # One trial launch while the plan compiles, so that a graph cuDNN cannot run falls
            # back here rather than failing a request. It only writes ``out`` (and a bf16
            # input's staging), which no value occupies before the plan's first run.
            for step in (*steps, call):
                step()
        except Exception as error:  # not supported, or a plan that fails to build: use GEMM
            self.declined.append(f"{list(data.shape)}x{list(weight.shape)}: "
                                 f"{type(error).__name__}: {error}")
            return None
        self.built += 1
        return [*steps, call]

    def _handle(self, cudnn: Any) -> Any:
        if self.handle is None:
            self.handle = cudnn.create_handle()
            cudnn.set_stream(self.handle, self.stream_pointer)
        return self.handle

    def stats(self) -> dict[str, Any]:
        """Convolutions built as cuDNN graphs, and those left to GEMM with the reason."""
        return {"cudnn_convolutions": self.built, "cudnn_declined": list(self.declined)}


@dataclass(frozen=True)
class _Execute:
    """One graph launch with pointers fixed at compile time (the workspace is held here)."""

    graph: Any
    pointers: dict[Any, int]
    scratch: Any
    handle: Any

    def __call__(self) -> None:
        self.graph.execute(self.pointers, int(self.scratch.data.ptr), handle=self.handle)


__all__ = ["CudnnConvolutions", "describe", "element_strides", "supports",
           "unavailable_reason"]
