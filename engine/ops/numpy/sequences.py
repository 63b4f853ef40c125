"""NumPy-mode sequences and padding: ``diag_indices_from``, ``ediff1d``, ``linspace``, ``pad``
and the power-distribution sampler ``powerd``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import (
    choice,
    optional,
    parse_bool,
    parse_dtype,
    parse_float,
    parse_int,
    parse_int_tuple,
    parse_literal,
    parse_str,
)
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred

FLOAT32, FLOAT64, INT64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)


# --- diag_indices_from ------------------------------------------------------------------------

def _diag_indices_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    shape = shapes[0]
    if shape is None:
        return shapes, [None]
    if len(shape) < 2 or len({size for size in shape if size}) > 1:
        raise ShapeError(f"_npi_diag_indices_from: data must have at least 2 dimensions of "
                         f"equal size; got {shape}")
    return shapes, [(len(shape), max(shape))]


register(OpDef(
    name="_npi_diag_indices_from",
    infer_shape=_diag_indices_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [INT64]),
    kernel=lambda xp, attrs, data: xp.ascontiguousarray(xp.broadcast_to(
        xp.arange(data.shape[0], dtype=INT64), (data.ndim, data.shape[0]))),
    doc="Indices of the main diagonal of an n-dimensional cube, one row per axis.",
))


# --- ediff1d ----------------------------------------------------------------------------------

def _ediff1d_inputs(attrs: Attrs) -> tuple[str, ...]:
    count = 1 + attrs.to_begin_arr_given + attrs.to_end_arr_given
    return ("input1", "input2", "input3")[:count]


def _ediff1d_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    if any(shape is None or not all(shape) for shape in shapes):
        return shapes, [None]
    sizes = [int(np.prod(shape)) for shape in shapes]
    length = max(sizes[0] - 1, 0) + sum(sizes[1:])
    length += sum(1 for given, scalar in ((attrs.to_begin_arr_given, attrs.to_begin_scalar),
                                          (attrs.to_end_arr_given, attrs.to_end_scalar))
                  if not given and scalar is not None)
    return shapes, [(length,)]


def _ediff1d(xp: Any, attrs: Attrs, data: Any, *ends: Any) -> Any:
    flat = data.reshape(-1)
    arrays = list(ends)
    parts = [flat[1:] - flat[:-1]]
    for given, scalar, at in ((attrs.to_begin_arr_given, attrs.to_begin_scalar, 0),
                              (attrs.to_end_arr_given, attrs.to_end_scalar, None)):
        if given:
            extra = arrays.pop(0).reshape(-1).astype(data.dtype)
        elif scalar is not None:
            extra = xp.full((1,), scalar, data.dtype)
        else:
            continue
        parts.insert(0 if at == 0 else len(parts), extra)
    return xp.concatenate(parts).astype(data.dtype)


register(OpDef(
    name="_npi_ediff1d",
    params=(Param("to_begin_arr_given", parse_bool, False),
            Param("to_end_arr_given", parse_bool, False),
            Param("to_begin_scalar", optional(parse_float), None),
            Param("to_end_scalar", optional(parse_float), None)),
    inputs=_ediff1d_inputs,
    infer_shape=_ediff1d_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=_ediff1d,
    doc="Differences of consecutive flattened elements, with values put before and after.",
))


# --- linspace ---------------------------------------------------------------------------------

def _linspace(xp: Any, attrs: Attrs) -> Any:
    # MXNet adds start + step * i in double precision and casts (truncating for integers);
    # the last value is not forced to stop.
    intervals = attrs.num - 1 if attrs.endpoint else attrs.num
    step = (attrs.stop - attrs.start) / intervals if intervals > 0 else 0.0
    return (attrs.start + step * xp.arange(attrs.num, dtype=FLOAT64)).astype(attrs.dtype)


def _linspace_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    if attrs.num < 0:
        raise ShapeError(f"_linspace: num must be non-negative; got {attrs.num}")
    return shapes, [(attrs.num,)]


register(OpDef(
    name="_linspace",
    aliases=("_npi_linspace",),
    params=(Param("start", parse_float), Param("stop", parse_float), Param("num", parse_int),
            Param("endpoint", parse_bool, True), Param("ctx", parse_str, ""),
            Param("dtype", parse_dtype, FLOAT32)),
    inputs=(),
    infer_shape=_linspace_infer,
    infer_dtype=lambda attrs, dtypes: ([], [attrs.dtype]),
    kernel=_linspace,
    doc="num evenly spaced values from start to stop (stop left out unless endpoint).",
))


# --- pad --------------------------------------------------------------------------------------

def _pad_widths(attrs: Attrs, ndim: int) -> tuple[tuple[int, int], ...]:
    widths = attrs.pad_width
    if len(widths) == 1:
        widths = widths * ndim
    if len(widths) != ndim or any(len(pair) != 2 or min(pair) < 0 for pair in widths):
        raise ShapeError(f"_npi_pad: pad_width {attrs.pad_width} must give a (before, after) "
                         f"pair of non-negative sizes for each of the {ndim} axes")
    return tuple((int(before), int(after)) for before, after in widths)


def _pad_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    shape = shapes[0]
    if shape is None:
        return shapes, [None]
    widths = _pad_widths(attrs, len(shape))
    return shapes, [tuple(size and size + before + after
                          for size, (before, after) in zip(shape, widths))]


def _pad(xp: Any, attrs: Attrs, data: Any) -> Any:
    widths = _pad_widths(attrs, data.ndim)
    if attrs.mode == "constant":
        return xp.pad(data, widths, mode="constant", constant_values=attrs.constant_value)
    if attrs.mode in ("reflect", "symmetric"):
        return xp.pad(data, widths, mode=attrs.mode, reflect_type=attrs.reflect_type)
    return xp.pad(data, widths, mode=attrs.mode)


def parse_pairs(value: Any) -> tuple[tuple[int, ...], ...]:
    """``"((1, 2), (0, 1))"`` (or the Python value): a tuple of int tuples."""
    if isinstance(value, str):
        try:
            value = parse_literal(value)
        except ValueError:
            raise ValueError(f"expected a tuple of (before, after) pairs, got {value!r}") from None
    if not isinstance(value, (tuple, list)):
        raise ValueError(f"expected a tuple of (before, after) pairs, got {value!r}")
    return tuple(parse_int_tuple(item) for item in value)


register(OpDef(
    name="_npi_pad",
    params=(Param("pad_width", parse_pairs),
            Param("mode", choice("constant", "edge", "reflect", "symmetric", "maximum",
                                 "minimum"), "constant"),
            Param("constant_value", parse_float, 0.0),
            Param("reflect_type", choice("even", "odd"), "even")),
    infer_shape=_pad_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=_pad,
    doc="Pad each axis by (before, after) elements in one of NumPy's modes.",
))


# --- powerd -----------------------------------------------------------------------------------

def _powerd_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    if attrs.size is not None:
        return shapes, [attrs.size]
    if attrs.a is not None:
        return shapes, [()]
    return shapes, [shapes[0]]


def _powerd(xp: Any, attrs: Attrs, a: Any = None) -> Any:
    """Samples of the power distribution, (1 - U) ** (1 / a) for U uniform in [0, 1)."""
    shape = attrs.size if attrs.size is not None else (() if a is None else a.shape)
    exponent = (1.0 / attrs.a) if a is None else 1.0 / a.astype(FLOAT32)
    uniform = xp.random.random_sample(tuple(shape)).astype(FLOAT32)
    return ((1 - uniform) ** exponent).astype(FLOAT32)


register(OpDef(
    name="_npi_powerd",
    params=(Param("a", optional(parse_float), None),
            Param("size", optional(parse_int_tuple), None)),
    inputs=lambda attrs: () if attrs.a is not None else ("input1",),
    infer_shape=_powerd_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [FLOAT32]),
    kernel=_powerd,
    doc="Random samples of the power distribution with exponent a - 1 (a > 0).",
))
