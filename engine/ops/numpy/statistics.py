"""NumPy-mode statistics: ``average`` (weighted), ``percentile`` and ``histogram``.

``percentile`` follows MXNet's arithmetic rather than NumPy's: the fractional rank is computed
in float32, and ``nearest`` rounds halves away from zero. ``histogram`` counts with a sort and
binary searches (no data-dependent sizes, so a GPU plan still captures it); the last bin is
closed, as in NumPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.kernels.workspace import uploaded
from engine.ops.attrs import (
    choice,
    optional,
    parse_bool,
    parse_float,
    parse_float_tuple,
    parse_int,
    parse_int_tuple,
)
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred

FLOAT32, FLOAT64, INT64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)


def reduced_axes(axis: tuple[int, ...] | None, ndim: int, what: str) -> tuple[int, ...]:
    """``axis`` as sorted non-negative axes (every axis when None)."""
    if axis is None:
        return tuple(range(ndim))
    for item in axis:
        if not -ndim <= item < max(ndim, 1):
            raise ShapeError(f"{what}: axis {item} is out of range for {ndim} dimensions")
    return tuple(sorted({item % ndim for item in axis})) if ndim else ()


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool
                  ) -> tuple[int, ...]:
    """``shape`` with ``axes`` removed (or kept as 1 with ``keepdims``)."""
    if keepdims:
        return tuple(1 if k in axes else size for k, size in enumerate(shape))
    return tuple(size for k, size in enumerate(shape) if k not in axes)


# --- average ----------------------------------------------------------------------------------

def _average_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    a = shapes[0]
    if a is None:
        return shapes, [None] * (2 if attrs.returned else 1)
    axes = reduced_axes(attrs.axis, len(a), "_npi_average")
    result: list[MaybeShape] = [reduced_shape(a, axes, False)]
    if not attrs.weighted:
        result.append(())
    elif shapes[1] is None:
        result.append(None)
    elif len(shapes[1]) != len(a):
        if len(shapes[1]) != 1 or len(axes) != 1 or attrs.axis is None:
            raise ShapeError(f"_npi_average: weights {shapes[1]} differ from a {a}; they must "
                             "then be 1-D along a single axis")
        result.append(())
    else:
        result.append(reduced_shape(shapes[1], axes, False))
    return shapes, result[:2 if attrs.returned else 1]


def _average(xp: Any, attrs: Attrs, a: Any, weights: Any = None) -> Any:
    axes = reduced_axes(attrs.axis, a.ndim, "_npi_average")
    if weights is None:
        mean = a.mean(axis=axes).astype(a.dtype)
        count = xp.full((), a.size // max(mean.size, 1), a.dtype)
        return (mean, count) if attrs.returned else mean
    if weights.ndim != a.ndim:  # 1-D weights along the one reduced axis
        shape = [1] * a.ndim
        shape[axes[0]] = weights.shape[0]
        total = weights.sum()
        weights = weights.reshape(shape)
    else:
        total = weights.sum(axis=axes)
    mean = ((a * weights).sum(axis=axes) / total).astype(a.dtype)
    return (mean, total.astype(a.dtype)) if attrs.returned else mean


register(OpDef(
    name="_npi_average",
    params=(Param("axis", optional(parse_int_tuple), None),
            Param("returned", parse_bool, False),
            Param("weighted", parse_bool, True)),
    inputs=lambda attrs: ("a", "weights") if attrs.weighted else ("a",),
    outputs=lambda attrs: ("avg", "sum_of_weights") if attrs.returned else ("avg",),
    hidden_outputs=lambda attrs: 0 if attrs.returned else 1,
    infer_shape=_average_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]] * (2 if attrs.returned else 1)),
    kernel=_average,
    doc="Weighted average over axis (and the sum of the weights when returned).",
))


# --- percentile -------------------------------------------------------------------------------

def _percentile_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    a = shapes[0]
    q = () if attrs.q_scalar is not None else shapes[1]
    if a is None or q is None:
        return shapes, [None]
    if len(q) > 1:
        raise ShapeError(f"_npi_percentile: q must be a scalar or 1-D; got shape {q}")
    axes = reduced_axes(attrs.axis, len(a), "_npi_percentile")
    return shapes, [(*q, *reduced_shape(a, axes, attrs.keepdims))]


def _ranks(xp: Any, attrs: Attrs, q: Any, count: int) -> tuple[Any, Any, Any]:
    """(below, above, weight of above) per percentile, MXNet's float32 rank arithmetic."""
    rank = ((q * q.dtype.type(count - 1)).astype(FLOAT64) / 100.0).astype(FLOAT32)
    mode = attrs.interpolation
    if mode in ("lower", "higher", "nearest"):
        pick = {"lower": xp.floor, "higher": xp.ceil,
                "nearest": lambda r: xp.floor(r + FLOAT32.type(0.5))}[mode](rank)
        index = pick.astype(INT64)
        return index, index, xp.zeros(rank.shape, FLOAT32)
    if mode == "midpoint":
        rank = ((xp.floor(rank) + xp.ceil(rank)) / 2).astype(FLOAT32)
    below = xp.floor(rank).astype(INT64)
    above = xp.minimum(below + 1, count - 1)
    return below, above, (rank - below.astype(FLOAT32)).astype(FLOAT32)


