"""Quantized layers that keep or reset their range: pooling, flatten, relu, concat, the
residual add, BatchNorm and the embedding lookup, as MXNet 1.9.1's oneDNN backend runs them.
Each takes int8/uint8 data with its ``(min, max)`` and returns the same triple."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import steady_walk
from engine.errors import ShapeError
from engine.kernels import int8_pool
from engine.kernels.im2col import spatial_param
from engine.ops.attrs import parse_bool, parse_int
from engine.ops.dtypes import FLOAT32, INT32, UINT8
from engine.ops.nn import activation, norm, pool
from engine.ops.quantized import handoff, integer, ranges
from engine.ops.quantized.ranges import CALIB_PARAMS, F32, INT8, RANGE_OUTPUTS
from engine.ops.quantized.requantize import int32_range
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, get_op, register
from engine.ops.tensor import indexing  # noqa: F401  (registers Embedding, read below)


def _keep_ranges(out_shape: Any) -> Any:
    """A shape rule for ``(data, min, max) -> (output, min, max)``."""

    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> tuple[list, list]:
        data_in, data_out = out_shape(attrs, shapes[:1])
        return [*data_in, (1,), (1,)], [data_out, (1,), (1,)]

    return infer


def _pass_dtype(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    return [dtypes[0], FLOAT32, FLOAT32], [dtypes[0], FLOAT32, FLOAT32]


def _pooling_kernel(xp: Any, attrs: Attrs, data: Any, low: Any, high: Any) -> Any:
    values = np.asarray(data)
    ranges.check_quantized(values, "data", "_contrib_quantized_pooling")
    pooling = get_op("Pooling")
    if attrs.pool_type == "max":
        (result,) = pooling.compute(np, attrs, [values])
        return result.astype(values.dtype), *ranges.range_pair(ranges.scalar(low),
                                                                ranges.scalar(high))
    if attrs.pool_type != "avg":
        raise ShapeError(f"_contrib_quantized_pooling: pool_type {attrs.pool_type!r} is not "
                         "quantized by MXNet (max and avg are)")
    # oneDNN sums in int32, multiplies by 1/count in float32 and rounds half to even.
    wide = values.astype(np.float64)
    sum_attrs = Attrs({**attrs, "pool_type": "sum"})
    (sums,) = pooling.compute(np, sum_attrs, [wide])
    if attrs.global_pool or attrs.count_include_pad in (None, True):
        window = values.shape[2:] if attrs.global_pool else attrs.kernel
        counts = np.float64(math.prod(window))
    else:
        (counts,) = pooling.compute(np, sum_attrs, [np.ones_like(wide)])
    inverse = (F32(1.0) / np.asarray(counts, dtype=np.float32)).astype(np.float32)
    mean = sums.astype(np.float32) * inverse
    return ranges.saturate_round(mean, values.dtype), *ranges.range_pair(ranges.scalar(low),
                                                                         ranges.scalar(high))


POOLING_OP = "_contrib_quantized_pooling"


def _pools_on_int8_kernel(attrs: Attrs) -> bool:
    """Whether a node's attributes are those `int8_pool` runs: 2-D max pooling over NCHW
    data with a window (global pooling and average stay on the NumPy kernel)."""
    return (attrs.pool_type == "max" and not attrs.global_pool and attrs.kernel is not None
            and len(attrs.kernel) == 2 and attrs.layout in (None, "NCHW"))


handoff.register_reader(POOLING_OP, lambda reader: (
    reader.position == 0 and _pools_on_int8_kernel(reader.attrs)))


class _Int8MaxPool:
    """A bound 2-D max pooling on `int8_pool`'s pass. In a plan it takes its data's hand-off
    and offers its own output's (`handoff`), reading and writing whichever layouts those
    say at each run: the pass has a form for each pair."""

    def __init__(self, attrs: Attrs, inputs: list[Any], targets: tuple[Any, ...],
                 workspace: Any) -> None:
        self.data, self.low, self.high = inputs
        self.targets = targets
        self.window = int8_pool.Window(
            tuple(attrs.kernel), spatial_param(attrs.stride, 2, 1, "stride", POOLING_OP),
            spatial_param(attrs.pad, 2, 0, "pad", POOLING_OP))
        self.data_handoff = handoff.take(workspace, self.data)
        self.out_handoff = handoff.offer(workspace, targets[0])
        self._jobs: dict[tuple[bool, bool], Any] = {}
        self._ranges = (ranges.range_copier(self.low, targets[1]),
                        ranges.range_copier(self.high, targets[2]))

    def replayable(self) -> bool:
        """Its passes and its ranges' copies are jobs (`steady_walk`)."""
        return steady_walk.all_replayable(*self._jobs.values(), *self._ranges)

    def __call__(self) -> None:
        data_laid = self.data_handoff is not None and self.data_handoff.laid
        out_laid = self.out_handoff is not None and self.out_handoff.taken
        key = (data_laid, out_laid)
        if key not in self._jobs:
            self._jobs[key] = int8_pool.max_pool_job(self.data, self.window, self.targets[0],
                                                     data_laid, out_laid)
        self._jobs[key]()
        integer.PATHS["int8_max_pool"] += 1
        if self.out_handoff is not None:
            self.out_handoff.laid = out_laid
            integer.PATHS["int8_channels_last_handoff"] += out_laid
        for copy in self._ranges:
            copy()


