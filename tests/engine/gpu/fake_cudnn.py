"""A numpy stand-in for the slice of the cuDNN frontend `engine.cuda.cudnn_conv` uses.

Graphs are described as the real frontend describes them (the convolution's output dimensions
inferred at once, the bias's only when the graph is validated), ``execute`` takes raw pointers
exactly as the real one does and computes the convolution with numpy on the memory they point
at, so the pointer plumbing, strides and bias of the GPU path are checked on the CPU together
with the fake CuPy (whose arrays live in host memory).
"""

from __future__ import annotations

import ctypes
import itertools
import types
from typing import Any

import numpy as np

from engine.kernels.bf16 import widen

_DTYPES = {"FLOAT": np.float32, "HALF": np.float16, "BFLOAT16": np.uint16}  # bf16 as bits


class cudnnGraphNotSupportedError(RuntimeError):  # noqa: N801 (the frontend's name)
    """What cuDNN raises for a graph no engine supports."""


class Tensor:
    """A graph tensor: name, dimensions and strides in elements, data type."""

    def __init__(self, name: str, dim: list[int], stride: list[int] | None,
                 data_type: str | None) -> None:
        self.name, self.dim, self.stride, self.data_type = name, list(dim), stride, data_type
        self.output = False

    def get_dim(self) -> list[int]:
        return list(self.dim)

    def get_stride(self) -> list[int]:
        return list(self.stride or [])

    def set_output(self, output: bool) -> Tensor:
        self.output = output
        return self

    def set_data_type(self, data_type: str) -> Tensor:
        self.data_type = data_type
        return self

    def set_dim(self, dim: list[int]) -> Tensor:
        self.dim = list(dim)
        return self

    def set_stride(self, stride: list[int]) -> Tensor:
        self.stride = list(stride)
        return self


class Graph:
    """``cudnn.pygraph`` for a convolution and an optional bias."""

    fail_build: str | None = None  # a message to raise from `build` (a declined graph)
    fail_execute: str | None = None
    executions = 0

    def __init__(self, io_data_type: str, intermediate_data_type: str, compute_data_type: str,
                 handle: Any = None) -> None:
        self.io_data_type, self.handle = io_data_type, handle
        self.intermediate_data_type, self.compute_data_type = (intermediate_data_type,
                                                               compute_data_type)
        self.conv: dict[str, Any] = {}
        self.bias_tensor: Tensor | None = None
        self.excluded_notes: list[str] = []
        self.built = False

    def tensor(self, name: str, dim: list[int], stride: list[int], data_type: str) -> Tensor:
        return Tensor(name, dim, stride, data_type)

    def conv_fprop(self, image: Tensor, weight: Tensor, padding: list[int], stride: list[int],
                   dilation: list[int], compute_data_type: str, name: str) -> Tensor:
        sizes = [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k, s, d, p in
                 zip(image.dim[2:], weight.dim[2:], stride, dilation, padding)]
        if image.data_type != weight.data_type:
            raise cudnnGraphNotSupportedError(f"image {image.data_type}, weight "
                                              f"{weight.data_type}: one type for both")
        self.conv = {"image": image, "weight": weight, "padding": padding, "stride": stride,
                     "dilation": dilation, "compute_data_type": compute_data_type}
        return Tensor(name, [image.dim[0], weight.dim[0], *sizes], None, None)

    def bias(self, name: str, input: Tensor, bias: Tensor) -> Tensor:  # noqa: A002
        self.bias_tensor = bias
        return Tensor(name, [], None, None)  # inferred by validate(), as in the frontend

    def deselect_numeric_notes(self, notes: list[str]) -> Graph:
        self.excluded_notes += notes
        return self

    def build(self, heuristics: list[str]) -> None:
        if Graph.fail_build:
            raise cudnnGraphNotSupportedError(Graph.fail_build)
        assert heuristics, "the heuristics to rank plans by"
        self.built = True

    def get_workspace_size(self) -> int:
        assert self.built
        return 256

    def execute(self, tensor_dict: dict[Tensor, int], workspace: int,
                handle: Any = None) -> None:
        assert self.built and handle is self.handle and isinstance(workspace, int)
        if Graph.fail_execute:
            raise RuntimeError(Graph.fail_execute)
        Graph.executions += 1
        views = {tensor.name: _view(pointer, tensor) for tensor, pointer in tensor_dict.items()}
        for tensor in tensor_dict:
            if tensor.data_type == "BFLOAT16":  # read-only operands: widened to float32
                views[tensor.name] = widen(views[tensor.name])
        with np.errstate(all="ignore"):  # a GPU raises no floating-point exceptions
            result = _convolve(views["data"], views["weight"], self.conv)
            if "bias" in views:
                result += views["bias"]
            np.copyto(views["add_bias" if "add_bias" in views else "convolution"], result)