def _percentile(xp: Any, attrs: Attrs, a: Any, q: Any = None) -> Any:
    out_dtype = FLOAT64 if a.dtype == FLOAT64 else FLOAT32
    if q is None:
        q = uploaded(xp, ("percentile q", attrs.q_scalar),
                     lambda: np.asarray(attrs.q_scalar, FLOAT64))
    axes = reduced_axes(attrs.axis, a.ndim, "_npi_percentile")
    kept = [k for k in range(a.ndim) if k not in axes]
    rows = a.transpose(*kept, *axes).reshape(*(a.shape[k] for k in kept), -1)
    ordered = xp.sort(rows, axis=-1)
    below, above, weight = _ranks(xp, attrs, q.reshape(-1), ordered.shape[-1])
    low = xp.take(ordered, below, axis=-1)
    high = xp.take(ordered, above, axis=-1)
    result = ((low * (1 - weight)).astype(out_dtype) + (high * weight).astype(out_dtype))
    result = xp.moveaxis(result, -1, 0).reshape(
        (*q.shape, *reduced_shape(a.shape, axes, attrs.keepdims)))
    return result.astype(out_dtype)  # astype copies: C-ordered, and 0-d stays 0-d


register(OpDef(
    name="_npi_percentile",
    params=(Param("axis", optional(parse_int_tuple), None),
            Param("interpolation", choice("linear", "lower", "higher", "midpoint", "nearest"),
                  "linear"),
            Param("keepdims", parse_bool, False),
            Param("q_scalar", optional(parse_float), None)),
    inputs=lambda attrs: ("a",) if attrs.q_scalar is not None else ("a", "q"),
    infer_shape=_percentile_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [None if dtypes[0] is None else
                                                FLOAT64 if dtypes[0] == FLOAT64 else FLOAT32]),
    kernel=_percentile,
    doc="q-th percentiles (q in [0, 100], first output axis) over axis.",
))


# --- histogram --------------------------------------------------------------------------------

def _histogram_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    if (attrs.bin_cnt is None) != (attrs.range is None):
        raise ShapeError("_histogram: bin_cnt and range must be given together (or neither); "
                         f"got bin_cnt={attrs.bin_cnt}, range={attrs.range}")
    if attrs.bin_cnt is not None:
        return shapes, [(attrs.bin_cnt,), (attrs.bin_cnt + 1,)]
    bins = shapes[1]
    if bins is None:
        return shapes, [None, None]
    if len(bins) != 1 or 0 < bins[0] < 2:
        raise ShapeError(f"_histogram: bins must be a 1-D array of at least 2 edges; got {bins}")
    return shapes, [(bins[0] - 1 if bins[0] else 0,), bins]


def _uniform_edges(attrs: Attrs, dtype: np.dtype) -> np.ndarray:
    low, high = attrs.range
    if low == high:
        low, high = low - 0.5, high + 0.5
    steps = np.arange(attrs.bin_cnt + 1, dtype=FLOAT64)
    return ((high * steps + (attrs.bin_cnt - steps) * low) / attrs.bin_cnt).astype(dtype)


def _histogram(xp: Any, attrs: Attrs, data: Any, bins: Any = None) -> tuple[Any, Any]:
    if bins is None:
        edges = uploaded(xp, ("histogram edges", attrs.bin_cnt, attrs.range, data.dtype.str),
                         lambda: _uniform_edges(attrs, data.dtype))
    else:
        edges = bins.astype(data.dtype)
    ordered = xp.sort(data.reshape(-1))
    below = xp.searchsorted(ordered, edges, side="left")  # values under each edge
    through_last = xp.searchsorted(ordered, edges[-1:], side="right")
    counts = xp.concatenate([below[1:-1], through_last]) - below[:-1]
    return counts.astype(INT64), edges


register(OpDef(
    name="_histogram",
    aliases=("_npi_histogram",),
    params=(Param("bin_cnt", optional(parse_int), None),
            Param("range", optional(parse_float_tuple), None)),
    inputs=lambda attrs: ("data", "bins") if attrs.bin_cnt is None else ("data",),
    outputs=("hist", "bin_edges"),
    infer_shape=_histogram_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [INT64, dtypes[0]]),
    kernel=_histogram,
    doc="Counts of data in bins (given edges, or bin_cnt equal bins over range) and the edges.",
))
