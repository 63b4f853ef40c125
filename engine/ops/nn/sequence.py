"""Sequence operators over (time, batch, ...) data: ``SequenceLast``, ``SequenceMask``,
``SequenceReverse``."""

from __future__ import annotations

from typing import Any

from engine.errors import ShapeError
from engine.ops.attrs import (
    parse_bool,
    parse_float,
    parse_int,
)
from engine.ops.dtypes import INT64
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred, merge, normalize_axis


def _sequence_inputs(attrs: Attrs) -> tuple[str, ...]:
    return ("data", "sequence_length") if attrs.use_sequence_length else ("data",)


def _sequence_params(value: bool) -> tuple[Param, ...]:
    params = (Param("use_sequence_length", parse_bool, False), Param("axis", parse_int, 0))
    return (*params, Param("value", parse_float, 0.0)) if value else params


def _batch_axis(attrs: Attrs, ndim: int) -> tuple[int, int]:
    if ndim < 2:
        raise ShapeError(f"sequence ops need at least 2 axes (time and batch), got {ndim}")
    axis = normalize_axis(attrs.axis, ndim, "sequence axis")
    if axis > 1:
        raise ShapeError(f"sequence axis must be 0 or 1, got {attrs.axis}")
    return axis, 1 - axis


def _sequence_infer(drop_axis: bool) -> Any:
    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        data = shapes[0]
        if data is None:
            return shapes, [None]
        axis, batch = _batch_axis(attrs, len(data))
        result = [data]
        if attrs.use_sequence_length:
            result.append(merge(shapes[1], (data[batch],), "sequence_length"))
        out = (*data[:axis], *data[axis + 1:]) if drop_axis else data
        return result, [out]

    return infer


def _time_major(xp: Any, attrs: Attrs, data: Any) -> Any:
    """``data`` as (time, batch, ...) whatever the sequence axis."""
    axis, _ = _batch_axis(attrs, data.ndim)
    return data if axis == 0 else xp.swapaxes(data, 0, 1)


def _sequence_last(xp: Any, attrs: Attrs, data: Any, lengths: Any = None) -> Any:
    steps = _time_major(xp, attrs, data)
    if lengths is None:
        return steps[-1].copy()
    last = xp.clip(lengths.astype(INT64) - 1, 0, steps.shape[0] - 1)
    return steps[last, xp.arange(steps.shape[1])]


def _valid_steps(xp: Any, steps: Any, lengths: Any) -> Any:
    """(time, batch) mask of the steps inside each sequence's length."""
    return xp.arange(steps.shape[0])[:, None] < lengths.astype(INT64)[None, :]


def _sequence_mask(xp: Any, attrs: Attrs, data: Any, lengths: Any = None) -> Any:
    if lengths is None:
        return data.copy()
    steps = _time_major(xp, attrs, data)
    mask = _valid_steps(xp, steps, lengths).reshape(steps.shape[:2] + (1,) * (steps.ndim - 2))
    masked = xp.where(mask, steps, xp.full((), attrs.value, dtype=data.dtype))
    return masked if attrs.axis % data.ndim == 0 else xp.swapaxes(masked, 0, 1).copy()


def _sequence_reverse(xp: Any, attrs: Attrs, data: Any, lengths: Any = None) -> Any:
    steps = _time_major(xp, attrs, data)
    if lengths is None:
        reversed_steps = steps[::-1]
    else:
        time = xp.arange(steps.shape[0])[:, None]
        length = lengths.astype(INT64)[None, :]
        source = xp.where(time < length, length - 1 - time, time)
        reversed_steps = steps[source, xp.arange(steps.shape[1])[None, :]]
    result = reversed_steps if attrs.axis % data.ndim == 0 else xp.swapaxes(reversed_steps, 0, 1)
    return result.copy()


def _sequence_dtype(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    return dtypes, [dtypes[0]]


for _name, _kernel, _drop, _value in (
        ("SequenceLast", _sequence_last, True, False),
        ("SequenceMask", _sequence_mask, False, True),
        ("SequenceReverse", _sequence_reverse, False, False)):
    register(OpDef(
        name=_name,
        params=_sequence_params(_value),
        inputs=_sequence_inputs,
        infer_shape=_sequence_infer(_drop),
        infer_dtype=_sequence_dtype,
        kernel=_kernel,
        doc=f"{_name} over (time, batch, ...) data (axis picks time), with optional lengths.",
    ))
