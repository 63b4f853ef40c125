"""`Device`: where plans run: ``cpu`` (NumPy) or ``gpu`` (CuPy), and ``auto`` to pick one.

A GPU device allocates from CuPy's memory pool, stages host↔device copies through pinned host
buffers, gives each executing plan its own stream, and can replay a plan as a CUDA graph. CuPy is
optional (``pip install .[gpu]``): without it, or without a visible GPU, ``auto`` is the CPU and
``gpu`` fails with a message that says what is missing.

Example:
    >>> device = get_device("auto")
    >>> device.kind
    'cpu'
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from engine.context import Context
from engine.errors import EngineError

DEVICE_NAMES = ("cpu", "gpu", "auto")
# What the GPU backend gives this module when it is imported (`use_gpu_array_module`).
_gpu_backend: dict[str, Callable[[Any], Any]] = {}


def use_gpu_array_module(wrap: Callable[[Any], Any]) -> None:
    """``wrap(cupy)`` is the array module GPU plans compute with: `engine.cuda` registers its
    capturable CuPy here when imported, so that this module never imports it."""
    _gpu_backend["array_module"] = wrap


@cache
def _import_cupy() -> tuple[Any, str | None]:
    """(the cupy module or None, why it cannot be used or None); probed once per process."""
    try:
        cupy = importlib.import_module("cupy")
    except ImportError as error:
        return None, f"CuPy is not installed ({error}); install it with `pip install .[gpu]`"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # CUDA driver missing or broken: CuPy raises its own types
        return None, f"CuPy cannot reach a CUDA driver: {type(error).__name__}: {error}"
    if count < 1:
        return None, "CuPy sees no CUDA device"
    return cupy, None


def gpu_unavailable_reason() -> str | None:
    """Why the GPU cannot be used here, or None when CuPy sees at least one GPU."""
    return _import_cupy()[1]


def gpu_available() -> bool:
    """Whether CuPy is installed and sees at least one CUDA device."""
    return gpu_unavailable_reason() is None


def gpu_count() -> int:
    """Number of CUDA devices CuPy sees (0 without CuPy)."""
    cupy, reason = _import_cupy()
    return 0 if reason else int(cupy.cuda.runtime.getDeviceCount())


@dataclass(frozen=True)
class Device:
    """A place to run plans: ``Device("cpu")`` or ``Device("gpu", 0)``.

    Attributes:
        kind: ``"cpu"`` or ``"gpu"``.
        index: the GPU number (0 for the CPU).
        tf32: allow TF32 tensor-core math in float32 GEMMs (off by default: it changes results
            in the fourth significant digit). CuPy's switch is process-wide.
        cuda_graphs: capture each plan as a CUDA graph after its first runs and replay it.
        cudnn: run convolutions through cuDNN graphs where cuDNN and its frontend are
            installed (otherwise, or when off, im2col and cuBLAS GEMM).
    """

    kind: str
    index: int = 0
    tf32: bool = False
    cuda_graphs: bool = True
    cudnn: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ("cpu", "gpu"):
            raise ValueError(f"device kind must be 'cpu' or 'gpu'; got {self.kind!r}")
        if self.index < 0:
            raise ValueError(f"device index must be >= 0; got {self.index}")

    @property
    def is_gpu(self) -> bool:
        """True for a CUDA device."""
        return self.kind == "gpu"

    @property
    def name(self) -> str:
        """``"cpu"`` or ``"gpu(N)"``."""
        return "cpu" if self.kind == "cpu" else f"gpu({self.index})"

    @property
    def context(self) -> Context:
        """The frontend's `Context` for this device."""
        return Context(self.kind, self.index)

    @property
    def xp(self) -> Any:
        """The array module: numpy, or cupy with capturable matrix products."""
        if not self.is_gpu:
            return np
        wrap = _gpu_backend.get("array_module")
        if wrap is None:
            raise EngineError("the GPU backend is not loaded: import engine.cuda (engine.runtime "
                              "and engine.nd do) before running on a GPU")
        return wrap(_cupy())

    def activate(self) -> contextlib.AbstractContextManager[Any]:
        """A ``with`` block in which this GPU is CuPy's current device (no-op on the CPU)."""
        return _cupy().cuda.Device(self.index) if self.is_gpu else contextlib.nullcontext()

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised array on this device (GPU memory comes from CuPy's pool)."""
        with self.activate():
            return self.xp.empty(shape, dtype)

    def asarray(self, value: Any) -> Any:
        """``value`` (host array, NDArray or device array) as an array on this device."""
        if hasattr(value, "asnumpy"):
            value = value.asnumpy()
        if not self.is_gpu:
            return np.asarray(value) if not _is_cupy_array(value) else value.get()
        with self.activate():
            return _cupy().asarray(value)

    def to_host(self, value: Any) -> np.ndarray:
        """A numpy array with ``value``'s contents (copies from the GPU when needed)."""
        return value.get() if _is_cupy_array(value) else np.asarray(value)

    def pinned_empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A host array in page-locked memory (plain numpy memory on the CPU)."""
        if not self.is_gpu:
            return np.empty(shape, dtype)
        import cupyx

        with self.activate():
            return cupyx.empty_pinned(shape, dtype)

    def new_stream(self) -> Any:
        """A new non-blocking CUDA stream (None on the CPU)."""
        if not self.is_gpu:
            return None
        with self.activate():
            return _cupy().cuda.Stream(non_blocking=True)

    def synchronize(self) -> None:
        """Wait for all work queued on this device (no-op on the CPU)."""
        if self.is_gpu:
            with self.activate():
                _cupy().cuda.Device(self.index).synchronize()

    def memory_pool_bytes(self) -> int:
        """Bytes currently held by CuPy's default memory pool (0 on the CPU)."""
        return int(_cupy().get_default_memory_pool().total_bytes()) if self.is_gpu else 0

    def __str__(self) -> str:
        return self.name


CPU = Device("cpu")


def _cupy() -> Any:
    cupy, reason = _import_cupy()
    if reason:
        raise EngineError(f"the GPU device is unavailable: {reason}")
    return cupy


def _is_cupy_array(value: Any) -> bool:
    return type(value).__module__.startswith("cupy")


def get_device(spec: Any = "cpu", *, tf32: bool | None = None,
               cuda_graphs: bool | None = None, cudnn: bool | None = None) -> Device:
    """Resolve ``spec`` to a `Device`.

    Args:
        spec: ``"cpu"``, ``"gpu"``, ``"gpu:N"``/``"gpu(N)"``, ``"auto"`` (the GPU when CuPy sees
            one, else the CPU), a frontend `Context` (``engine.gpu(0)``), a `Device`, or None
            (``"cpu"``).
        tf32: override the device's TF32 switch (GPU only).
        cuda_graphs: override whether plans are replayed as CUDA graphs (GPU only).
        cudnn: override whether convolutions go through cuDNN (GPU only).

    Raises:
        ValueError: ``spec`` names no device.
        EngineError: a GPU was asked for but CuPy or a GPU is missing (the message says which).

    Example:
        >>> get_device("cpu").xp is np
        True
    """
    device = _parse(spec)
    if device.is_gpu:
        reason = gpu_unavailable_reason()
        if reason:
            raise EngineError(f"cannot use {device.name}: {reason}; use device='cpu' or 'auto'")
        if device.index >= gpu_count():
            raise EngineError(f"cannot use {device.name}: CuPy sees {gpu_count()} GPU(s)")
    changes = {key: value for key, value in (("tf32", tf32), ("cuda_graphs", cuda_graphs),
                                              ("cudnn", cudnn)) if value is not None}
    if changes:
        device = Device(device.kind, device.index, **{**_fields(device), **changes})
    if device.is_gpu:
        _apply_tf32(device)
    return device


def _fields(device: Device) -> dict[str, bool]:
    return {"tf32": device.tf32, "cuda_graphs": device.cuda_graphs, "cudnn": device.cudnn}


def _parse(spec: Any) -> Device:
    if spec is None:
        return CPU
    if isinstance(spec, Device):
        return spec
    if isinstance(spec, Context):
        return Device(spec.device_type, spec.device_id)
    if not isinstance(spec, str):
        raise ValueError(f"device must be a string, a Context or a Device; "
                         f"got {type(spec).__name__}")
    text = spec.strip().lower()
    if text == "auto":
        return Device("gpu", 0) if gpu_available() else CPU
    if text == "cpu":
        return CPU
    for prefix, suffix in (("gpu:", ""), ("gpu(", ")"), ("cuda:", "")):
        if text.startswith(prefix) and text.endswith(suffix):
            number = text[len(prefix):len(text) - len(suffix)]
            if number.isdigit():
                return Device("gpu", int(number))
    if text in ("gpu", "cuda"):
        return Device("gpu", 0)
    raise ValueError(f"unknown device {spec!r}; expected one of {', '.join(DEVICE_NAMES)} "
                     "or 'gpu:N'")


def _apply_tf32(device: Device) -> None:
    """Set CuPy's float32 GEMM compute type: TF32 only when the device allows it."""
    try:
        linalg = importlib.import_module("cupy._core._routines_linalg")
    except ImportError:  # a CuPy without the switch: nothing to set
        return
    compute = getattr(linalg, "COMPUTE_TYPE_TF32" if device.tf32 else "COMPUTE_TYPE_DEFAULT", None)
    setter = getattr(linalg, "set_compute_type", None)
    if compute is not None and setter is not None:
        setter(np.dtype(np.float32), compute)


@contextlib.contextmanager
def on_stream(stream: Any) -> Iterator[None]:
    """Make ``stream`` CuPy's current stream inside the block (no-op for None)."""
    if stream is None:
        yield
        return
    with stream:
        yield


__all__ = ["CPU", "DEVICE_NAMES", "Device", "get_device", "gpu_available", "gpu_count",
           "gpu_unavailable_reason", "on_stream"]
