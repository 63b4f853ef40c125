"""The tail every fused int8 layer shares: int32 sums scaled to the output's int8 range,
with oneDNN's post-ops (activation, residual sum, activation after the sum) in its order."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.kernels import gemm_int8
from engine.ops.dtypes import FLOAT32, INT32, UINT8
from engine.ops.quantized import ranges
from engine.ops.quantized.ranges import F32, INT8
from engine.ops.quantized.subgraph_attrs import NON_NEGATIVE, Activation

INT32_RANGE = F32(2 ** 31)  # |INT32_MIN|: 2**31 - 1 rounds to it in float32 anyway
# Narrow weights (a node's ``narrow_weights``): each channel's largest magnitude is 63.5
# steps, not 127.5, and the weights saturate at ±63, so that the AVX2 kernel for hosts
# without VNNI multiplies them on ``vpmaddubsw`` exactly.
NARROW_RANGE, NARROW_LIMIT = F32(63.5), gemm_int8.NARROW_LIMIT


@dataclass(frozen=True)
class Residual:
    """The int8/uint8 tensor a fused sum adds, with its range."""

    values: np.ndarray
    low: F32
    high: F32


def weight_scales(weight: np.ndarray, bias: np.ndarray | None, data_scale: F32,
                  per_channel: bool, narrow: bool = False) -> np.ndarray:
    """Integer steps per real unit of each output channel's weights (MXNet's
    ``GetWeightScales``): 127.5 over the channel's largest magnitude (63.5 where
    ``narrow``), lowered where the bias would pass half of int32 (oneDNN mishandles biases
    near INT_MAX); one scale for the whole tensor when ``per_channel`` is off."""
    steps = NARROW_RANGE if narrow else ranges.INT8_RANGE
    rows = weight.reshape(weight.shape[0], -1)
    if not per_channel:
        reach = ranges.max_abs(rows.min(), rows.max())
        return np.full(weight.shape[0], steps / reach, dtype=np.float32)
    reach = np.maximum(np.abs(rows.min(axis=1)), np.abs(rows.max(axis=1))).astype(np.float32)
    scales = (steps / reach).astype(np.float32)
    if bias is not None:
        with np.errstate(divide="ignore"):
            limit = np.where(bias > 0, F32(2 ** 31 - 1), F32(-(2 ** 31))).astype(np.float32)
            cap = (limit / F32(2) / bias / data_scale).astype(np.float32)
        scales = np.where(bias != 0, np.minimum(scales, cap), scales).astype(np.float32)
    return scales


def quantized_weight_bias(weight: np.ndarray, bias: np.ndarray | None, data_scale: F32,
                          scales: np.ndarray, narrow: bool = False
                          ) -> tuple[np.ndarray, np.ndarray | None]:
    """int8 weights and int32 bias: the bias's steps are the data's times the weight's.
    ``narrow``: the weights saturate at ±`NARROW_LIMIT` (their scales `weight_scales`'
    narrow ones)."""
    shape = (-1,) + (1,) * (weight.ndim - 1)
    weight_q = ranges.saturate_round(weight * scales.reshape(shape), INT8)
    if narrow:
        np.clip(weight_q, -NARROW_LIMIT, NARROW_LIMIT, out=weight_q)
    if bias is None:
        return weight_q, None
    bias_scales = (data_scale * scales).astype(np.float32)
    return weight_q, ranges.saturate_round(bias * bias_scales, INT32)


def output_dtype(calibrated: bool, float_output: bool, last_act: Activation | None) -> np.dtype:
    """int8, or uint8 after an activation that is never negative; int32 uncalibrated;
    float32 with the dequantize fused in."""
    if float_output:
        return FLOAT32
    if not calibrated:
        return INT32
    return UINT8 if last_act is not None and last_act.kind in NON_NEGATIVE else INT8


def int32_range(data_reach: F32, weight_reach: F32) -> tuple[F32, F32]:
    """The real range int32 sums cover by MXNet's rule (``QuantizationRangeForMultiplication``
    over signed ranges, as its standalone int8 products report it): each side's step is its
    reach over 127, and the sums reach 2**31 steps."""
    step = F32(F32(data_reach / F32(127.0)) * F32(weight_reach / F32(127.0)))
    reach = F32(step * INT32_RANGE)
    return -reach, reach


def finish(sums: np.ndarray, scales: np.ndarray, channel_axis: int, dtype: np.dtype,
           act: Activation | None = None, residual: tuple[np.ndarray, F32] | None = None,
           postsum_act: Activation | None = None, act_scale: F32 | None = None) -> np.ndarray:
    """oneDNN's output stage: ``sums * scales[c]``, the activation (scaled by ``act_scale``
    when the scales give real values), the residual times its scale, the activation after the
    sum, then rounding to ``dtype`` (float32 stays float)."""
    shape = [1] * sums.ndim
    shape[channel_axis] = -1
    values = sums.astype(np.float32) * scales.astype(np.float32).reshape(shape)
    if act is not None:
        values = act.apply(values)
        if act_scale is not None:
            values = values * act_scale
    if residual is not None:
        values = values + residual[1] * residual[0].astype(np.float32)
    if postsum_act is not None:
        values = postsum_act.apply(values)
    if dtype == FLOAT32:
        return values.astype(np.float32)
    return ranges.saturate_round(values, dtype)