def _pooling_bind(xp: Any, attrs: Attrs, inputs: list[Any], out: Any,
                  workspace: Any = None) -> list[Any]:
    """2-D max pooling on the CPU as one compiled pass (`int8_pool`), on the channels-last
    hand-off in a plan; otherwise the kernel runs."""
    data, targets = inputs[0], out if isinstance(out, tuple) else (out,)
    if not (xp is np and _pools_on_int8_kernel(attrs) and int8_pool.available()
            and data.ndim == 4 and data.dtype in (INT8, UINT8)
            and targets[0].dtype == data.dtype and data.flags.c_contiguous
            and targets[0].flags.c_contiguous):
        return [partial(QUANTIZED_POOLING.compute, xp, attrs, inputs, out)]
    return [_Int8MaxPool(attrs, inputs, targets, workspace)]


QUANTIZED_POOLING = register(OpDef(
    name=POOLING_OP,
    params=pool.POOLING.params,
    inputs=("data", "min_data", "max_data"),
    outputs=RANGE_OUTPUTS,
    infer_shape=_keep_ranges(lambda attrs, shapes: (
        lambda result: (result[0], result[1][0]))(get_op("Pooling").infer_shape(attrs, shapes))),
    infer_dtype=_pass_dtype,
    kernel=ranges.on_host(_pooling_kernel),
    bind=_pooling_bind,
    scratch=lambda attrs, shapes, dtype: 0,  # none: declared for the plan's workspace
    uncapturable=ranges.ON_HOST,
    doc="Max or average pooling on int8/uint8; the range passes through.",
))


def _flatten_shape(attrs: Attrs, shapes: list[MaybeShape]) -> tuple[list, MaybeShape]:
    data = shapes[0]
    if data is None:
        return [None], None
    return [data], (data[0], math.prod(data[1:])) if len(data) > 1 else (data[0], 1)


def _flatten_bind(xp: Any, attrs: Attrs, inputs: list[Any], out: Any,
                  workspace: Any = None) -> list[Any]:
    """On the CPU, three copies into the plan's buffers (the generic call's wrapping took a
    network head's flatten 25 µs); otherwise the kernel runs."""
    targets = out if isinstance(out, tuple) else (out,)
    data, low, high = inputs
    if xp is not np or len(targets) != 3:
        return [partial(QUANTIZED_FLATTEN.compute, xp, attrs, inputs, out)]

    copies = (ranges.range_copier(low, targets[1]), ranges.range_copier(high, targets[2]))
    copy_data = ranges.byte_copier(targets[0], data) or partial(
        np.copyto, targets[0], data.reshape(targets[0].shape))

    def flatten() -> None:
        copy_data()
        for copy in copies:
            copy()

    return [flatten]


