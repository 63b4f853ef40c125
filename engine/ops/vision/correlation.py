"""FlowNet's ``Correlation``: how well patches of data1 match displaced patches of data2.

Output channel ``(p + r) * (2r + 1) + (o + r)`` holds the displacement of ``p * stride2`` rows
and ``o * stride2`` columns (``r = max_displacement // stride2``); each value is the mean over
a ``kernel_size`` square and all channels of the product (or absolute difference) of the two
zero-padded inputs.
"""

from __future__ import annotations

import math
from typing import Any

from engine.errors import ShapeError
from engine.ops.attrs import parse_bool, parse_int
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred


def _geometry(attrs: Attrs, height: int, width: int) -> tuple[int, int, int]:
    """(grid radius, output height, output width)."""
    border = attrs.max_displacement + (attrs.kernel_size - 1) // 2
    out_h = math.ceil((height + 2 * attrs.pad_size - 2 * border) / attrs.stride1)
    out_w = math.ceil((width + 2 * attrs.pad_size - 2 * border) / attrs.stride1)
    if out_h <= 0 or out_w <= 0:
        raise ShapeError(f"Correlation: a {height}x{width} input with pad_size {attrs.pad_size} "
                         f"is too small for max_displacement {attrs.max_displacement} and "
                         f"kernel_size {attrs.kernel_size}")
    return attrs.max_displacement // attrs.stride2, out_h, out_w


def _infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    first, second = shapes
    data = first if first is not None else second
    if data is None:
        return shapes, [None]
    if len(data) != 4:
        raise ShapeError(f"Correlation: inputs must be 4-D (N, C, H, W); got {data}")
    if first is not None and second is not None and first != second:
        raise ShapeError(f"Correlation: data1 {first} and data2 {second} must have one shape")
    radius, out_h, out_w = _geometry(attrs, data[2], data[3])
    return [data, data], [(data[0], (2 * radius + 1) ** 2, out_h, out_w)]


def _padded(xp: Any, data: Any, pad: int) -> Any:
    """``data`` zero-padded on both spatial axes (CuPy's ``pad`` copies from the host, which a
    CUDA graph capture refuses)."""
    if not pad:
        return data
    batch, channels, height, width = data.shape
    padded = xp.zeros((batch, channels, height + 2 * pad, width + 2 * pad), data.dtype)
    padded[:, :, pad:pad + height, pad:pad + width] = data
    return padded


def _kernel(xp: Any, attrs: Attrs, data1: Any, data2: Any) -> Any:
    first, second = _padded(xp, data1, attrs.pad_size), _padded(xp, data2, attrs.pad_size)
    radius, out_h, out_w = _geometry(attrs, data1.shape[2], data1.shape[3])

    def window(padded: Any, row: int, col: int) -> Any:
        # The output grid from (row, col) on: strided slices, so no index table is needed.
        return padded[:, :, row:row + (out_h - 1) * attrs.stride1 + 1:attrs.stride1,
                      col:col + (out_w - 1) * attrs.stride1 + 1:attrs.stride1]

    size, start, step = attrs.kernel_size, attrs.max_displacement, attrs.stride2
    # Written channel by channel: CuPy's stack of this many arrays uploads a pointer table from
    # the host, which a CUDA graph capture refuses.
    result = xp.empty((data1.shape[0], (2 * radius + 1) ** 2, out_h, out_w), data1.dtype)
    channel = 0
    for dy in range(-radius, radius + 1):
        for dx in range(-radius, radius + 1):
            total = 0
            for h in range(size):
                for w in range(size):
                    a = window(first, start + h, start + w)
                    b = window(second, start + h + dy * step, start + w + dx * step)
                    total = total + (a * b if attrs.is_multiply else xp.abs(a - b)).sum(axis=1)
            result[:, channel] = total / (size * size * data1.shape[1])
            channel += 1
    return result


register(OpDef(
    name="Correlation",
    params=(
        Param("kernel_size", parse_int, 1),
        Param("max_displacement", parse_int, 1),
        Param("stride1", parse_int, 1),
        Param("stride2", parse_int, 1),
        Param("pad_size", parse_int, 0),
        Param("is_multiply", parse_bool, True),
    ),
    inputs=("data1", "data2"),
    hidden_outputs=2,
    infer_shape=_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=_kernel,
    doc="Patch correlation of data1 with data2 at every displacement up to max_displacement.",
))
