"""Joining and splitting: ``Concat``, ``stack`` and ``SliceChannel`` (split)."""

from __future__ import annotations

from typing import Any

from engine.errors import ShapeError
from engine.ops.attrs import (
    parse_bool,
    parse_int,
)
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, Shape, register
from engine.ops.shapes import Inferred, merge, normalize_axis


def _arg_names(attrs: Attrs) -> tuple[str, ...]:
    return tuple(f"arg{index}" for index in range(attrs.num_args))


def _concat_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    known = [shape for shape in shapes if shape is not None]
    if not known:
        return shapes, [None]
    ndim = len(known[0])
    axis = normalize_axis(attrs.dim, ndim, "Concat dim")
    common: MaybeShape = None
    for shape in known:
        if len(shape) != ndim:
            raise ShapeError(f"Concat inputs differ in rank: {shapes}")
        common = merge(common, (*shape[:axis], 0, *shape[axis + 1:]), "Concat input shapes")
    assert common is not None
    filled = []
    for shape in shapes:
        size = 0 if shape is None else shape[axis]
        filled.append((*common[:axis], size, *common[axis + 1:]))
    sizes = [shape[axis] for shape in filled]
    total = sum(sizes) if all(sizes) else 0
    return filled, [(*common[:axis], total, *common[axis + 1:])]


def _concat_kernel(xp: Any, attrs: Attrs, *arrays: Any, out: Any = None) -> Any:
    axis = normalize_axis(attrs.dim, arrays[0].ndim, "Concat dim")
    if out is None:
        return xp.concatenate(arrays, axis=axis)
    return xp.concatenate(arrays, axis=axis, out=out)


register(OpDef(
    name="Concat",
    aliases=("concat",),
    params=(Param("num_args", parse_int), Param("dim", parse_int, 1)),
    inputs=_arg_names,
    infer_shape=_concat_infer,
    kernel=_concat_kernel,
    writes_out=True,
    doc="Join num_args arrays along axis dim.",
))


def _stack_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    common: MaybeShape = None
    for shape in shapes:
        common = merge(common, shape, "stack input shapes")
    if common is None:
        return shapes, [None]
    axis = normalize_axis(attrs.axis, len(common) + 1, "stack axis")
    return [common] * len(shapes), [(*common[:axis], attrs.num_args, *common[axis:])]


def _stack_kernel(xp: Any, attrs: Attrs, *arrays: Any, out: Any = None) -> Any:
    axis = normalize_axis(attrs.axis, arrays[0].ndim + 1, "stack axis")
    if out is None:
        return xp.stack(arrays, axis=axis)
    return xp.stack(arrays, axis=axis, out=out)


register(OpDef(
    name="stack",
    aliases=("_npi_stack",),
    params=(Param("num_args", parse_int), Param("axis", parse_int, 0)),
    inputs=_arg_names,
    infer_shape=_stack_infer,
    kernel=_stack_kernel,
    writes_out=True,
    doc="Join num_args same-shaped arrays along a new axis.",
))


def _split_outputs(attrs: Attrs) -> tuple[str, ...]:
    return tuple(f"output{index}" for index in range(attrs.num_outputs))


def _split_part(attrs: Attrs, data: Shape) -> Shape:
    axis = normalize_axis(attrs.axis, len(data), "SliceChannel axis")
    size = data[axis]
    if size and size % attrs.num_outputs:
        raise ShapeError(f"SliceChannel: axis {axis} of {data} does not split into "
                         f"{attrs.num_outputs} equal parts")
    if attrs.squeeze_axis:
        if size and size != attrs.num_outputs:
            raise ShapeError(f"SliceChannel squeeze_axis needs axis {axis} of {data} to equal "
                             f"num_outputs {attrs.num_outputs}")
        return (*data[:axis], *data[axis + 1:])
    return (*data[:axis], size // attrs.num_outputs, *data[axis + 1:])


def _split_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    part = None if data is None else _split_part(attrs, data)
    return [data], [part] * attrs.num_outputs


def _split_kernel(xp: Any, attrs: Attrs, data: Any) -> tuple[Any, ...]:
    axis = normalize_axis(attrs.axis, data.ndim, "SliceChannel axis")
    shape = _split_part(attrs, data.shape)
    return tuple(part.reshape(shape).copy() for part in xp.split(data, attrs.num_outputs, axis))


register(OpDef(
    name="SliceChannel",
    aliases=("split",),
    params=(
        Param("num_outputs", parse_int),
        Param("axis", parse_int, 1),
        Param("squeeze_axis", parse_bool, False),
    ),
    outputs=_split_outputs,
    infer_shape=_split_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]] * attrs.num_outputs),
    kernel=_split_kernel,
    doc="Split into num_outputs equal parts along axis (squeeze_axis drops it).",
))