def _view(pointer: int, tensor: Tensor) -> np.ndarray:
    """The array ``tensor`` describes, over host memory at ``pointer``."""
    assert isinstance(pointer, int), f"{tensor.name}: a raw pointer, not {type(pointer)}"
    dtype = np.dtype(_DTYPES[tensor.data_type])
    extent = sum((n - 1) * s for n, s in zip(tensor.dim, tensor.stride)) + 1
    memory = (ctypes.c_char * (extent * dtype.itemsize)).from_address(pointer)
    flat = np.frombuffer(memory, dtype=dtype)
    return np.lib.stride_tricks.as_strided(flat, tensor.dim,
                                           [s * dtype.itemsize for s in tensor.stride])


def _convolve(data: np.ndarray, weight: np.ndarray, conv: dict[str, Any]) -> np.ndarray:
    """Direct convolution, the group count inferred from the channels as cuDNN does."""
    pad, stride, dilate = conv["padding"], conv["stride"], conv["dilation"]
    groups = data.shape[1] // weight.shape[1]
    padded = np.pad(data.astype(np.float64), [(0, 0), (0, 0), *((p, p) for p in pad)])
    sizes = [(n - d * (k - 1) - 1) // s + 1 for n, k, s, d in
             zip(padded.shape[2:], weight.shape[2:], stride, dilate)]
    out = np.zeros((data.shape[0], weight.shape[0], *sizes))
    per_group = weight.shape[0] // groups
    for offset in itertools.product(*(range(k) for k in weight.shape[2:])):
        index = tuple(slice(o * d, o * d + s * (n - 1) + 1, s)
                      for o, d, s, n in zip(offset, dilate, stride, sizes))
        window = padded[(slice(None), slice(None), *index)]
        for group in range(groups):
            filters = slice(group * per_group, (group + 1) * per_group)
            channels = slice(group * weight.shape[1], (group + 1) * weight.shape[1])
            taps = weight[(filters, slice(None), *offset)].astype(np.float64)
            out[:, filters] += np.einsum("fc,nc...->nf...", taps, window[:, channels])
    return out


class Handle:
    """A handle bound to a stream (a raw pointer, as in the frontend)."""

    stream: int | None = None


def _set_stream(handle: Handle, stream: int) -> None:
    assert isinstance(stream, int), "cudnn.set_stream takes the stream's raw pointer"
    handle.stream = stream


def make() -> types.ModuleType:
    """A fresh fake ``cudnn`` module."""
    cudnn = types.ModuleType("fake_cudnn")
    cudnn.pygraph = Graph
    cudnn.data_type = types.SimpleNamespace(FLOAT="FLOAT", HALF="HALF", BFLOAT16="BFLOAT16")
    cudnn.numerical_note = types.SimpleNamespace(TENSOR_CORE="TENSOR_CORE")
    cudnn.heur_mode = types.SimpleNamespace(A="A", FALLBACK="FALLBACK")
    cudnn.create_handle = Handle
    cudnn.set_stream = _set_stream
    cudnn.backend_version = lambda: 92800
    cudnn.cudnnGraphNotSupportedError = cudnnGraphNotSupportedError
    return cudnn
