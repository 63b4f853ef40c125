"""Moving between float and the integer types: ``_contrib_quantize_v2``, ``_contrib_dequantize``
and ``_contrib_requantize`` as MXNet's oneDNN backend runs them."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import steady_walk
from engine.errors import ShapeError
from engine.kernels import int8_convert
from engine.kernels.workspace import Workspace
from engine.ops.attrs import choice
from engine.ops.dtypes import FLOAT32, INT32, UINT8
from engine.ops.quantized import handoff, integer, ranges
from engine.ops.quantized.ranges import CALIB_PARAMS, F32, INT8, RANGE_OUTPUTS
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register

INT32_REACH = F32(2 ** 31)  # MXNet's int32 range: |INT32_MIN| as a float32 (2**31 - 1 rounds up)
LAID_QUANTIZE_CHANNELS = 8  # a quantize writes channels-last for a hand-off below this many


def _out_type(attrs: Attrs, low: float | None) -> np.dtype:
    """The integer type of a quantized output: ``auto`` is uint8 when the range is known and
    non-negative, int8 otherwise."""
    if attrs.out_type == "int8":
        return INT8
    if attrs.out_type == "uint8":
        return UINT8
    return UINT8 if low is not None and low >= 0 else INT8


def _ranged_shapes(attrs: Attrs, shapes: list[MaybeShape]) -> tuple[list, list]:
    """Data keeps its shape; every range input and output is ``(1,)``."""
    return [shapes[0], *ranges.range_shapes(len(shapes) - 1)], [shapes[0], (1,), (1,)]


def _quantize_v2(xp: Any, attrs: Attrs, data: Any) -> tuple[Any, Any, Any]:
    values = np.asarray(data, dtype=FLOAT32)
    if ranges.has_calib(attrs):
        low, high = F32(attrs.min_calib_range), F32(attrs.max_calib_range)
    elif values.size:
        low, high = F32(values.min()), F32(values.max())
    else:
        raise ShapeError("_contrib_quantize_v2: cannot take the range of an empty input "
                         "without min_calib_range and max_calib_range")
    dtype = _out_type(attrs, float(low) if ranges.has_calib(attrs) else None)
    if dtype == UINT8 and low < 0:
        raise ShapeError(f"_contrib_quantize_v2: out_type uint8 needs a non-negative range; "
                         f"the data reaches {float(low)}")
    scale = ranges.quantize_scale(dtype, low, high)
    quantized = ranges.saturate_round(values * scale, dtype)
    if dtype == INT8:  # int8 reports the symmetric range it covers
        reach = ranges.max_abs(low, high)
        low, high = -reach, reach
    return (quantized, *ranges.range_pair(low, high))


def _quantize_v2_bind(xp: Any, attrs: Attrs, inputs: list[Any], out: Any,
                      workspace: Any = None) -> list[Any]:
    """A calibrated node on the CPU as one compiled pass (`int8_convert`), its scale and
    output range fixed by the calibrated range; otherwise the kernel runs. In a plan, an
    output whose readers all take the channels-last hand-off (`handoff`: quantized
    convolutions, int8 max pooling) is written channels-last for them."""
    data, targets = inputs[0], out if isinstance(out, tuple) else (out,)
    fallback = [partial(QUANTIZE_V2.compute, xp, attrs, inputs, out)]
    if not (xp is np and ranges.has_calib(attrs) and int8_convert.available()
            and data.dtype == FLOAT32 and data.flags.c_contiguous
            and targets[0].flags.c_contiguous):
        return fallback
    low, high = F32(attrs.min_calib_range), F32(attrs.max_calib_range)
    dtype = _out_type(attrs, float(low))
    if targets[0].dtype != dtype or (dtype == UINT8 and low < 0):
        return fallback  # the kernel says what is wrong
    scale = np.array([ranges.quantize_scale(dtype, low, high)], np.float32)
    job = int8_convert.quantize_job(data, scale, *ranges.LIMITS[dtype], targets[0])
    if job is None:
        return fallback
    # Only a few channels (an image's): there a reader's own channels-last copy goes byte by
    # byte, and this pass lays them for 1.5x its plain time; with 8 and more channels that
    # copy writes words, and laying them here cost ResNet-50 v2 (2.5 ms a run at batch 1)
    # more than its convolutions saved (1.4 ms).
    laid_job = int8_convert.quantize_channels_last_job(
        data, scale, *ranges.LIMITS[dtype], targets[0]) \
        if data.ndim == 4 and data.shape[1] < LAID_QUANTIZE_CHANNELS else None
    offered = handoff.offer(workspace, targets[0]) if laid_job is not None else None
    if dtype == INT8:  # int8 reports the symmetric range it covers
        reach = ranges.max_abs(low, high)
        low, high = -reach, reach
    writers = tuple(ranges.constant_writer(target, value) for target, value in zip(
        targets[1:3], ranges.range_pair(low, high), strict=True))
    if isinstance(workspace, Workspace):  # a plan's input read where the caller's array lies
        workspace.reads_where_pointed(data, partial(_point_jobs, (job, laid_job)))

    def call() -> None:
        if offered is not None and offered.taken:
            laid_job()
            offered.laid = True
            integer.PATHS["int8_quantize_channels_last"] += 1
        else:
            job()
            if offered is not None:
                offered.laid = False
        for write in writers:
            write()

    # its passes and its range writes are jobs (`steady_walk`)
    call.replayable = partial(steady_walk.all_replayable, job, laid_job, *writers)
    return [call]


def _point_jobs(jobs: tuple[Any, ...], address: int) -> None:
    for job in jobs:
        if job is not None:
            int8_convert.point_at(job, address)


QUANTIZE_V2 = register(OpDef(
    name="_contrib_quantize_v2",
    params=(Param("out_type", choice("auto", "int8", "uint8"), "int8"), *CALIB_PARAMS),
    inputs=("data",),
    outputs=RANGE_OUTPUTS,
    infer_shape=lambda attrs, shapes: ([shapes[0]], [shapes[0], (1,), (1,)]),
    infer_dtype=lambda attrs, dtypes: ([dtypes[0] or FLOAT32], [
        _out_type(attrs, attrs.min_calib_range if ranges.has_calib(attrs) else None),
        FLOAT32, FLOAT32]),
    kernel=ranges.on_host(_quantize_v2),
    bind=_quantize_v2_bind,
    scratch=lambda attrs, shapes, dtype: 0,  # none: declared for the plan's workspace
    batch_positions=ranges.range_from_batch,
    uncapturable=ranges.ON_HOST,
    doc="float to int8/uint8 over the calibrated range (or the data's own min and max), with "
        "the range as two outputs.",
))


def _dequantize(xp: Any, attrs: Attrs, data: Any, low: Any, high: Any) -> Any:
    return np.asarray(data).astype(FLOAT32) * _dequantize_step(data, low, high)


def _dequantize_step(data: Any, low: Any, high: Any) -> F32:
    dtype = np.dtype(data.dtype)
    if dtype == INT32:
        return F32(ranges.max_abs(ranges.scalar(low), ranges.scalar(high)) / INT32_REACH)
    ranges.check_quantized(data, "data", "_contrib_dequantize")
    return F32(ranges.max_abs(ranges.scalar(low), ranges.scalar(high))
               / ranges.QUANTIZED_RANGE[dtype])


def _dequantize_bind(xp: Any, attrs: Attrs, inputs: list[Any], out: Any,
                     workspace: Any = None) -> list[Any]:
    """On the CPU, one compiled pass (`int8_convert`), its step made from the range inputs
    where their values changed since the last run; otherwise the kernel runs. In a plan,
    int8 data a fused convolution hands over channels-last (`handoff`) is read in whichever
    layout its writer's run wrote."""
    data, low, high = inputs
    fallback = [partial(DEQUANTIZE.compute, xp, attrs, inputs, out)]
    if not (xp is np and int8_convert.available() and data.dtype in (INT8, UINT8, INT32)
            and data.flags.c_contiguous and out.flags.c_contiguous):
        return fallback
    step = np.zeros(1, np.float32)
    job = int8_convert.dequantize_job(data, step, out)
    laid_job = int8_convert.dequantize_channels_last_job(data, step, out) \
        if data.ndim == 4 and data.dtype != INT32 else None
    if job is None:
        return fallback
    offered = handoff.take(workspace, data) if laid_job is not None else None
    read_range = _range_reader(low, high)
    made_for: list[Any] = [None]  # the range values the step was last made from

    def call() -> None:
        # In a plan's run the step's NumPy calls find their code evicted by the layers
        # before (MobileNet v2 int8's head, one thread: about 50 µs a run, the pass 4 µs);
        # a calibrated range reads the same at every run, so the step is made once.
        now = read_range()
        if now is None or now != made_for[0]:
            step[0] = _dequantize_step(data, low, high)
            made_for[0] = now
        if offered is not None and offered.laid:
            laid_job()
        else:
            job()

    constant = ranges.constant_here(workspace)

    def replayable() -> bool:
        """Where its range is the same at every run, its step is made once: its passes are
        jobs (`steady_walk`)."""
        return constant and made_for[0] is not None and steady_walk.all_replayable(
            job, laid_job)

    call.replayable = replayable
    return [call]


