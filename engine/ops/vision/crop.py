"""The legacy ``Crop`` operator: a spatial window of NCHW data, sized by ``h_w`` or by a second
input (``crop_like``), at ``offset`` or centred."""

from __future__ import annotations

from typing import Any

from engine.errors import ShapeError
from engine.ops.attrs import parse_bool, parse_int, parse_int_tuple
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred


def _window(attrs: Attrs, data: tuple[int, ...],
            like: MaybeShape) -> tuple[int, int, int, int]:
    """(top, left, height, width) of the crop."""
    if len(data) != 4:
        raise ShapeError(f"Crop: data must be 4-D (N, C, H, W); got {data}")
    height, width = (like[2], like[3]) if attrs.num_args == 2 and like is not None \
        else attrs.h_w
    if attrs.center_crop:
        top, left = (data[2] - height) // 2, (data[3] - width) // 2
    else:
        top, left = attrs.offset
    if data[2] and data[3] and (top < 0 or left < 0 or top + height > data[2]
                                or left + width > data[3] or min(height, width) <= 0):
        raise ShapeError(f"Crop: a {height}x{width} window at ({top}, {left}) does not fit "
                         f"data {data}")
    return top, left, height, width


def _infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    like = shapes[1] if attrs.num_args == 2 else None
    if data is None or (attrs.num_args == 2 and like is None):
        return shapes, [None]
    _, _, height, width = _window(attrs, data, like)
    return shapes, [(data[0], data[1], height, width)]


def _kernel(xp: Any, attrs: Attrs, data: Any, *like: Any) -> Any:
    top, left, height, width = _window(attrs, data.shape, like[0].shape if like else None)
    return xp.ascontiguousarray(data[:, :, top:top + height, left:left + width])


register(OpDef(
    name="Crop",
    params=(
        Param("num_args", parse_int),
        Param("offset", parse_int_tuple, (0, 0)),
        Param("h_w", parse_int_tuple, (0, 0)),
        Param("center_crop", parse_bool, False),
    ),
    inputs=lambda attrs: tuple(f"arg{index}" for index in range(attrs.num_args)),
    infer_shape=_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=_kernel,
    doc="A (h, w) window of NCHW data at offset (y, x), or centred; with two inputs the "
        "second gives the size.",
))
