"""Matrix products on the GPU through cuBLAS called directly, so that CUDA graphs capture them.

CuPy refuses every cuBLAS call while a stream captures (its ``cublas.setStream`` raises
``NotImplementedError``), which would leave any plan with a FullyConnected layer, a GEMM
convolution or a batch_dot uncaptured. cuBLAS itself supports capture when the handle has a
workspace the caller set (cuBLAS's "CUDA Graphs support"), so the products here call the
``libcublas`` CuPy already loaded, through ctypes, with one handle per thread and device whose
stream follows CuPy's current stream and whose workspace is set again after every stream change
(``cublasSetStream`` resets it).

`matmul` covers floating-point operands of two or more dimensions (1-D ones as NumPy promotes
them) whose batch axes collapse to one stride each; anything else goes to CuPy's own matmul.
"""

from __future__ import annotations

import ctypes
import math
import threading
from typing import Any

import numpy as np

WORKSPACE_BYTES = 32 << 20  # cuBLAS's recommendation for Hopper

_OP_N, _OP_T = 0, 1
_GEMM_DEFAULT = -1
_DATA_TYPES = {np.dtype(np.float16): 2, np.dtype(np.float32): 0, np.dtype(np.float64): 1}
BF16 = 14  # CUDA_R_16BF: bf16 operands, stored as uint16 bit patterns here
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32, _COMPUTE_64F = 68, 77, 70


class CublasError(RuntimeError):
    """A cuBLAS call returned a status other than success."""


def matmul(cupy: Any, left: Any, right: Any, out: Any = None, operand_type: int | None = None
           ) -> Any:
    """``left @ right`` like ``cupy.matmul``, through a capturable cuBLAS call where it can.

    With ``operand_type=BF16`` the operands are ``uint16`` arrays of bf16 bit patterns
    (`engine.cuda.bf16`) and the result is float32, summed in float32; cuBLAS is the only way
    such a product runs (CuPy has no bf16), so without it this raises.
    """
    library = _library(cupy)
    if operand_type == BF16:
        if library is None or not _supported_bf16(left, right, out):
            raise CublasError(f"a bf16 product needs cuBLAS and uint16 operands with a float32 "
                              f"result; got {left.dtype} @ {right.dtype} -> "
                              f"{None if out is None else out.dtype}, cuBLAS "
                              f"{'missing' if library is None else 'loaded'}")
    elif library is None or not _supported(left, right, out):
        return cupy.matmul(left, right) if out is None else cupy.matmul(left, right, out=out)
    a = left[None, :] if left.ndim == 1 else left
    b = right[:, None] if right.ndim == 1 else right
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    result_shape = (*batch, m, n)
    squeezed = result_shape[:len(batch)] + ((m,) if left.ndim > 1 else ()) + (
        (n,) if right.ndim > 1 else ())
    result_dtype = np.float32 if operand_type == BF16 else left.dtype
    target = out.reshape(result_shape) if out is not None and _writes_directly(
        out, squeezed, result_shape) else cupy.empty(result_shape, result_dtype)
    if target.size:
        if k == 0:
            target.fill(0)
        else:
            _gemm(cupy, library, _operand(cupy, a, batch), _operand(cupy, b, batch), target,
                  math.prod(batch), m, n, k, operand_type)
    result = target.reshape(squeezed)
    if out is None:
        return result
    if not _same_memory(result, out):
        cupy.copyto(out, result)
    return out


def dot(cupy: Any, left: Any, right: Any, out: Any = None) -> Any:
    """``cupy.dot`` with its matrix products routed through `matmul`."""
    if left.ndim == 0 or right.ndim == 0:
        return cupy.dot(left, right) if out is None else cupy.dot(left, right, out=out)
    if right.ndim <= 2:
        return matmul(cupy, left, right, out)
    return tensordot(cupy, left, right, ([left.ndim - 1], [right.ndim - 2]), out)