def _range_reader(low: Any, high: Any) -> Callable[[], tuple[float, float] | None]:
    """A call giving the values of the range inputs ``low`` and ``high`` (arrays of one
    float32 each, read at each call) through memoryviews, without NumPy's indexing; or one
    giving None (the step is made at every run) where either is another kind of input."""
    views = [memoryview(value.reshape(-1)) for value in (low, high)
             if isinstance(value, np.ndarray) and value.dtype == FLOAT32 and value.size == 1
             and value.flags.c_contiguous]
    if len(views) != 2:
        return lambda: None
    first, second = views
    return lambda: (first[0], second[0])


DEQUANTIZE = register(OpDef(
    name="_contrib_dequantize",
    params=(Param("out_type", choice("float32"), "float32"),),
    inputs=("data", "min_range", "max_range"),
    infer_shape=lambda attrs, shapes: ([shapes[0], (1,), (1,)], [shapes[0]]),
    infer_dtype=lambda attrs, dtypes: ([dtypes[0], FLOAT32, FLOAT32], [FLOAT32]),
    kernel=ranges.on_host(_dequantize),
    bind=_dequantize_bind,
    scratch=lambda attrs, shapes, dtype: 0,  # none: declared for the plan's workspace
    uncapturable=ranges.ON_HOST,
    doc="int8/uint8/int32 to float32: each step is max(|min|, |max|) / 127.5 (255.5 for uint8, "
        "2**31 for int32).",
))


