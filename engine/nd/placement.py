"""Where NDArrays live: the `Device` behind a `Context`, copies between contexts, ``waitall``.

A CPU context holds numpy arrays; a GPU context holds arrays of its device's array module
(CuPy), and registry kernels run on them with that module as ``xp``. Asking for a GPU context
without CuPy or a visible GPU raises an `EngineError` that says which is missing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import engine.cuda  # noqa: F401  (registers the GPU backend with engine.device)
from engine.context import Context
from engine.device import CPU, Device, gpu_count, gpu_unavailable_reason
from engine.errors import EngineError

# GPUs that hold (or held) NDArrays in this process: the ones `synchronize_all` waits for.
_USED: dict[int, Device] = {}


def device_for(ctx: Context) -> Device:
    """The device of ``ctx``, checked to be usable.

    Raises:
        EngineError: ``ctx`` is a GPU and CuPy, a CUDA driver or that GPU is missing.
    """
    if ctx.device_type == "cpu":
        return CPU
    reason = gpu_unavailable_reason()
    if reason:
        raise EngineError(f"cannot place an array on {ctx}: GPU arrays need CuPy and a GPU, "
                          f"but {reason}; or use ctx=engine.cpu()")
    count = gpu_count()
    if ctx.device_id >= count:
        raise EngineError(f"cannot place an array on {ctx}: CuPy sees {count} GPU(s), "
                          f"gpu(0) to gpu({count - 1})")
    device = _USED.get(ctx.device_id)
    if device is None:
        device = _USED[ctx.device_id] = Device("gpu", ctx.device_id)
    return device


def known_device(ctx: Context) -> Device:
    """The device of a context that already holds arrays (checked when they were placed)."""
    if ctx.device_type == "cpu":
        return CPU
    device = _USED.get(ctx.device_id)
    return device if device is not None else device_for(ctx)


def xp_of(ctx: Context) -> Any:
    """The array module of arrays on ``ctx``: numpy, or the GPU's (CuPy)."""
    return np if ctx.device_type == "cpu" else known_device(ctx).xp


def is_device_array(value: Any) -> bool:
    """Whether ``value`` is a CuPy array (it must be downloaded to be read on the host)."""
    return type(value).__module__.startswith("cupy")


def host_copy(data: Any, ctx: Context) -> np.ndarray:
    """A numpy array with ``data``'s contents that shares no memory with it."""
    if ctx.device_type == "cpu" and not is_device_array(data):
        return np.array(data)
    host = known_device(ctx).to_host(data)
    # A real download is already a fresh array; a host-memory view (a test stand-in) is not.
    return host if host.base is None and host is not data else np.array(host)


def to_host(data: Any) -> np.ndarray:
    """``data`` as a numpy array (downloaded from a GPU; no copy for numpy input)."""
    if type(data) is np.ndarray:
        return data
    if is_device_array(data):
        return data.get()
    return np.array(data) if isinstance(data, np.ndarray) else np.asarray(data)


def place(data: Any, ctx: Context) -> Any:
    """``data`` (numpy, a device array or anything array-like) as an array on ``ctx``.

    No copy is made when ``data`` already lives there; the caller owns the result otherwise.
    """
    if ctx.device_type == "cpu":
        return data if type(data) is np.ndarray else to_host(data)
    device = device_for(ctx)
    with device.activate():
        return device.asarray(data)


def move(data: Any, source: Context, target: Context) -> Any:
    """A copy of ``data`` (on ``source``) on ``target``, through the host between devices."""
    if source == target:
        return data.copy()
    host = host_copy(data, source) if source.device_type != "cpu" else data
    return host.copy() if target.device_type == "cpu" else place(host, target)


def synchronize_all() -> None:
    """Wait for the work queued on every GPU that holds NDArrays (none without CuPy)."""
    if gpu_unavailable_reason() is not None:
        return
    for device in list(_USED.values()):
        device.synchronize()
