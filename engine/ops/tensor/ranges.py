"""Evenly spaced values: ``_arange`` (from attributes) and ``_contrib_arange_like`` (from a shape).

Both accept ``repeat``: every value appears that many times in a row, as MXNet writes it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import optional, parse_bool, parse_dtype, parse_float, parse_int, parse_str
from engine.ops.dtypes import FLOAT32
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred, normalize_axis


def _bounds(attrs: Attrs) -> tuple[float, float]:
    """(start, stop): a missing stop means the range is ``[0, start)``, as in Python."""
    if attrs.stop is None:
        return 0.0, attrs.start
    return attrs.start, attrs.stop


def range_length(attrs: Attrs) -> int:
    """How many values ``_arange`` produces, repeats included."""
    if attrs.step == 0:
        raise ShapeError("_arange: step must not be 0")
    start, stop = _bounds(attrs)
    return max(math.ceil((stop - start) / attrs.step), 0) * attrs.repeat


def repeated_range(xp: Any, length: int, start: float, step: float, repeat: int,
                   dtype: Any) -> Any:
    """``start + step * (i // repeat)`` for ``i`` in ``[0, length)``, computed in float64."""
    index = xp.arange(length, dtype=np.int64) // repeat
    return (start + step * index.astype(np.float64)).astype(dtype)


def _arange_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    if attrs.infer_range and attrs.stop is None:
        raise ShapeError("_arange: infer_range without stop needs the output shape from "
                         "elsewhere in the graph, which this engine does not support")
    return [], [(range_length(attrs),)]


def _arange_kernel(xp: Any, attrs: Attrs) -> Any:
    start, _ = _bounds(attrs)
    return repeated_range(xp, range_length(attrs), start, attrs.step, attrs.repeat, attrs.dtype)


register(OpDef(
    name="_arange",
    aliases=("_npi_arange",),
    params=(
        Param("start", parse_float),
        Param("stop", optional(parse_float), None),
        Param("step", parse_float, 1.0),
        Param("repeat", parse_int, 1),
        Param("infer_range", parse_bool, False),
        Param("ctx", parse_str, ""),
        Param("dtype", parse_dtype, FLOAT32),
    ),
    inputs=(),
    infer_shape=_arange_infer,
    infer_dtype=lambda attrs, dtypes: ([], [attrs.dtype]),
    kernel=_arange_kernel,
    doc="Values from start (inclusive) to stop (exclusive) by step, each repeated repeat times.",
))


def _arange_like_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return shapes, [None]
    if attrs.axis is None:
        return shapes, [data]
    return shapes, [(data[normalize_axis(attrs.axis, len(data), "arange_like axis")],)]


def _arange_like_kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    _, (shape,) = _arange_like_infer(attrs, [data.shape])
    length = math.prod(shape)
    values = repeated_range(xp, length, attrs.start, attrs.step, attrs.repeat, data.dtype)
    return values.reshape(shape)


register(OpDef(
    name="_contrib_arange_like",
    aliases=("_npx_arange_like",),
    params=(
        Param("start", parse_float, 0.0),
        Param("step", parse_float, 1.0),
        Param("repeat", parse_int, 1),
        Param("ctx", parse_str, ""),
        Param("axis", optional(parse_int), None),
    ),
    infer_shape=_arange_like_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=_arange_like_kernel,
    doc="A range shaped like data (or as long as data's axis), in data's dtype.",
))
