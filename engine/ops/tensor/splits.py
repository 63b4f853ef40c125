"""``_split_v2`` and NumPy's ``hsplit``/``dsplit``: split at boundaries or into equal sections.

``indices`` holds the starts of the pieces (MXNet's front ends prepend 0); with ``sections``
above 0 the axis is cut into that many equal pieces instead.
"""

from __future__ import annotations

from typing import Any

from engine.errors import ShapeError
from engine.ops.attrs import parse_bool, parse_int, parse_int_tuple
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred, normalize_axis


def _axis(name: str, attrs: Attrs, ndim: int) -> int:
    if name == "_npi_hsplit":
        return 0 if ndim == 1 else 1
    return normalize_axis(attrs.axis, ndim, f"{name} axis")


def _bounds(name: str, attrs: Attrs, length: int) -> list[tuple[int, int]]:
    if attrs.sections > 0:
        if length % attrs.sections:
            raise ShapeError(f"{name}: an axis of {length} does not split into "
                             f"{attrs.sections} equal sections")
        size = length // attrs.sections
        return [(k * size, (k + 1) * size) for k in range(attrs.sections)]
    starts = [min(start, length) for start in attrs.indices]
    ends = [*starts[1:], length]
    return [(start, max(start, end)) for start, end in zip(starts, ends)]


def _count(attrs: Attrs) -> int:
    return attrs.sections if attrs.sections > 0 else len(attrs.indices)


def _split_op(name: str) -> None:
    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        data = shapes[0]
        if data is None or not all(data):
            return shapes, [None] * _count(attrs)
        axis = _axis(name, attrs, len(data))
        pieces = []
        for start, end in _bounds(name, attrs, data[axis]):
            if attrs.squeeze_axis:
                pieces.append(data[:axis] + data[axis + 1:])
            else:
                pieces.append((*data[:axis], end - start, *data[axis + 1:]))
        return shapes, pieces

    def kernel(xp: Any, attrs: Attrs, data: Any) -> tuple[Any, ...]:
        axis = _axis(name, attrs, data.ndim)
        outputs = []
        for start, end in _bounds(name, attrs, data.shape[axis]):
            piece = xp.take(data, xp.arange(start, end), axis=axis)
            outputs.append(piece.squeeze(axis) if attrs.squeeze_axis else piece)
        return tuple(outputs)

    register(OpDef(
        name=name,
        params=(Param("indices", parse_int_tuple), Param("axis", parse_int, 1),
                Param("squeeze_axis", parse_bool, False), Param("sections", parse_int, 0)),
        outputs=lambda attrs: tuple(f"output{k}" for k in range(_count(attrs))),
        infer_shape=infer,
        infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]] * _count(attrs)),
        kernel=kernel,
        doc="Pieces of data along axis, starting at indices (or sections equal pieces).",
    ))


for _name in ("_split_v2", "_npi_hsplit", "_npi_dsplit"):
    _split_op(_name)
