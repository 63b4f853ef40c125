"""A strict numpy stand-in for the slice of CuPy the GPU path uses, to run its code on the CPU.

Strict where the real CuPy is: only names CuPy 14.2 has (``cupy_names.txt``, checked against
the wheel by `test_cupy_wheel`); no ``__array_interface__`` and only CuPy's three ``flags``;
host numpy arrays refused as arguments (CuPy raises ``TypeError``); elements, reductions and
``linalg`` results are device arrays, never numpy values; ``matmul`` takes ``out`` only by
keyword; ``ElementwiseKernel`` parses its parameters with CuPy's grammar. Streams can "capture":
while one does, a copy between host and device (``int(x)`` and ``x.item()`` included) or a
device-wide synchronisation raises, as CUDA refuses them inside stream capture. Kernels
execute with numpy; the generated fused source runs through `test_codegen.run_generated`. It
checks the GPU path's Python, not CUDA.
"""

from __future__ import annotations

import contextlib
import functools
import keyword
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from engine.cuda.codegen import FusedSource

CUPY_NAMES = frozenset(Path(__file__).with_name("cupy_names.txt").read_text().split())
# ``cupy.linalg``'s public functions (CuPy 14.2); like every CuPy function they return device
# arrays, so numpy's must not leak out of the stand-in as host arrays.
LINALG_NAMES = frozenset((
    "cholesky", "det", "eig", "eigh", "eigvals", "eigvalsh", "inv", "lstsq", "matrix_power",
    "matrix_rank", "norm", "pinv", "qr", "slogdet", "solve", "svd", "tensorinv", "tensorsolve"))
_UPLOADS = frozenset({"asarray", "array", "asanyarray"})


class CaptureError(RuntimeError):
    """What CUDA reports for an operation that stream capture does not allow."""


class _Capture:
    """Whether a stream is capturing (or a captured graph replaying), process-wide."""

    active = False
    captures = 0

    @classmethod
    def refuse(cls, what: str) -> None:
        if cls.active:
            raise CaptureError(f"cudaErrorStreamCaptureUnsupported: {what} during stream capture")


class _Flags:
    """CuPy's ``flags``: no ``writeable``, no ``aligned``."""

    def __init__(self, array: np.ndarray) -> None:
        base = np.ndarray.flags.__get__(array)
        self.c_contiguous = base.c_contiguous
        self.f_contiguous = base.f_contiguous
        self.owndata = base.owndata


class FakeArray(np.ndarray):
    """A numpy array that speaks CuPy's transfer methods and hides what CuPy lacks."""

    @property
    def __array_interface__(self) -> Any:
        raise AttributeError("'cupy.ndarray' object has no attribute '__array_interface__'")

    @property
    def flags(self) -> _Flags:  # type: ignore[override]
        return _Flags(self)

    @property
    def data(self) -> Any:  # type: ignore[override]
        address = np.ndarray.__array_interface__.__get__(self)["data"][0]
        return types.SimpleNamespace(ptr=address)

    def set(self, host: np.ndarray, stream: Any = None) -> None:
        _Capture.refuse("a host-to-device copy")
        np.copyto(_plain(self), host)

    def get(self, stream: Any = None, out: np.ndarray | None = None) -> np.ndarray:
        _Capture.refuse("a device-to-host copy")
        if out is None:
            return np.array(_plain(self))
        np.copyto(out, _plain(self))
        return out

    # CuPy never gives numpy scalars: an element, or a full reduction, is a 0-d device array.
    def __getitem__(self, key: Any) -> Any:
        return _wrap(np.ndarray.__getitem__(self, key))

    def __array_wrap__(self, array: np.ndarray, context: Any = None,
                       return_scalar: bool = False) -> Any:
        return array.view(FakeArray)

    # A device value read as a Python number (``int(rois[0])``, ``if mask.any():``) is a
    # device-to-host copy in CuPy too, however small.
    def __int__(self) -> int:
        _Capture.refuse("a device-to-host copy (int())")
        return np.ndarray.__int__(self)

    def __float__(self) -> float:
        _Capture.refuse("a device-to-host copy (float())")
        return np.ndarray.__float__(self)

    def __bool__(self) -> bool:
        _Capture.refuse("a device-to-host copy (bool())")
        return np.ndarray.__bool__(self)

    def item(self, *args: Any) -> Any:
        _Capture.refuse("a device-to-host copy (item())")
        return np.ndarray.item(self, *args)

    def tolist(self) -> Any:
        _Capture.refuse("a device-to-host copy (tolist())")
        return np.ndarray.tolist(self)


