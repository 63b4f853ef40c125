"""What every quantized operator shares: scales from ranges, rounding, and range outputs.

MXNet's oneDNN operators carry a tensor's real range beside it as two float32 scalars (``min``
and ``max``, shape ``(1,)``). A range maps onto the integer type symmetrically: int8 values
stand for ``q * max(|min|, |max|) / 127.5``, uint8 ones for ``q * max(|min|, |max|) / 255.5``
(MXNet's ``kInt8Range`` and ``kUint8Range``). The
scales are computed in float32, in MXNet's order of operations, so that the integers agree.
oneDNN rounds to nearest with ties to even (the CPU's default mode) and saturates to the type.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.cpu import spin_pool
from engine.errors import ShapeError
from engine.ops.attrs import optional, parse_float
from engine.ops.dtypes import FLOAT32, INT32, UINT8
from engine.ops.registry import Attrs, Param

INT8 = np.dtype(np.int8)
F32 = np.float32
# MXNet counts half a step more than the largest integer (``kInt8Range`` is 127.5,
# ``kUint8Range`` 255.5): its scales are 127.5 / max(|min|, |max|), and rounding saturates.
INT8_RANGE, UINT8_RANGE = F32(127.5), F32(255.5)
QUANTIZED_RANGE = {INT8: INT8_RANGE, UINT8: UINT8_RANGE}
LIMITS = {INT8: (-128, 127), UINT8: (0, 255), INT32: (-(2 ** 31), 2 ** 31 - 1)}
RANGE_OUTPUTS = ("output", "min_output", "max_output")
CALIB_PARAMS = (
    Param("min_calib_range", optional(parse_float), None,
          "the output's calibrated minimum; with the maximum it fixes the output's int8 scale"),
    Param("max_calib_range", optional(parse_float), None,
          "the output's calibrated maximum"),
)


def has_calib(attrs: Attrs) -> bool:
    """Whether the node carries a calibrated output range (the requantize is fused in)."""
    return attrs.min_calib_range is not None and attrs.max_calib_range is not None


def constant_in(nodes: Any) -> bool:
    """Whether every range among ``nodes`` (a graph's) is the same at every run: none takes
    its range from the data at hand (an uncalibrated quantize or requantize, `range_from_batch`)
    or from ranges the graph computes (``_contrib_quantize``'s inputs). Steps reading ranges
    then decide the same way at every run (`engine.cpu.steady_walk`)."""
    return not any(node.op == "_contrib_quantize" or (
        node.op in ("_contrib_quantize_v2", "_contrib_requantize")
        and not has_calib(node.params)) for node in nodes if not node.is_variable)


def constant_here(workspace: Any) -> bool:
    """Whether the plan ``workspace`` belongs to has constant ranges (`constant_in`, said
    as the plan compiles); False outside a plan."""
    return bool(getattr(workspace, "constant_ranges", False))


def range_from_batch(attrs: Attrs) -> str:
    """`OpDef.batch_positions` of a node that, uncalibrated, takes its range from the data at
    hand: every row's scale then depends on the other rows of the batch."""
    return "" if has_calib(attrs) else "takes its range from the whole batch (no calibrated range)"


def scalar(value: Any) -> F32:
    """A range input (shape ``(1,)`` or a scalar) as a float32."""
    array = np.asarray(value)
    if array.size != 1:
        raise ShapeError(f"a quantized range must hold one value; got shape {array.shape}")
    return F32(array.reshape(()))


def max_abs(low: Any, high: Any) -> F32:
    """``max(|low|, |high|)`` in float32, MXNet's ``MaxAbs``."""
    return F32(max(abs(F32(low)), abs(F32(high))))


def quantize_scale(dtype: np.dtype, low: Any, high: Any) -> F32:
    """Integer steps per real unit for ``dtype`` over ``[low, high]`` (MXNet's
    ``GetQuantizeScale``): 127.5 / max(|low|, |high|) for int8, 255.5 / max(...) for uint8."""
    return F32(QUANTIZED_RANGE[np.dtype(dtype)] / max_abs(low, high))


def saturate_round(values: Any, dtype: np.dtype) -> np.ndarray:
    """float values rounded half to even and saturated to ``dtype``, oneDNN's conversion."""
    low, high = LIMITS[np.dtype(dtype)]
    return np.clip(np.rint(values), low, high).astype(dtype)


def range_pair(low: Any, high: Any) -> tuple[np.ndarray, np.ndarray]:
    """The ``(min, max)`` outputs: float32 arrays of shape ``(1,)``."""
    return np.full((1,), low, dtype=FLOAT32), np.full((1,), high, dtype=FLOAT32)


def byte_copier(target: np.ndarray, source: np.ndarray) -> Callable[[], None] | None:
    """A call copying ``source``'s bytes (read at each call) into ``target`` through
    memoryviews, where both are C-contiguous arrays of one dtype and size; else None. In a
    plan's run a bound step's NumPy calls find their code and objects evicted by the layers
    before it (ResNet-18 int8 at batch 1, one thread: about 5 µs a range copied)."""
    if not (isinstance(source, np.ndarray) and source.dtype == target.dtype
            and source.size == target.size and source.flags.c_contiguous
            and target.flags.c_contiguous):
        return None
    job = spin_pool.byte_copy(target, source)  # a job: a steady run replays it natively
    if job is not None:
        return job
    into = memoryview(target.reshape(-1)).cast("B")
    read = memoryview(source.reshape(-1)).cast("B")

    def copy() -> None:
        into[:] = read

    return copy


def constant_writer(target: np.ndarray, value: Any) -> Callable[[], None]:
    """A call writing ``value`` into ``target`` as ``np.copyto(target, value)`` would, its
    bytes made once (`byte_copier`)."""
    made = np.empty_like(target, order="C")
    np.copyto(made, value)
    return byte_copier(target, made) or functools.partial(np.copyto, target, made)


def range_copier(source: Any, target: np.ndarray) -> Callable[[], None]:
    """A call copying the range value in ``source`` (one value, read at each call) into
    ``target`` as ``np.copyto(target, scalar(source))`` would: by `byte_copier` where both
    are float32 arrays of one value."""
    copy = byte_copier(target, source) if target.dtype == FLOAT32 and target.size == 1 \
        else None
    return copy or (lambda: np.copyto(target, scalar(source)))


def ranges_of(inputs: Any, first: int, count: int) -> list[tuple[F32, F32]]:
    """``count`` (min, max) pairs from ``inputs[first:]``, laid out as MXNet's quantized ops
    list them: each input's minimum, then its maximum."""
    return [(scalar(inputs[first + 2 * k]), scalar(inputs[first + 2 * k + 1]))
            for k in range(count)]


def check_quantized(array: Any, what: str, op: str, allowed: tuple[np.dtype, ...] = (INT8, UINT8)
                    ) -> None:
    """Refuse an input whose dtype the op cannot read, naming it."""
    if np.dtype(array.dtype) not in allowed:
        names = ", ".join(str(dtype) for dtype in allowed)
        raise ShapeError(f"{op}: input {what!r} has dtype {array.dtype}; expected {names}")


def range_shapes(count: int) -> list[tuple[int, ...]]:
    """``count`` range shapes, ``(1,)`` each."""
    return [(1,)] * count


ON_HOST = "runs in NumPy on the host (MXNet's int8 ops have no GPU kernels here)"


def on_host(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``kernel`` run in NumPy on host copies of its inputs, its results moved back to ``xp``
    (a GPU plan then runs the node through the host, step by step: see `ON_HOST`)."""

    @functools.wraps(kernel)
    def run(xp: Any, attrs: Attrs, *inputs: Any) -> Any:
        results = kernel(np, attrs, *(_host(array) for array in inputs))
        if xp is np:
            return results
        if isinstance(results, tuple):
            return tuple(xp.asarray(result) for result in results)
        return xp.asarray(results)

    return run


def _host(array: Any) -> Any:
    return array.get() if hasattr(array, "get") and not isinstance(array, np.ndarray) else array