def tensordot(cupy: Any, left: Any, right: Any, axes: Any = 2, out: Any = None) -> Any:
    """``cupy.tensordot`` as one 2-D `matmul` over transposed, flattened operands."""
    if isinstance(axes, int):
        left_axes = list(range(left.ndim - axes, left.ndim))
        right_axes = list(range(axes))
    else:
        left_axes, right_axes = ([a] if isinstance(a, int) else list(a) for a in axes)
    left_axes = [a % left.ndim for a in left_axes]
    right_axes = [a % right.ndim for a in right_axes]
    left_free = [a for a in range(left.ndim) if a not in left_axes]
    right_free = [a for a in range(right.ndim) if a not in right_axes]
    summed = math.prod(left.shape[a] for a in left_axes)
    rows = cupy.ascontiguousarray(left.transpose(left_free + left_axes)).reshape(-1, summed)
    cols = cupy.ascontiguousarray(right.transpose(right_axes + right_free)).reshape(summed, -1)
    shape = tuple(left.shape[a] for a in left_free) + tuple(right.shape[a] for a in right_free)
    result = matmul(cupy, rows, cols).reshape(shape)
    if out is None:
        return result
    cupy.copyto(out, result)
    return out


def _supported(left: Any, right: Any, out: Any) -> bool:
    dtype = left.dtype
    return (left.ndim >= 1 and right.ndim >= 1 and dtype == right.dtype
            and dtype in _DATA_TYPES and (out is None or out.dtype == dtype)
            and left.shape[-1] == right.shape[-2 if right.ndim > 1 else 0])


def _supported_bf16(left: Any, right: Any, out: Any) -> bool:
    return (left.ndim >= 1 and right.ndim >= 1 and left.dtype == right.dtype == np.uint16
            and (out is None or out.dtype == np.float32)
            and left.shape[-1] == right.shape[-2 if right.ndim > 1 else 0])


def _writes_directly(out: Any, squeezed: tuple, result_shape: tuple) -> bool:
    """Whether ``out`` is the row-major buffer cuBLAS can write the whole result into."""
    return tuple(out.shape) == squeezed and out.flags.c_contiguous and math.prod(
        result_shape) == out.size


def _same_memory(result: Any, out: Any) -> bool:
    return result.data.ptr == out.data.ptr and result.shape == out.shape


class _Operand:
    """One operand as cuBLAS sees it: pointer, transposition, leading dimension, batch stride.

    It holds the array the pointer points into: a contiguous copy made for cuBLAS must outlive
    the call, or the memory pool could hand its block to the next allocation first.
    """

    __slots__ = ("array", "ptr", "op", "ld", "stride")

    def __init__(self, array: Any, op: int, ld: int, stride: int) -> None:
        self.array, self.ptr, self.op, self.ld, self.stride = (
            array, int(array.data.ptr), op, ld, stride)


def _operand(cupy: Any, array: Any, batch: tuple[int, ...]) -> _Operand:
    """How cuBLAS reads ``array`` (…, rows, cols) row-major, copying it only when it must."""
    layout = _layout(array, batch)
    if layout is None:
        array = cupy.ascontiguousarray(cupy.broadcast_to(array, (*batch, *array.shape[-2:])))
        layout = _layout(array, batch)
    assert layout is not None  # a C-contiguous array always has one
    op, ld, stride = layout
    return _Operand(array, op, ld, stride)