QUANTIZED_FLATTEN = register(OpDef(
    name="_contrib_quantized_flatten",
    inputs=("data", "min_data", "max_data"),
    outputs=RANGE_OUTPUTS,
    infer_shape=_keep_ranges(_flatten_shape),
    infer_dtype=_pass_dtype,
    kernel=ranges.on_host(lambda xp, attrs, data, low, high: (
        np.asarray(data).reshape(data.shape[0], -1),
        *ranges.range_pair(ranges.scalar(low), ranges.scalar(high)))),
    bind=_flatten_bind,
    scratch=lambda attrs, shapes, dtype: 0,  # none: declared for the plan's workspace
    uncapturable=ranges.ON_HOST,
    doc="Flatten on int8/uint8; the range passes through.",
))


def _act_kernel(xp: Any, attrs: Attrs, data: Any, low: Any, high: Any) -> Any:
    if attrs.act_type != "relu":
        raise ShapeError(f"_contrib_quantized_act: act_type {attrs.act_type!r} is not "
                         "quantized by MXNet (relu is)")
    values = np.asarray(data)
    ranges.check_quantized(values, "data", "_contrib_quantized_act")
    return np.maximum(values, 0).astype(values.dtype), *ranges.range_pair(
        ranges.scalar(low), ranges.scalar(high))


QUANTIZED_ACT = register(OpDef(
    name="_contrib_quantized_act",
    params=activation.ACTIVATION.params,
    inputs=("data", "min_data", "max_data"),
    outputs=RANGE_OUTPUTS,
    infer_shape=_keep_ranges(lambda attrs, shapes: ([shapes[0]], shapes[0])),
    infer_dtype=_pass_dtype,
    kernel=ranges.on_host(_act_kernel),
    uncapturable=ranges.ON_HOST,
    doc="relu on int8/uint8; the range passes through.",
))


def _add_dtype(attrs: Attrs) -> np.dtype:
    if not ranges.has_calib(attrs):
        return INT32
    return UINT8 if attrs.min_calib_range >= 0 else INT8


def _add_kernel(xp: Any, attrs: Attrs, lhs: Any, rhs: Any, *range_inputs: Any) -> Any:
    op = "_contrib_quantized_elemwise_add"
    left, right = np.asarray(lhs), np.asarray(rhs)
    ranges.check_quantized(left, "lhs", op)
    ranges.check_quantized(right, "rhs", op)
    if left.shape != right.shape:
        raise ShapeError(f"{op}: lhs {left.shape} and rhs {right.shape} must have one shape")
    (a_low, a_high), (b_low, b_high) = ranges.ranges_of(range_inputs, 0, 2)
    a_reach, b_reach = ranges.max_abs(a_low, a_high), ranges.max_abs(b_low, b_high)
    dtype = _add_dtype(attrs)
    out_range = ranges.QUANTIZED_RANGE.get(dtype, F32(2 ** 31 - 1))
    if ranges.has_calib(attrs):
        out_low, out_high = F32(attrs.min_calib_range), F32(attrs.max_calib_range)
        out_scale = F32(out_range / ranges.max_abs(out_low, out_high))
        scales = [F32(out_scale / ranges.quantize_scale(left.dtype, a_low, a_high)),
                  F32(out_scale / ranges.quantize_scale(right.dtype, b_low, b_high))]
    else:
        out_high = F32(a_reach + b_reach)
        out_low = -out_high
        scales = [F32(F32(a_reach * out_range) / F32(out_high * ranges.QUANTIZED_RANGE[
            np.dtype(left.dtype)])), F32(F32(b_reach * out_range) / F32(out_high * ranges.
                                                                        QUANTIZED_RANGE[np.dtype(right.dtype)]))]
    operands = [left.astype(np.float32), right.astype(np.float32)]
    if left.dtype != right.dtype:  # oneDNN first rescales the uint8 side to int8, rounding
        unsigned = 0 if left.dtype == UINT8 else 1
        operands[unsigned] = ranges.saturate_round(operands[unsigned] * scales[unsigned],
                                                   INT8).astype(np.float32)
        scales[unsigned] = F32(1.0)
    total = operands[0] * scales[0] + operands[1] * scales[1]
    return ranges.saturate_round(total, dtype), *ranges.range_pair(out_low, out_high)


