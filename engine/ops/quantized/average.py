"""A global average pooling of int8/uint8 values requantized over a calibrated range
(``_quantized_global_average``): ours, not MXNet's. Its ``quantize_net`` pools the head of a
network in float between a dequantize and a quantize; here each channel's integers are
summed exactly and the sum scaled once into the next layer's steps (uint8 where the range
has no negatives, as ``quantize_v2``'s ``auto`` picks, else int8). Bound in a plan, it runs as
`kernels.int8_pool`'s pass reading its data in either layout of the channels-last hand-off
(`handoff`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from engine.cpu import steady_walk
from engine.errors import ShapeError
from engine.kernels import int8_pool
from engine.ops.dtypes import FLOAT32, UINT8
from engine.ops.quantized import handoff, integer, ranges
from engine.ops.quantized.ranges import CALIB_PARAMS, F32, INT8, RANGE_OUTPUTS
from engine.ops.registry import Attrs, OpDef, register

GLOBAL_AVERAGE_OP = "_quantized_global_average"


def output_dtype(attrs: Attrs) -> np.dtype:
    """uint8 over a calibrated range without negatives, else int8."""
    return UINT8 if attrs.min_calib_range >= 0 else INT8


def _factor(attrs: Attrs, dtype: np.dtype, low: Any, high: Any, count: int) -> F32:
    """The output's steps per unit of a channel's sum of ``count`` values of ``dtype`` over
    the data's range: the data's real step over ``count``, times the output's steps per real
    unit."""
    step = F32(ranges.max_abs(ranges.scalar(low), ranges.scalar(high))
               / ranges.QUANTIZED_RANGE[np.dtype(dtype)])
    return F32(F32(step / F32(count)) * ranges.quantize_scale(
        output_dtype(attrs), attrs.min_calib_range, attrs.max_calib_range))


def _check(attrs: Attrs, data: Any) -> None:
    ranges.check_quantized(data, "data", GLOBAL_AVERAGE_OP)
    if data.ndim != 4:
        raise ShapeError(f"{GLOBAL_AVERAGE_OP}: data must be (N, C, H, W); got shape "
                         f"{data.shape}")
    if not ranges.has_calib(attrs):
        raise ShapeError(f"{GLOBAL_AVERAGE_OP}: needs min_calib_range and max_calib_range "
                         "(the output's range)")


def _average(sums: np.ndarray, factor: F32, dtype: np.dtype) -> np.ndarray:
    """The (N, C) int64 sums (exact in float32: at most 2²⁴) scaled, rounded half to even
    and saturated."""
    return ranges.saturate_round(sums.astype(np.float32) * factor, dtype)


def _kernel(xp: Any, attrs: Attrs, data: Any, low: Any, high: Any) -> Any:
    values = np.asarray(data)
    _check(attrs, values)
    batch, channels, height, width = values.shape
    sums = values.reshape(batch, channels, -1).sum(axis=2, dtype=np.int64)
    result = _average(sums, _factor(attrs, values.dtype, low, high, height * width),
                      output_dtype(attrs))
    return (result.reshape(batch, channels, 1, 1),
            *ranges.range_pair(attrs.min_calib_range, attrs.max_calib_range))


class _BoundAverage:
    """A bound global average on `int8_pool`'s pass: its factor made once per data range,
    the sums taken in the layout the data's writer laid (channels-last where it took the
    hand-off)."""

    def __init__(self, attrs: Attrs, inputs: list[Any], targets: tuple[Any, ...],
                 workspace: Any) -> None:
        self.attrs, self.targets = attrs, targets
        self.data, self.low, self.high = inputs
        self.data_handoff = handoff.take(workspace, self.data)
        self.out_range = ranges.range_pair(attrs.min_calib_range, attrs.max_calib_range)
        self.factor = np.zeros(1, np.float32)
        self._key: Any = None
        self._jobs: dict[bool, Any] = {}
        self._range_writers = tuple(ranges.constant_writer(target, value) for target, value
                                    in zip(targets[1:3], self.out_range, strict=True))
        # the data's range as memoryviews: items read without NumPy's indexing
        self._range_views = tuple(memoryview(np.asarray(value).reshape(-1))
                                  for value in (self.low, self.high))
        self._constant_ranges = ranges.constant_here(workspace)

    def replayable(self) -> bool:
        """Where its data's range is the same at every run (its factor made once): its pass
        and its range writes are jobs (`steady_walk`)."""
        return self._constant_ranges and steady_walk.all_replayable(
            *self._jobs.values(), *self._range_writers)

    def __call__(self) -> None:
        data = self.data
        key = (self._range_views[0][0], self._range_views[1][0])
        if key != self._key:
            self.factor[0] = _factor(self.attrs, data.dtype, ranges.scalar(self.low),
                                     ranges.scalar(self.high), data.shape[2] * data.shape[3])
            self._key = key
        laid = self.data_handoff is not None and self.data_handoff.laid
        if laid not in self._jobs:
            self._jobs[laid] = int8_pool.global_average_job(data, self.factor,
                                                            self.targets[0], laid)
        self._jobs[laid]()
        integer.PATHS["int8_global_average"] += 1
        for write in self._range_writers:
            write()


def _bind(xp: Any, attrs: Attrs, inputs: list[Any], out: Any,
          workspace: Any = None) -> list[Any]:
    """On the CPU, the bound form reading the hand-off; otherwise the kernel runs."""
    targets = out if isinstance(out, tuple) else (out,)
    data = inputs[0]
    if not (xp is np and int8_pool.available() and ranges.has_calib(attrs) and data.ndim == 4
            and data.dtype in (INT8, UINT8) and data.flags.c_contiguous
            and targets[0].flags.c_contiguous and data.shape[2] * data.shape[3] * 255 < 2 ** 24):
        return [partial(GLOBAL_AVERAGE.compute, xp, attrs, inputs, out)]
    return [_BoundAverage(attrs, inputs, targets, workspace)]


def _shapes(attrs: Attrs, shapes: list[Any]) -> tuple[list[Any], list[Any]]:
    data = shapes[0]
    pooled = None if data is None else (*data[:2], 1, 1)
    return [data, (1,), (1,)], [pooled, (1,), (1,)]


GLOBAL_AVERAGE = register(OpDef(
    name=GLOBAL_AVERAGE_OP,
    params=CALIB_PARAMS,
    inputs=("data", "min_data", "max_data"),
    outputs=RANGE_OUTPUTS,
    infer_shape=_shapes,
    infer_dtype=lambda attrs, dtypes: ([dtypes[0], FLOAT32, FLOAT32],
                                       [output_dtype(attrs), FLOAT32, FLOAT32]),
    kernel=ranges.on_host(_kernel),
    bind=_bind,
    scratch=lambda attrs, shapes, dtype: 0,  # none: declared for the plan's workspace
    uncapturable=ranges.ON_HOST,
    doc="Global average pooling of int8/uint8 (N, C, H, W) data into (N, C, 1, 1) over the "
        "calibrated output range: each channel's exact integer sum scaled once.",
))

handoff.register_reader(GLOBAL_AVERAGE_OP, lambda reader: (
    reader.position == 0 and ranges.has_calib(reader.attrs)))