def _layout(array: Any, batch: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(op, leading dimension, batch stride) in elements, or None when no stride fits."""
    itemsize = array.itemsize
    if any(s % itemsize for s in array.strides):
        return None
    rows, cols = array.shape[-2:]
    row_stride, col_stride = (s // itemsize for s in array.strides[-2:])
    # cuBLAS is column-major: a row-major matrix is its transpose stored with ld = row stride.
    if col_stride == 1 or cols == 1:
        op, ld = _OP_N, row_stride if rows > 1 else cols
        if ld < max(1, cols):
            return None
    elif row_stride == 1 or rows == 1:
        op, ld = _OP_T, col_stride if cols > 1 else rows
        if ld < max(1, rows):
            return None
    else:
        return None
    stride = _batch_stride(array.shape[:-2], tuple(s // itemsize for s in array.strides[:-2]),
                           batch)
    return None if stride is None else (op, ld, stride)


def _batch_stride(shape: tuple, strides: tuple, batch: tuple) -> int | None:
    """One element stride walking the broadcast batch axes in order, or None if there is none."""
    shape = (1,) * (len(batch) - len(shape)) + tuple(shape)
    strides = (0,) * (len(batch) - len(strides)) + tuple(strides)
    strides = tuple(0 if n == 1 else s for n, s in zip(shape, strides))
    if not any(strides):
        return 0
    if shape != tuple(batch):
        return None
    step = None
    span = 1
    for size, stride in zip(reversed(batch), reversed(strides)):
        if size == 1:
            continue
        if step is None:
            step = stride
        if stride != step * span:
            return None
        span *= size
    return step


def _gemm(cupy: Any, library: Any, a: _Operand, b: _Operand, c: Any, batch: int,
          m: int, n: int, k: int, operand_type: int | None = None) -> None:
    """C (row-major m x n per batch) = A @ B, as cuBLAS's column-major Cᵀ = Bᵀ Aᵀ."""
    handle = _handle(cupy, library)
    result_type = _DATA_TYPES[c.dtype]
    data_type = result_type if operand_type is None else operand_type
    if c.dtype == np.float64:
        compute, scalar = _COMPUTE_64F, ctypes.c_double
    elif operand_type == BF16:  # float32 sums; TF32 is no option for bf16 operands
        compute, scalar = _COMPUTE_32F, ctypes.c_float
    else:
        compute, scalar = _compute_32f(cupy), ctypes.c_float
    alpha, beta = scalar(1.0), scalar(0.0)
    status = library.cublasGemmStridedBatchedEx(
        handle, b.op, a.op, n, m, k, ctypes.byref(alpha),
        ctypes.c_void_p(b.ptr), data_type, b.ld, ctypes.c_longlong(b.stride),
        ctypes.c_void_p(a.ptr), data_type, a.ld, ctypes.c_longlong(a.stride),
        ctypes.byref(beta), ctypes.c_void_p(int(c.data.ptr)), result_type, n,
        ctypes.c_longlong(m * n), batch, compute, _GEMM_DEFAULT)
    _check(status, "cublasGemmStridedBatchedEx")


def _compute_32f(cupy: Any) -> int:
    """TF32 exactly when CuPy's own float32 GEMMs use it (`engine.device` sets that switch)."""
    linalg = getattr(getattr(cupy, "_core", None), "_routines_linalg", None)
    getter = getattr(linalg, "get_compute_type", None)
    if getter is not None and getter(np.dtype(np.float32)) == getattr(
            linalg, "COMPUTE_TYPE_TF32", object()):
        return _COMPUTE_32F_FAST_TF32
    return _COMPUTE_32F


class _Handles(threading.local):
    """This thread's cuBLAS handle per device, with the stream and workspace it was given."""

    def __init__(self) -> None:
        self.by_device: dict[int, list[Any]] = {}


_handles = _Handles()


def _handle(cupy: Any, library: Any) -> ctypes.c_void_p:
    """This thread's handle for the current device, bound to CuPy's current stream."""
    device = cupy.cuda.Device().id
    entry = _handles.by_device.get(device)
    if entry is None:
        handle = ctypes.c_void_p()
        _check(library.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate_v2")
        # From the default pool even inside a capture's private pool: the handle outlives it.
        workspace = cupy.get_default_memory_pool().malloc(WORKSPACE_BYTES)
        entry = _handles.by_device[device] = [handle, None, workspace]
    handle, stream, workspace = entry
    current = cupy.cuda.get_current_stream().ptr
    if current != stream:
        _check(library.cublasSetStream_v2(handle, ctypes.c_void_p(current)), "cublasSetStream_v2")
        _check(library.cublasSetWorkspace_v2(handle, ctypes.c_void_p(int(workspace.ptr)),
                                             ctypes.c_size_t(WORKSPACE_BYTES)),
               "cublasSetWorkspace_v2")
        entry[1] = current
    return handle


def _check(status: int, call: str) -> None:
    if status != 0:
        raise CublasError(f"{call} failed with cuBLAS status {status}")


_libraries: dict[int, Any] = {}


def _library(cupy: Any) -> Any:
    """The ``libcublas`` CuPy uses (or None where there is none to call, as in the CPU tests)."""
    key = id(cupy)
    if key not in _libraries:
        _libraries[key] = _load(cupy)
    return _libraries[key]


def _load(cupy: Any) -> Any:
    try:
        cupy.cuda.device.get_cublas_handle()  # makes CuPy load its libcublas
    except Exception:  # no cuBLAS to share: CuPy's matmul stays in charge
        return None
    for path in _mapped_libraries():
        if path.rsplit("/", 1)[-1].startswith("libcublas.so"):
            return _declare(ctypes.CDLL(path))
    return None


def _mapped_libraries() -> list[str]:
    try:
        with open("/proc/self/maps") as maps:
            return [line.split()[-1] for line in maps if "/" in line]
    except OSError:
        return []


def _declare(library: Any) -> Any:
    library.cublasCreate_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    library.cublasSetStream_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    library.cublasSetWorkspace_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    library.cublasGemmStridedBatchedEx.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
        ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
        ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
        ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return library