QUANTIZED_ADD = register(OpDef(
    name="_contrib_quantized_elemwise_add",
    params=CALIB_PARAMS,
    inputs=("lhs", "rhs", "lhs_min", "lhs_max", "rhs_min", "rhs_max"),
    outputs=RANGE_OUTPUTS,
    infer_shape=lambda attrs, shapes: ([shapes[0] or shapes[1], shapes[1] or shapes[0],
                                        *[(1,)] * 4], [shapes[0] or shapes[1], (1,), (1,)]),
    infer_dtype=lambda attrs, dtypes: (
        [dtypes[0], dtypes[1], *[FLOAT32] * 4], [_add_dtype(attrs), FLOAT32, FLOAT32]),
    kernel=ranges.on_host(_add_kernel),
    uncapturable=ranges.ON_HOST,
    doc="Sum of two int8/uint8 tensors, each rescaled onto the calibrated output range.",
))


def _concat_inputs(attrs: Attrs) -> tuple[str, ...]:
    count = attrs.num_args
    return (*(f"arg{k}" for k in range(count)),
            *(name for k in range(count) for name in (f"arg{k}_min", f"arg{k}_max")))


def _concat_shapes(attrs: Attrs, shapes: list[MaybeShape]) -> tuple[list, list]:
    count = attrs.num_args
    data_in, data_out = get_op("Concat").infer_shape(attrs, list(shapes[:count]))
    return [*data_in, *[(1,)] * (2 * count)], [data_out[0], (1,), (1,)]


def _concat_dtype(dtypes: list, count: int) -> np.dtype | None:
    known = [dtype for dtype in dtypes[:count] if dtype is not None]
    if not known:
        return None
    return INT8 if any(dtype == INT8 for dtype in known) else UINT8


def _concat_kernel(xp: Any, attrs: Attrs, *inputs: Any) -> Any:
    op = "_contrib_quantized_concat"
    count = attrs.num_args
    parts = [np.asarray(part) for part in inputs[:count]]
    for number, part in enumerate(parts):
        ranges.check_quantized(part, f"arg{number}", op)
    pairs = ranges.ranges_of(inputs, count, count)
    low = F32(min(pair[0] for pair in pairs))
    high = F32(max(pair[1] for pair in pairs))
    dtype = _concat_dtype([part.dtype for part in parts], count)
    if dtype == INT8:
        reach = ranges.max_abs(low, high)
        low, high = -reach, reach
    out_scale = ranges.quantize_scale(dtype, low, high)
    rescaled = []
    for part, (part_low, part_high) in zip(parts, pairs, strict=True):
        scale = ranges.quantize_scale(part.dtype, part_low, part_high)
        if scale == out_scale and part.dtype == dtype:
            rescaled.append(part)
        else:
            rescaled.append(ranges.saturate_round(
                part.astype(np.float32) * F32(out_scale / scale), dtype))
    axis = attrs.dim % parts[0].ndim
    return np.concatenate(rescaled, axis=axis), *ranges.range_pair(low, high)


QUANTIZED_CONCAT = register(OpDef(
    name="_contrib_quantized_concat",
    params=(Param("num_args", parse_int), Param("dim", parse_int, 1)),
    inputs=_concat_inputs,
    outputs=RANGE_OUTPUTS,
    infer_shape=_concat_shapes,
    infer_dtype=lambda attrs, dtypes: (
        [*dtypes[:attrs.num_args], *[FLOAT32] * (2 * attrs.num_args)],
        [_concat_dtype(dtypes, attrs.num_args), FLOAT32, FLOAT32]),
    kernel=ranges.on_host(_concat_kernel),
    uncapturable=ranges.ON_HOST,
    doc="Concat of int8/uint8 tensors onto their joint range (int8 if any input is int8).",
))


