"""oneDNN's self-attention products on interleaved projections: ``_sg_mkldnn_selfatt_qk``
(queries times keys) and ``_sg_mkldnn_selfatt_valatt`` (attention times values).

The projections arrive as one ``(length, batch, heads * 3 * head_dim)`` tensor, each head's
query, key and value side by side (``_contrib_interleaved_matmul_selfatt_*``'s layout); the
products run per (batch, head) pair, numbered ``batch * heads + head``. Quantized, the inputs
are int8 (the attention weights uint8) and the output is float32, int8 over the calibrated
range, or int32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import parse_bool, parse_int
from engine.ops.dtypes import FLOAT32, INT32, UINT8
from engine.ops.quantized import integer, ranges
from engine.ops.quantized.ranges import CALIB_PARAMS, F32, INT8, RANGE_OUTPUTS
from engine.ops.quantized.requantize import int32_range
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register

PARAMS = (Param("heads", parse_int), Param("quantized", parse_bool, False),
          Param("enable_float_output", parse_bool, False), *CALIB_PARAMS)


def _split(qkv: np.ndarray, heads: int, op: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Queries, keys and values as ``(batch * heads, length, head_dim)`` each."""
    if qkv.ndim != 3 or qkv.shape[2] % (3 * heads):
        raise ShapeError(f"{op}: queries_keys_values has shape {qkv.shape}; expected (length, "
                         f"batch, heads * 3 * head_dim) with heads={heads}")
    length, batch, width = qkv.shape
    head_dim = width // 3 // heads
    parts = qkv.reshape(length, batch * heads, 3, head_dim).transpose(2, 1, 0, 3)
    return parts[0], parts[1], parts[2]


def _outputs(attrs: Attrs) -> tuple[str, ...]:
    return RANGE_OUTPUTS if attrs.quantized and not attrs.enable_float_output else ("output",)


def _out_dtype(attrs: Attrs) -> np.dtype:
    if not attrs.quantized or attrs.enable_float_output:
        return FLOAT32
    return INT8 if ranges.has_calib(attrs) else INT32


def _finish(attrs: Attrs, sums: np.ndarray, scale: F32, reach: tuple[F32, F32]) -> Any:
    """Scaled sums as the attrs ask: float32, int8 over the calibrated range, or int32."""
    dtype = _out_dtype(attrs)
    if dtype == FLOAT32:
        return (sums.astype(np.float32) * scale).astype(np.float32)
    if dtype == INT32:
        return (ranges.saturate_round(sums, INT32), *ranges.range_pair(*reach))
    low, high = F32(attrs.min_calib_range), F32(attrs.max_calib_range)
    return (ranges.saturate_round(sums.astype(np.float32) * scale, INT8),
            *ranges.range_pair(low, high))


def _qk_shapes(attrs: Attrs, shapes: list[MaybeShape]) -> tuple[list, list]:
    qkv = shapes[0]
    out = None if qkv is None else (qkv[1] * attrs.heads, qkv[0], qkv[0])
    extra = [(1,)] * (len(shapes) - 1)
    return [qkv, *extra], [out, *((1,), (1,))[:len(_outputs(attrs)) - 1]]


def _qk_kernel(xp: Any, attrs: Attrs, qkv: Any, *range_inputs: Any) -> Any:
    op = "_sg_mkldnn_selfatt_qk"
    values = np.asarray(qkv)
    queries, keys, _ = _split(values, attrs.heads, op)
    head_dim = queries.shape[-1]
    root = F32(np.sqrt(F32(head_dim)))
    if not attrs.quantized:
        product = np.matmul(queries.astype(np.float32), keys.astype(np.float32).transpose(0, 2, 1))
        return (product / root).astype(np.float32)
    ranges.check_quantized(values, "queries_keys_values", op, (INT8,))
    low, high = ranges.scalar(range_inputs[0]), ranges.scalar(range_inputs[1])
    data_scale = ranges.quantize_scale(INT8, low, high)
    sums = integer.matmul(queries, keys.transpose(0, 2, 1))
    if _out_dtype(attrs) == INT8:
        scale = F32(ranges.quantize_scale(INT8, attrs.min_calib_range, attrs.max_calib_range)
                    / F32(data_scale * data_scale))
    else:
        scale = F32(F32(1.0) / F32(data_scale * data_scale))
    reach = ranges.max_abs(low, high)
    return _finish(attrs, sums, F32(scale / root), int32_range(reach, reach))


