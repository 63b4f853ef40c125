"""Deterministic image transforms that hybridized Gluon preprocessing exports contain.

Images are HWC (or NHWC batches) as ``mx.image`` decodes them; ``_image_to_tensor`` turns them
into CHW floats in [0, 1], and ``_image_normalize`` works on that CHW layout.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.kernels.workspace import uploaded
from engine.ops.attrs import parse_float_tuple, parse_int
from engine.ops.dtypes import FLOAT32
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred, same_shape

# AlexNet's PCA lighting: eigenvectors of the RGB covariance scaled by their eigenvalues.
LIGHTING = np.array([[55.46 * -0.5675, 4.794 * 0.7192, 1.148 * 0.4009],
                     [55.46 * -0.5808, 4.794 * -0.0045, 1.148 * -0.8140],
                     [55.46 * -0.5836, 4.794 * -0.6948, 1.148 * 0.4203]])


def _image_rank(shape: MaybeShape, what: str) -> None:
    if shape is not None and len(shape) not in (3, 4):
        raise ShapeError(f"{what}: expected an image (3-D) or a batch (4-D); got {shape}")


def _to_tensor_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    _image_rank(data, "_image_to_tensor")
    if data is None:
        return shapes, [None]
    return shapes, [(*data[:-3], data[-1], data[-3], data[-2])]


def _to_tensor(xp: Any, attrs: Attrs, data: Any) -> Any:
    moved = xp.moveaxis(data, -1, -3).astype(FLOAT32) / FLOAT32.type(255)
    return xp.ascontiguousarray(moved)


register(OpDef(
    name="_image_to_tensor",
    infer_shape=_to_tensor_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [FLOAT32]),
    kernel=_to_tensor,
    doc="HWC (or NHWC) pixels as CHW float32 in [0, 1].",
))


def _per_channel(xp: Any, values: tuple[float, ...], channels: int, like: Any) -> Any:
    """``values`` as a ``(channels, 1, 1)`` array (uploaded once on a device)."""
    picked = values[:channels] if len(values) > 1 else values * channels
    return uploaded(xp, ("image_per_channel", picked, like.dtype.str),
                    lambda: np.asarray(picked, dtype=like.dtype).reshape(channels, 1, 1))


def _normalize(xp: Any, attrs: Attrs, data: Any) -> Any:
    channels = data.shape[-3]
    mean = _per_channel(xp, attrs.mean, channels, data)
    std = _per_channel(xp, attrs.std, channels, data)
    return (data - mean) / std


register(OpDef(
    name="_image_normalize",
    params=(Param("mean", parse_float_tuple, (0.0, 0.0, 0.0, 0.0)),
            Param("std", parse_float_tuple, (1.0, 1.0, 1.0, 1.0))),
    infer_shape=same_shape,
    kernel=_normalize,
    doc="(data - mean) / std per channel of CHW (or NCHW) data.",
))

for _name, _axis, _doc in (("_image_flip_left_right", -2, "Mirror images horizontally."),
                           ("_image_flip_top_bottom", -3, "Mirror images vertically.")):
    register(OpDef(name=_name, infer_shape=same_shape, doc=_doc,
                   kernel=(lambda axis: lambda xp, attrs, data: xp.ascontiguousarray(
                       xp.flip(data, axis=axis)))(_axis)))


def _crop_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    _image_rank(data, "_image_crop")
    if data is None:
        return shapes, [None]
    if data[-2] and data[-3] and (attrs.x + attrs.width > data[-2]
                                  or attrs.y + attrs.height > data[-3]):
        raise ShapeError(f"_image_crop: a {attrs.width}x{attrs.height} crop at ({attrs.x}, "
                         f"{attrs.y}) does not fit image {data}")
    return shapes, [(*data[:-3], attrs.height, attrs.width, data[-1])]


register(OpDef(
    name="_image_crop",
    params=(Param("x", parse_int), Param("y", parse_int), Param("width", parse_int),
            Param("height", parse_int)),
    infer_shape=_crop_infer,
    kernel=lambda xp, attrs, data: xp.ascontiguousarray(
        data[..., attrs.y:attrs.y + attrs.height, attrs.x:attrs.x + attrs.width, :]),
    doc="The width x height window at (x, y) of HWC images.",
))


def _adjust_lighting(xp: Any, attrs: Attrs, data: Any) -> Any:
    shift = uploaded(xp, ("image_lighting", attrs.alpha, data.dtype.str),
                     lambda: (LIGHTING @ np.asarray(attrs.alpha, np.float64)).astype(data.dtype))
    return (data + shift).astype(data.dtype)


register(OpDef(
    name="_image_adjust_lighting",
    params=(Param("alpha", parse_float_tuple),),
    infer_shape=same_shape,
    kernel=_adjust_lighting,
    doc="AlexNet-style PCA lighting: add the RGB shift the alpha weights give.",
))