def batchnorm_terms(attrs: Attrs, dtype: np.dtype, low: Any, high: Any, gamma: Any,
                     beta: Any, mean: Any, var: Any, out_dtype: np.dtype
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Per channel (scale, shift), float32, taking ``dtype`` values over ``(low, high)`` to
    ``out_dtype`` steps over the calibrated output range: the BatchNorm folded into one
    product and one sum."""
    in_reach = ranges.max_abs(ranges.scalar(low), ranges.scalar(high))
    out_reach = ranges.max_abs(attrs.min_calib_range, attrs.max_calib_range)
    out_steps = ranges.QUANTIZED_RANGE[np.dtype(out_dtype)]
    gamma = np.ones_like(np.asarray(gamma, np.float32)) if attrs.fix_gamma else np.asarray(
        gamma, np.float32)
    inverse = (1.0 / np.sqrt(np.asarray(var, np.float64) + attrs.eps)).astype(np.float32)
    in_steps = ranges.QUANTIZED_RANGE[np.dtype(dtype)]
    scale = (gamma * inverse * F32(F32(in_reach / in_steps) * F32(out_steps / out_reach))
             ).astype(np.float32)
    shift = ((np.asarray(beta, np.float32) - np.asarray(mean, np.float32) * gamma * inverse)
             * F32(out_steps / out_reach)).astype(np.float32)
    return scale, shift


def batchnorm_into(op: str, out_dtype: np.dtype) -> Any:
    """The NumPy kernel of a quantized BatchNorm writing ``out_dtype``."""

    def kernel(xp: Any, attrs: Attrs, data: Any, gamma: Any, beta: Any, mean: Any, var: Any,
               low: Any, high: Any) -> Any:
        values = np.asarray(data)
        ranges.check_quantized(values, "data", op)
        if not ranges.has_calib(attrs):
            raise ShapeError(f"{op}: needs min_calib_range and max_calib_range (MXNet "
                             "quantizes BatchNorm only with a calibrated output)")
        scale, shift = batchnorm_terms(attrs, values.dtype, low, high, gamma, beta, mean,
                                        var, out_dtype)
        axis = attrs.axis % values.ndim
        shape = [1] * values.ndim
        shape[axis] = -1
        result = values.astype(np.float32) * scale.reshape(shape) + shift.reshape(shape)
        return ranges.saturate_round(result, out_dtype), *ranges.range_pair(
            attrs.min_calib_range, attrs.max_calib_range)

    return kernel


def batchnorm_shapes(attrs: Attrs, shapes: list[MaybeShape]) -> tuple[list, list]:
    data = shapes[0]
    channels = None if data is None else (data[attrs.axis % len(data)],)
    return [data, channels, channels, channels, channels, (1,), (1,)], [data, (1,), (1,)]


QUANTIZED_BATCHNORM = register(OpDef(
    name="_contrib_quantized_batch_norm",
    params=norm.BATCH_NORM.params,  # which holds min_calib_range and max_calib_range
    inputs=("data", "gamma", "beta", "moving_mean", "moving_var", "min_data", "max_data"),
    outputs=RANGE_OUTPUTS,
    infer_shape=batchnorm_shapes,
    infer_dtype=lambda attrs, dtypes: ([dtypes[0], *[FLOAT32] * 6], [INT8, FLOAT32, FLOAT32]),
    kernel=ranges.on_host(batchnorm_into("_contrib_quantized_batch_norm", INT8)),
    uncapturable=ranges.ON_HOST,
    doc="Inference BatchNorm on int8/uint8 data, int8 out over the calibrated range.",
))

def _embedding_kernel(xp: Any, attrs: Attrs, data: Any, weight: Any, low: Any,
                      high: Any) -> Any:
    table = np.asarray(weight)
    ranges.check_quantized(table, "weight", "_contrib_quantized_embedding", (INT8,))
    rows = np.clip(np.asarray(data).astype(np.int64), 0, table.shape[0] - 1)
    return table[rows], *ranges.range_pair(ranges.scalar(low), ranges.scalar(high))


QUANTIZED_EMBEDDING = register(OpDef(
    name="_contrib_quantized_embedding",
    params=get_op("Embedding").params,
    inputs=("data", "weight", "min_weight", "max_weight"),
    outputs=RANGE_OUTPUTS,
    infer_shape=lambda attrs, shapes: (
        [shapes[0], (attrs.input_dim, attrs.output_dim), (1,), (1,)],
        [None if shapes[0] is None else (*shapes[0], attrs.output_dim), (1,), (1,)]),
    infer_dtype=lambda attrs, dtypes: ([dtypes[0] or FLOAT32, INT8, FLOAT32, FLOAT32],
                                       [INT8, FLOAT32, FLOAT32]),
    kernel=ranges.on_host(_embedding_kernel),
    uncapturable=ranges.ON_HOST,
    doc="Rows of an int8 table; the table's range passes through.",
))


def _mul_dtype(attrs: Attrs) -> np.dtype:
    if attrs.enable_float_output:
        return FLOAT32
    return INT8 if ranges.has_calib(attrs) else INT32


def _mul_kernel(xp: Any, attrs: Attrs, lhs: Any, rhs: Any, *range_inputs: Any) -> Any:
    op = "_contrib_quantized_elemwise_mul"
    left, right = np.asarray(lhs), np.asarray(rhs)
    ranges.check_quantized(left, "lhs", op, (INT8,))
    ranges.check_quantized(right, "rhs", op, (INT8,))
    if left.shape != right.shape:
        raise ShapeError(f"{op}: lhs {left.shape} and rhs {right.shape} must have one shape")
    (a_low, a_high), (b_low, b_high) = ranges.ranges_of(range_inputs, 0, 2)
    in_scale = F32(ranges.quantize_scale(INT8, a_low, a_high)
                   * ranges.quantize_scale(INT8, b_low, b_high))
    products = left.astype(np.float32) * right.astype(np.float32)
    dtype = _mul_dtype(attrs)
    if dtype == FLOAT32:
        return (products * F32(F32(1.0) / in_scale)).astype(np.float32)
    if dtype == INT32:
        out_low, out_high = int32_range(ranges.max_abs(a_low, a_high),
                                        ranges.max_abs(b_low, b_high))
        return products.astype(np.int32), *ranges.range_pair(out_low, out_high)
    out_low, out_high = F32(attrs.min_calib_range), F32(attrs.max_calib_range)
    scale = F32(ranges.quantize_scale(INT8, out_low, out_high) / in_scale)
    # As MXNet 1.9.1 does: truncated, and cast without saturation (a product past the
    # calibrated range wraps around).
    wrapped = np.trunc(products * scale).astype(np.int64).astype(INT8)
    return wrapped, *ranges.range_pair(out_low, out_high)


QUANTIZED_MUL = register(OpDef(
    name="_contrib_quantized_elemwise_mul",
    params=(*CALIB_PARAMS, Param("enable_float_output", parse_bool, False)),
    inputs=("lhs", "rhs", "lhs_min", "lhs_max", "rhs_min", "rhs_max"),
    outputs=lambda attrs: ("output",) if attrs.enable_float_output else RANGE_OUTPUTS,
    infer_shape=lambda attrs, shapes: (
        [shapes[0] or shapes[1], shapes[1] or shapes[0], *[(1,)] * 4],
        [shapes[0] or shapes[1], (1,), (1,)][:1 if attrs.enable_float_output else 3]),
    infer_dtype=lambda attrs, dtypes: (
        [INT8, INT8, *[FLOAT32] * 4],
        [_mul_dtype(attrs), FLOAT32, FLOAT32][:1 if attrs.enable_float_output else 3]),
    kernel=ranges.on_host(_mul_kernel),
    uncapturable=ranges.ON_HOST,
    doc="Product of two int8 tensors: int32 with its range, int8 over the calibrated range, "
        "or float32.",
))