SELFATT_QK = register(OpDef(
    name="_sg_mkldnn_selfatt_qk",
    params=PARAMS,
    inputs=lambda attrs: ("queries_keys_values", "min_qkv", "max_qkv") if attrs.quantized
    else ("queries_keys_values",),
    outputs=_outputs,
    infer_shape=_qk_shapes,
    infer_dtype=lambda attrs, dtypes: (
        [dtypes[0] or (INT8 if attrs.quantized else FLOAT32), *[FLOAT32] * (len(dtypes) - 1)],
        [_out_dtype(attrs), FLOAT32, FLOAT32][:len(_outputs(attrs))]),
    kernel=ranges.on_host(_qk_kernel),
    uncapturable=ranges.ON_HOST,
    doc="Per head, queries times keys over sqrt(head_dim), from interleaved projections.",
))


def _valatt_shapes(attrs: Attrs, shapes: list[MaybeShape]) -> tuple[list, list]:
    qkv = shapes[0]
    out = None if qkv is None else (qkv[0], qkv[1], qkv[2] // 3)
    extra = [(1,)] * (len(shapes) - 2)
    return [qkv, shapes[1], *extra], [out, *((1,), (1,))[:len(_outputs(attrs)) - 1]]


def _valatt_kernel(xp: Any, attrs: Attrs, qkv: Any, attention: Any, *range_inputs: Any) -> Any:
    op = "_sg_mkldnn_selfatt_valatt"
    values, weights = np.asarray(qkv), np.asarray(attention)
    _, _, vals = _split(values, attrs.heads, op)
    length, batch = values.shape[:2]
    if weights.shape != (vals.shape[0], length, length):
        raise ShapeError(f"{op}: attention has shape {weights.shape}; expected "
                         f"{(vals.shape[0], length, length)} for queries_keys_values "
                         f"{values.shape}")

    def interleave(heads_out: np.ndarray) -> np.ndarray:  # (B*H, L, d) -> (L, B, H*d)
        return heads_out.transpose(1, 0, 2).reshape(length, batch, -1)

    if not attrs.quantized:
        product = np.matmul(weights.astype(np.float32), vals.astype(np.float32))
        return interleave(product).astype(np.float32)
    ranges.check_quantized(values, "queries_keys_values", op, (INT8,))
    ranges.check_quantized(weights, "attention", op, (UINT8,))
    (qkv_low, qkv_high), (att_low, att_high) = ranges.ranges_of(range_inputs, 0, 2)
    qkv_scale = ranges.quantize_scale(INT8, qkv_low, qkv_high)
    att_scale = ranges.quantize_scale(UINT8, att_low, att_high)
    sums = interleave(integer.matmul(weights, vals))
    if _out_dtype(attrs) == INT8:
        scale = F32(ranges.quantize_scale(INT8, attrs.min_calib_range, attrs.max_calib_range)
                    / F32(qkv_scale * att_scale))
    else:
        scale = F32(F32(1.0) / F32(qkv_scale * att_scale))
    reach = int32_range(ranges.max_abs(att_low, att_high), ranges.max_abs(qkv_low, qkv_high))
    return _finish(attrs, sums, scale, reach)


SELFATT_VALATT = register(OpDef(
    name="_sg_mkldnn_selfatt_valatt",
    params=PARAMS,
    inputs=lambda attrs: ("queries_keys_values", "attention", "min_qkv", "max_qkv", "min_att",
                          "max_att") if attrs.quantized else ("queries_keys_values", "attention"),
    outputs=_outputs,
    infer_shape=_valatt_shapes,
    infer_dtype=lambda attrs, dtypes: (
        [dtypes[0] or (INT8 if attrs.quantized else FLOAT32),
         dtypes[1] or (UINT8 if attrs.quantized else FLOAT32), *[FLOAT32] * (len(dtypes) - 2)],
        [_out_dtype(attrs), FLOAT32, FLOAT32][:len(_outputs(attrs))]),
    kernel=ranges.on_host(_valatt_kernel),
    uncapturable=ranges.ON_HOST,
    doc="Per head, attention weights times values, written back interleaved by head.",
))
