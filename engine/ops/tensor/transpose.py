"""Axis permutations: ``transpose``, ``SwapAxis`` and the depth/space rearrangements."""

from __future__ import annotations

from typing import Any

from engine.errors import ShapeError
from engine.ops.attrs import (
    parse_int,
    parse_int_tuple,
)
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, Shape, emit, register
from engine.ops.shapes import Inferred, normalize_axis


def _permutation(attrs: Attrs, ndim: int) -> tuple[int, ...]:
    if not attrs.axes:
        return tuple(range(ndim - 1, -1, -1))
    axes = tuple(normalize_axis(axis, ndim, "transpose axis") for axis in attrs.axes)
    if sorted(axes) != list(range(ndim)):
        raise ShapeError(f"transpose axes {attrs.axes} are not a permutation of {ndim} axes")
    return axes


def _transpose_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return [None], [None]
    return [data], [tuple(data[axis] for axis in _permutation(attrs, len(data)))]


register(OpDef(
    name="transpose",
    params=(Param("axes", parse_int_tuple, ()),),
    infer_shape=_transpose_infer,
    kernel=lambda xp, attrs, data, out=None: emit(
        xp, data.transpose(_permutation(attrs, data.ndim)), out),
    writes_out=True,
    doc="Permute axes (reverse them when axes is empty).",
))


def _swap(attrs: Attrs, ndim: int) -> tuple[int, ...]:
    order = list(range(ndim))
    first = normalize_axis(attrs.dim1, ndim, "SwapAxis dim1")
    second = normalize_axis(attrs.dim2, ndim, "SwapAxis dim2")
    order[first], order[second] = order[second], order[first]
    return tuple(order)


def _swap_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return [None], [None]
    return [data], [tuple(data[axis] for axis in _swap(attrs, len(data)))]


register(OpDef(
    name="SwapAxis",
    aliases=("swapaxes",),
    params=(Param("dim1", parse_int, 0), Param("dim2", parse_int, 0)),
    infer_shape=_swap_infer,
    kernel=lambda xp, attrs, data, out=None: emit(
        xp, data.transpose(_swap(attrs, data.ndim)), out),
    writes_out=True,
    doc="Swap two axes.",
))


def _depth_to_space_shape(attrs: Attrs, data: Shape, inverse: bool) -> Shape:
    if len(data) != 4:
        raise ShapeError(f"expected a 4-D (N, C, H, W) input, got {data}")
    block = attrs.block_size
    batch, channels, height, width = data
    if inverse:
        if (height and height % block) or (width and width % block):
            raise ShapeError(f"height and width of {data} must divide by block_size {block}")
        return (batch, channels * block * block, height // block, width // block)
    if channels and channels % (block * block):
        raise ShapeError(f"channels of {data} must divide by block_size² = {block * block}")
    return (batch, channels // (block * block), height * block, width * block)


def _space_infer(inverse: bool) -> Any:
    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        data = shapes[0]
        return [data], [None if data is None else _depth_to_space_shape(attrs, data, inverse)]

    return infer


def _depth_to_space(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
    block = attrs.block_size
    batch, channels, height, width = data.shape
    shape = _depth_to_space_shape(attrs, data.shape, False)
    grid = data.reshape(batch, block, block, channels // (block * block), height, width)
    return emit(xp, grid.transpose(0, 3, 4, 1, 5, 2).reshape(shape), out)


def _space_to_depth(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
    block = attrs.block_size
    batch, channels, height, width = data.shape
    shape = _depth_to_space_shape(attrs, data.shape, True)
    grid = data.reshape(batch, channels, height // block, block, width // block, block)
    return emit(xp, grid.transpose(0, 3, 5, 1, 2, 4).reshape(shape), out)


register(OpDef(
    name="depth_to_space",
    params=(Param("block_size", parse_int),),
    infer_shape=_space_infer(False),
    kernel=_depth_to_space,
    writes_out=True,
    doc="Move channel blocks into block_size x block_size spatial tiles (DCR order).",
))
register(OpDef(
    name="space_to_depth",
    params=(Param("block_size", parse_int),),
    infer_shape=_space_infer(True),
    kernel=_space_to_depth,
    writes_out=True,
    doc="Move block_size x block_size spatial tiles into channels.",
))