def _requantize(xp: Any, attrs: Attrs, data: Any, low: Any, high: Any) -> tuple[Any, Any, Any]:
    ranges.check_quantized(data, "data", "_contrib_requantize", (INT32,))
    values = np.asarray(data)
    data_reach = ranges.max_abs(ranges.scalar(low), ranges.scalar(high))
    if ranges.has_calib(attrs):
        reach = ranges.max_abs(attrs.min_calib_range, attrs.max_calib_range)
    else:  # the reach of the sums at hand
        largest = F32(np.abs(values.astype(np.int64)).max()) if values.size else F32(0)
        reach = F32(F32(largest * data_reach) / INT32_REACH)
    dtype = _out_type(attrs, float(attrs.min_calib_range) if ranges.has_calib(attrs) else None)
    # Unlike every other op, requantize counts the integer type's own largest magnitude
    # (127; 255 for uint8), not MXNet's kInt8Range of 127.5.
    scale = F32(F32(data_reach / INT32_REACH) * F32(F32(ranges.LIMITS[dtype][1]) / reach))
    quantized = ranges.saturate_round(values.astype(np.float32) * scale, dtype)
    return (quantized, *ranges.range_pair(-reach, reach))


REQUANTIZE = register(OpDef(
    name="_contrib_requantize",
    params=(Param("out_type", choice("auto", "int8", "uint8"), "int8"), *CALIB_PARAMS),
    inputs=("data", "min_range", "max_range"),
    outputs=RANGE_OUTPUTS,
    infer_shape=_ranged_shapes,
    infer_dtype=lambda attrs, dtypes: ([INT32, FLOAT32, FLOAT32], [
        _out_type(attrs, attrs.min_calib_range if ranges.has_calib(attrs) else None),
        FLOAT32, FLOAT32]),
    kernel=ranges.on_host(_requantize),
    batch_positions=ranges.range_from_batch,
    uncapturable=ranges.ON_HOST,
    doc="int32 accumulators to int8/uint8 over the calibrated output range.",
))


def _quantize(xp: Any, attrs: Attrs, data: Any, low: Any, high: Any) -> tuple[Any, Any, Any]:
    dtype = UINT8 if attrs.out_type == "uint8" else INT8
    low, high = ranges.scalar(low), ranges.scalar(high)
    if dtype == UINT8 and low < 0:
        raise ShapeError(f"_contrib_quantize: out_type uint8 needs a non-negative min_range; "
                         f"got {float(low)}")
    # The first quantize op counts the integer type's own largest magnitude (127, 255).
    scale = F32(F32(ranges.LIMITS[dtype][1]) / ranges.max_abs(low, high))
    quantized = ranges.saturate_round(np.asarray(data, dtype=FLOAT32) * scale, dtype)
    return (quantized, *ranges.range_pair(low, high))


QUANTIZE = register(OpDef(
    name="_contrib_quantize",
    params=(Param("out_type", choice("int8", "uint8"), "uint8"),),
    inputs=("data", "min_range", "max_range"),
    outputs=RANGE_OUTPUTS,
    infer_shape=_ranged_shapes,
    infer_dtype=lambda attrs, dtypes: ([dtypes[0] or FLOAT32, FLOAT32, FLOAT32], [
        UINT8 if attrs.out_type == "uint8" else INT8, FLOAT32, FLOAT32]),
    kernel=ranges.on_host(_quantize),
    uncapturable=ranges.ON_HOST,
    doc="float to int8/uint8 over the range given as inputs (127 or 255 steps per "
        "max(|min|, |max|)); the range passes through.",
))