def _plain(value: Any) -> Any:
    """``value`` with every FakeArray (also inside lists and tuples) as a plain numpy view."""
    if isinstance(value, FakeArray):
        return value.view(np.ndarray)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item) for item in value)
    return value


def _wrap(value: Any) -> Any:
    """numpy results as FakeArrays (CuPy returns 0-d arrays, not numpy scalars)."""
    if isinstance(value, np.ndarray):
        return value.view(FakeArray)
    if isinstance(value, np.generic):
        return np.asarray(value).view(FakeArray)
    if isinstance(value, tuple):  # numpy's named results (slogdet's) are plain tuples in CuPy
        return tuple(_wrap(item) for item in value)
    if isinstance(value, list):
        return [_wrap(item) for item in value]
    return value


def _refuse_host_arrays(name: str, values: Any) -> None:
    for value in values:
        if isinstance(value, (list, tuple)):
            _refuse_host_arrays(name, value)
        elif isinstance(value, np.ndarray) and not isinstance(value, FakeArray):
            raise TypeError(f"cupy.{name}: Unsupported type <class 'numpy.ndarray'> "
                            "(a host array where CuPy needs a device array)")


def _device_function(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` taking and giving device arrays only, as CuPy's does."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        if name in _UPLOADS:
            if not all(isinstance(arg, FakeArray) for arg in args[:1]):
                _Capture.refuse("a host-to-device copy")
        else:
            _refuse_host_arrays(name, args)
            _refuse_host_arrays(name, kwargs.values())
        return _wrap(function(*_plain(args), **{k: _plain(v) for k, v in kwargs.items()}))

    return call


def _matmul(x1: Any, x2: Any, /, *, out: Any = None, **kwargs: Any) -> Any:
    """CuPy's matmul is a gufunc whose ``out`` is keyword-only."""
    _refuse_cublas_in_capture(x1, x2)
    return _device_function("matmul", np.matmul)(x1, x2, out=out, **kwargs)


# CuPy's products that call cuBLAS for floating-point operands.
_CUBLAS_FUNCTIONS = frozenset({"dot", "tensordot", "einsum", "inner", "outer", "vdot", "kron"})


def _refuse_cublas_in_capture(*arrays: Any) -> None:
    """CuPy's ``cublas.setStream`` raises while the stream captures (integers use no cuBLAS)."""
    if _Capture.active and any(getattr(a, "dtype", np.dtype(int)).kind in "fc" for a in arrays):
        raise NotImplementedError(
            "calling cuBLAS API during stream capture is currently unsupported")


class FakeCublas:
    """cuBLAS's calls `engine.cuda.blas` makes, on raw addresses of FakeArray memory.

    Reads and writes memory exactly where the pointers, leading dimensions and batch strides
    say (column-major, as cuBLAS does), so a wrong layout computes a wrong product here too.
    """

    _DTYPES = {0: np.float32, 1: np.float64, 2: np.float16}
    # (A and B type, C type, compute type) cublasGemmEx accepts, of those with numpy dtypes
    # (cuBLAS's table of GemmEx types): float32 compute, TF32 or not, for half and float32
    # operands, float64 compute for float64. Anything else is CUBLAS_STATUS_NOT_SUPPORTED.
    SUPPORTED = frozenset({(2, 2, 68), (2, 0, 68), (0, 0, 68), (2, 2, 77), (2, 0, 77),
                           (0, 0, 77), (1, 1, 70), (14, 14, 68), (14, 0, 68)})
    BF16 = 14  # CUDA_R_16BF, read from uint16 bit patterns

    def __init__(self) -> None:
        self.gemms = 0
        self.streams: dict[int, Any] = {}
        self.types: list[tuple[int, int, int, int]] = []  # (A, B, C, compute) per call

    def cublasCreate_v2(self, handle: Any) -> int:
        handle._obj.value = 1000 + len(self.streams)
        self.streams[handle._obj.value] = None
        return 0

    def cublasSetStream_v2(self, handle: Any, stream: Any) -> int:
        self.streams[handle.value] = _value(stream)
        return 0

    def cublasSetWorkspace_v2(self, handle: Any, pointer: Any, size: Any) -> int:
        return 0 if _value(pointer) and _value(size) > 0 else 7  # CUBLAS_STATUS_INVALID_VALUE

    def cublasGemmStridedBatchedEx(self, handle: Any, transa: int, transb: int, m: int, n: int,
                                   k: int, alpha: Any, a: Any, a_type: int, lda: int,
                                   stride_a: Any, b: Any, b_type: int, ldb: int, stride_b: Any,
                                   beta: Any, c: Any, c_type: int, ldc: int, stride_c: Any,
                                   batch: int, compute: int, algo: int) -> int:
        self.types.append((a_type, b_type, c_type, compute))
        if a_type != b_type or (a_type, c_type, compute) not in self.SUPPORTED:
            return 15  # CUBLAS_STATUS_NOT_SUPPORTED
        dtype = np.dtype(self._DTYPES[c_type])
        operand = np.dtype(np.uint16) if a_type == self.BF16 else np.dtype(self._DTYPES[a_type])
        rows_a, cols_a = (m, k) if transa == 0 else (k, m)
        rows_b, cols_b = (k, n) if transb == 0 else (n, k)
        op_a = _column_major(a, operand, rows_a, cols_a, lda, _value(stride_a), batch)
        op_b = _column_major(b, operand, rows_b, cols_b, ldb, _value(stride_b), batch)
        if a_type == self.BF16:
            from engine.kernels.bf16 import widen

            op_a, op_b = widen(op_a), widen(op_b)
        out = _column_major(c, dtype, m, n, ldc, _value(stride_c), batch)
        if transa:
            op_a = op_a.transpose(0, 2, 1)
        if transb:
            op_b = op_b.transpose(0, 2, 1)
        product = np.matmul(op_a.astype(np.float64), op_b.astype(np.float64))
        beta_value = _value(beta)  # cuBLAS never reads C when beta is 0 (it may hold NaN)
        out[...] = _value(alpha) * product + (beta_value * out if beta_value else 0)
        self.gemms += 1
        return 0


def _value(argument: Any) -> Any:
    """A ctypes argument (value, pointer object or ``byref``) as a Python number."""
    argument = getattr(argument, "_obj", argument)
    return getattr(argument, "value", argument)


def _column_major(pointer: Any, dtype: np.dtype, rows: int, cols: int, ld: int, stride: int,
                  batch: int) -> np.ndarray:
    """The (batch, rows, cols) column-major matrices at ``pointer``, as a writable view."""
    import ctypes

    span = ((batch - 1) * stride + (cols - 1) * ld + rows) * dtype.itemsize
    memory = (ctypes.c_char * span).from_address(_value(pointer))
    flat = np.frombuffer(memory, dtype)
    return np.lib.stride_tricks.as_strided(
        flat, (batch, rows, cols), (stride * dtype.itemsize, dtype.itemsize,
                                    ld * dtype.itemsize))


class _Ufunc:
    """A numpy ufunc behind CuPy's strictness (its methods too)."""

    def __init__(self, ufunc: np.ufunc) -> None:
        self._ufunc = ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _device_function(self.__name__, self._ufunc)(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return _device_function(f"{self.__name__}.{name}", getattr(self._ufunc, name))


class ElementwiseKernel:
    """CuPy's parameter grammar and argument checks; runs the generated body with numpy."""

    launches = 0

    def __init__(self, in_params: str, out_params: str, operation: str, name: str) -> None:
        self.in_params = parse_params(in_params)
        self.out_params = parse_params(out_params)
        names = [param[2] for param in self.in_params + self.out_params]
        if len(set(names)) != len(names):
            raise ValueError(f"Parameter names must be unique: {names}")
        self.source = FusedSource(name, in_params, out_params, operation, ())

    def __call__(self, *args: Any) -> Any:
        from tests.engine.gpu.test_codegen import run_generated

        expected = len(self.in_params) + len(self.out_params)
        if len(args) != expected:
            raise TypeError(f"Wrong number of arguments for {self.source.name!r}: "
                            f"{len(args)} given, {expected} expected")
        _check_kernel_arguments(self.in_params + self.out_params, args)
        *extras, out = args
        ElementwiseKernel.launches += 1
        if self.source.name in HANDWRITTEN_KERNELS:  # not a fused chain: its NumPy twin
            out[...] = HANDWRITTEN_KERNELS[self.source.name](self.source.operation,
                                                             *[_plain(e) for e in extras])
            return out
        with np.errstate(all="ignore"):
            out[...] = run_generated(self.source, _plain(out), [_plain(e) for e in extras])
        return out


def parse_params(text: str) -> tuple[tuple[bool, str, str], ...]:
    """(raw, type, name) per parameter, by the rules of CuPy's ``ParameterInfo``."""
    if not text.strip():
        return ()
    params = []
    for param in text.strip().split(","):
        words = param.split()
        if len(words) < 2:
            raise SyntaxError(f"Syntax error: {param}")
        *keywords, ctype, name = words
        if len(ctype) != 1:
            try:
                dtype = np.dtype(ctype)
            except TypeError as error:
                raise TypeError(f"data type {ctype!r} not understood") from error
            if dtype.name != ctype:
                raise ValueError(f"Wrong type {ctype}")
        if not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"Invalid parameter name {name!r}")
        for word in keywords:
            if word not in ("raw", "_non_const"):
                raise SyntaxError(f'Unknown keyword "{word}"')
        params.append(("raw" in keywords, ctype, name))
    return tuple(params)


def _float_to_bf16(operation: str, source: np.ndarray) -> np.ndarray:
    from engine.cuda.bf16 import TO_BF16
    from engine.kernels.bf16 import round_to_bf16

    assert operation == TO_BF16, "the conversion's source changed: update its NumPy twin"
    return round_to_bf16(source)


# Kernels the engine writes by hand, by name: what each computes, in NumPy (their C source is
# compiled for real by `test_cupy_wheel`).
HANDWRITTEN_KERNELS: dict[str, Callable[..., np.ndarray]] = {
    "hybridserve_float_to_bf16": _float_to_bf16}


def _check_kernel_arguments(params: tuple, args: tuple) -> None:
    placeholders: dict[str, np.dtype] = {}
    for (_, ctype, name), arg in zip(params, args):
        if not isinstance(arg, FakeArray):
            raise TypeError(f"argument {name!r}: Unsupported type {type(arg)}")
        if len(ctype) == 1:
            if placeholders.setdefault(ctype, arg.dtype) != arg.dtype:
                raise TypeError(f"Type is mismatched. {name!r} {ctype} {arg.dtype}")
        elif np.dtype(ctype) != arg.dtype:
            raise TypeError(f"argument {name!r} is {arg.dtype}; the kernel declares {ctype}")


class _Device:
    def __init__(self, index: int = 0) -> None:
        self.id = index

    def __enter__(self) -> _Device:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def synchronize(self) -> None:
        _Capture.refuse("cudaDeviceSynchronize")


class _Graph:
    """A captured graph: replaying runs what was captured, still under capture's rules (and
    with its stream saying it captures, so code that asks takes the path it recorded)."""

    def __init__(self, replay: Callable[[], None] | None) -> None:
        self._replay = replay

    def launch(self, stream: Any = None) -> None:
        if self._replay is None:
            raise RuntimeError("this fake graph was captured without a replay")
        _Capture.active = True
        if stream is not None:  # current and capturing, as when the steps were recorded
            stream.capturing = True
            _Stream.current().append(stream)
        try:
            self._replay()
        finally:
            _Capture.active = False
            if stream is not None:
                stream.capturing = False
                _Stream.current().pop()


class _Stream:
    """A stream whose capture only sets the capture flag (see `capture_with_replay`)."""

    replay: Callable[[], None] | None = None
    _threads = threading.local()  # each thread's stack of current streams, as in CuPy

    @classmethod
    def current(cls) -> list[_Stream]:
        stack = getattr(cls._threads, "stack", None)
        if stack is None:
            stack = cls._threads.stack = []
        return stack

    def __init__(self, null: bool = False, non_blocking: bool = False) -> None:
        self.ptr = id(self)
        self.capturing = False

    def __enter__(self) -> _Stream:
        _Stream.current().append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _Stream.current().pop()

    def synchronize(self) -> None:
        if self.capturing:
            _Capture.refuse("cudaStreamSynchronize on the capturing stream")

    def begin_capture(self, mode: Any = None) -> None:
        _Capture.active = self.capturing = True

    def end_capture(self) -> _Graph:
        _Capture.active = self.capturing = False
        _Capture.captures += 1
        return _Graph(self.replay)

    def is_capturing(self) -> bool:
        return self.capturing


class _Pool:
    def malloc(self, size: int) -> Any:
        memory = np.empty(size, np.uint8)  # kept by the pointer, like CuPy's MemoryPointer
        return types.SimpleNamespace(ptr=memory.ctypes.data, size=size, memory=memory)

    def total_bytes(self) -> int:
        return 0

    def used_bytes(self) -> int:
        return 0


# Start address -> pinned host array, while its owner keeps it alive.
_PINNED: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()


def _empty_pinned(shape: Any, dtype: Any = float) -> np.ndarray:
    array = np.empty(shape, dtype)
    _PINNED[array.ctypes.data] = array
    return array


def _memcpy_async(dst: int, src: int, size: int, kind: int, stream: int) -> None:
    """``cudaMemcpyAsync``: legal in capture only from and to pinned host memory, as in CUDA."""
    import ctypes

    host = src if kind == 1 else dst
    if host not in _PINNED:
        _Capture.refuse("cudaMemcpyAsync with pageable host memory")
    ctypes.memmove(dst, src, size)


@contextlib.contextmanager
def _using_allocator(allocator: Any = None) -> Iterator[None]:
    yield


def _cuda_namespace() -> types.SimpleNamespace:
    null = _Stream(null=True)
    return types.SimpleNamespace(
        Device=_Device, Stream=_Stream, MemoryPool=_Pool, using_allocator=_using_allocator,
        get_device_id=lambda: 0,
        get_current_stream=lambda: (_Stream.current() or [null])[-1],
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, streamCaptureModeRelaxed=2,
                                      memcpyHostToDevice=1, memcpyDeviceToHost=2,
                                      memcpyAsync=_memcpy_async))


def _linalg_attribute(name: str) -> Any:
    if name not in LINALG_NAMES:
        raise AttributeError(f"module 'cupy.linalg' has no attribute {name!r}")
    return _device_function(f"linalg.{name}", getattr(np.linalg, name))


def _attribute(name: str) -> Any:
    if name not in CUPY_NAMES:
        raise AttributeError(f"module 'cupy' has no attribute {name!r}")
    value = getattr(np, name)
    if isinstance(value, np.ufunc):
        return _Ufunc(value)
    if callable(value) and not isinstance(value, type):
        function = _device_function(name, value)
        if name not in _CUBLAS_FUNCTIONS:
            return function

        @functools.wraps(function)
        def product(*args: Any, **kwargs: Any) -> Any:
            _refuse_cublas_in_capture(*args)
            return function(*args, **kwargs)

        return product
    return value


def _as_strided(array: Any, shape: Any = None, strides: Any = None) -> Any:
    _refuse_host_arrays("lib.stride_tricks.as_strided", (array,))
    view = np.lib.stride_tricks.as_strided(_plain(array), shape=shape, strides=strides)
    return view.view(FakeArray)


def make() -> tuple[types.ModuleType, types.ModuleType]:
    """(fake cupy, fake cupyx)."""
    cupy = types.ModuleType("fake_cupy")
    cupy.__getattr__ = _attribute  # type: ignore[attr-defined]
    cupy.matmul = _matmul
    cupy.ElementwiseKernel = ElementwiseKernel
    cupy.linalg = types.ModuleType("fake_cupy.linalg")
    cupy.linalg.__getattr__ = _linalg_attribute  # type: ignore[attr-defined]
    cupy.ndarray = FakeArray
    cupy.cuda = _cuda_namespace()
    cupy.get_default_memory_pool = _Pool
    cupy.lib = types.SimpleNamespace(
        stride_tricks=types.SimpleNamespace(as_strided=_as_strided))
    cupy.random = types.SimpleNamespace(
        random_sample=_device_function("random.random_sample", np.random.random_sample))
    cupy.fft = types.SimpleNamespace(fft=_device_function("fft.fft", np.fft.fft),
                                     ifft=_device_function("fft.ifft", np.fft.ifft))
    cupyx = types.ModuleType("fake_cupyx")
    cupyx.empty_pinned = _empty_pinned
    return cupy, cupyx


def capture_with_replay(capture: Callable[..., Any]) -> Callable[..., Any]:
    """``engine.cuda.graphs.capture`` whose graph replays the captured steps under capture's
    rules (the fake stream records no kernels, so replay re-runs the steps)."""

    def capture_steps(run_steps: Callable[[], None], stream: Any, cupy: Any) -> Any:
        stream.replay = run_steps  # per stream: two threads may capture two plans at once
        try:
            return capture(run_steps, stream, cupy)
        finally:
            stream.replay = None

    return capture_steps


def install(monkeypatch: Any) -> types.ModuleType:
    """Make the engine see the fake CuPy (and its capture) for one test; returns fake cupy."""
    import sys

    import engine.cuda.executor as executor_module
    import engine.device as device_module
    from engine.cuda import blas, fused, graphs

    cupy, cupyx = make()
    monkeypatch.setattr(device_module, "_import_cupy", lambda: (cupy, None))
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    monkeypatch.setattr(fused, "_KERNELS", {})
    monkeypatch.setattr(executor_module, "capture", capture_with_replay(graphs.capture))
    monkeypatch.setattr(blas, "_libraries", {id(cupy): FakeCublas()})
    monkeypatch.setattr(blas, "_handles", blas._Handles())
    return cupy
