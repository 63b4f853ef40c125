"""The standalone int8 products MXNet's ``quantize_model`` writes where no oneDNN fusion pass
ran: ``_contrib_quantized_conv`` and ``_contrib_quantized_fully_connected``. Both take int8
weights and bias with their ranges and give int32 sums with the range they stand for; a
``_contrib_requantize`` follows.

MXNet 1.9.1's oneDNN convolution (uint8 data only) adds the int8 bias to the sums as it is,
unscaled; its fully connected layer rescales the bias onto the sums' scale and truncates. The
engine does both as MXNet does, so that the exports give MXNet's numbers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.dtypes import FLOAT32, INT32, UINT8
from engine.ops.nn import conv, dense
from engine.ops.quantized import integer, ranges
from engine.ops.quantized.ranges import F32, INT8, RANGE_OUTPUTS
from engine.ops.quantized.requantize import int32_range
from engine.ops.registry import Attrs, MaybeShape, OpDef, register


def _inputs(attrs: Attrs) -> tuple[str, ...]:
    if attrs.no_bias:
        return ("data", "weight", "min_data", "max_data", "min_weight", "max_weight")
    return ("data", "weight", "bias", "min_data", "max_data", "min_weight", "max_weight",
            "min_bias", "max_bias")


def _shapes(main: OpDef) -> Any:
    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> tuple[list, list]:
        count = 2 if attrs.no_bias else 3
        main_in, main_out = main.infer_shape(attrs, list(shapes[:count]))
        return [*main_in, *[(1,)] * (len(shapes) - count)], [main_out[0], (1,), (1,)]

    return infer


def _dtypes(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    count = 2 if attrs.no_bias else 3
    known = [dtypes[0], INT8, *([] if attrs.no_bias else [INT8]),
             *[FLOAT32] * (len(dtypes) - count)]
    return known, [INT32, FLOAT32, FLOAT32]


def _read(op: str, attrs: Attrs, inputs: tuple[Any, ...]) -> dict[str, Any]:
    values = dict(zip(_inputs(attrs), inputs, strict=True))
    ranges.check_quantized(np.asarray(values["data"]), "data", op)
    ranges.check_quantized(np.asarray(values["weight"]), "weight", op, (INT8,))
    if not attrs.no_bias:
        ranges.check_quantized(np.asarray(values["bias"]), "bias", op, (INT8,))
    return values


def _reaches(values: dict[str, Any]) -> tuple[F32, F32]:
    return (ranges.max_abs(ranges.scalar(values["min_data"]), ranges.scalar(values["max_data"])),
            ranges.max_abs(ranges.scalar(values["min_weight"]),
                           ranges.scalar(values["max_weight"])))


def _conv_kernel(xp: Any, attrs: Attrs, *inputs: Any) -> Any:
    op = "_contrib_quantized_conv"
    values = _read(op, attrs, inputs)
    data = np.asarray(values["data"])
    if data.dtype != UINT8:
        raise ShapeError(f"{op}: input 'data' has dtype {data.dtype}; MXNet's oneDNN "
                         "quantized convolution reads uint8 only")
    ndim = len(attrs.kernel)
    sums = integer.conv(data, values["weight"], attrs.kernel, attrs.stride or (1,) * ndim,
                        attrs.dilate or (1,) * ndim, attrs.pad or (0,) * ndim, attrs.num_group)
    if not attrs.no_bias:  # as MXNet 1.9.1 does: the int8 bias, not rescaled
        sums += np.asarray(values["bias"], dtype=np.float64).reshape((1, -1) + (1,) * ndim)
    return ranges.saturate_round(sums, INT32), *ranges.range_pair(*int32_range(*_reaches(values)))


QUANTIZED_CONV = register(OpDef(
    name="_contrib_quantized_conv",
    params=conv.CONVOLUTION.params,
    inputs=_inputs,
    outputs=RANGE_OUTPUTS,
    infer_shape=_shapes(conv.CONVOLUTION),
    infer_dtype=_dtypes,
    kernel=ranges.on_host(_conv_kernel),
    uncapturable=ranges.ON_HOST,
    doc="Convolution of uint8 data with int8 weights into int32 sums and their range.",
))


def _fc_kernel(xp: Any, attrs: Attrs, *inputs: Any) -> Any:
    values = _read("_contrib_quantized_fully_connected", attrs, inputs)
    data = np.asarray(values["data"])
    rows = data.reshape(data.shape[0], -1) if attrs.flatten else data.reshape(-1, data.shape[-1])
    sums = integer.matmul(rows, np.asarray(values["weight"]).T)
    data_reach, weight_reach = _reaches(values)
    if not attrs.no_bias:
        data_scale = F32(ranges.QUANTIZED_RANGE[np.dtype(data.dtype)] / data_reach)
        weight_scale = F32(ranges.INT8_RANGE / weight_reach)
        bias_reach = ranges.max_abs(ranges.scalar(values["min_bias"]),
                                    ranges.scalar(values["max_bias"]))
        rescale = F32(F32(F32(data_scale * weight_scale) * bias_reach) / ranges.INT8_RANGE)
        # C's float-to-int conversion: truncation toward zero
        sums += np.trunc(np.asarray(values["bias"], dtype=np.float32) * rescale)
    shape = (data.shape[0], attrs.num_hidden) if attrs.flatten else (
        *data.shape[:-1], attrs.num_hidden)
    return ranges.saturate_round(sums, INT32).reshape(shape), *ranges.range_pair(
        *int32_range(data_reach, weight_reach))


QUANTIZED_FC = register(OpDef(
    name="_contrib_quantized_fully_connected",
    params=dense.FULLY_CONNECTED.params,
    inputs=_inputs,
    outputs=RANGE_OUTPUTS,
    infer_shape=_shapes(dense.FULLY_CONNECTED),
    infer_dtype=_dtypes,
    kernel=ranges.on_host(_fc_kernel),
    uncapturable=ranges.ON_HOST,
    doc="FullyConnected of int8/uint8 data with int8 weights into int32 sums and their range.",
))
