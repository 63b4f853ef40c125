"""Spatial transformer networks: ``GridGenerator``, ``BilinearSampler``, ``SpatialTransformer``.

Sampling grids hold normalised coordinates: -1 is the first pixel's centre and +1 the last's, x
in channel 0 and y in channel 1. Samples outside the image read zeros.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.kernels.workspace import uploaded
from engine.ops.attrs import choice, optional, parse_bool, parse_int_tuple
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred


def _target_grid(height: int, width: int, dtype: Any) -> np.ndarray:
    """``(3, H*W)`` homogeneous normalised (x, y, 1) of every output pixel."""
    ys, xs = np.meshgrid(np.linspace(-1, 1, height), np.linspace(-1, 1, width), indexing="ij")
    return np.stack([xs.ravel(), ys.ravel(), np.ones(xs.size)]).astype(dtype)


def _pixel_grid(height: int, width: int, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(2, H, W)`` pixel (x, y) positions and the ``(2, 1, 1)`` scale that normalises them."""
    ys, xs = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    scale = np.array([(width - 1) / 2, (height - 1) / 2]).reshape(2, 1, 1)
    return np.stack([xs, ys]).astype(dtype), scale.astype(dtype)


def affine_grid(xp: Any, theta: Any, height: int, width: int) -> Any:
    """``(N, 2, height, width)`` source coordinates of an affine ``(N, 6)`` transform."""
    # The grids depend on the shape only: a device gets them uploaded once, before capture.
    key = ("affine_grid", height, width, theta.dtype.str)
    target = uploaded(xp, key, partial(_target_grid, height, width, theta.dtype))
    source = xp.matmul(theta.reshape(-1, 2, 3), target)
    return source.reshape(-1, 2, height, width)


def warp_grid(xp: Any, flow: Any) -> Any:
    """Pixel positions moved by ``flow`` (N, 2, H, W), normalised to [-1, 1]."""
    _, _, height, width = flow.shape
    key = ("warp_grid", height, width, flow.dtype.str)
    base, scale = uploaded(xp, key, partial(_pixel_grid, height, width, flow.dtype))
    return (base + flow) / scale - 1


def bilinear_sample(xp: Any, data: Any, grid: Any) -> Any:
    """``data`` (N, C, H, W) read at ``grid`` (N, 2, h, w), zero outside the image."""
    batch, _, height, width = data.shape
    x = (grid[:, 0] + 1) * (width - 1) / 2
    y = (grid[:, 1] + 1) * (height - 1) / 2
    left, top = xp.floor(x), xp.floor(y)
    right_weight, bottom_weight = x - left, y - top
    pixels = data.transpose(0, 2, 3, 1)  # (N, H, W, C): gathered rows end in channels
    index = xp.arange(batch).reshape(-1, 1, 1)
    total = 0
    for dy, weight_y in ((0, 1 - bottom_weight), (1, bottom_weight)):
        for dx, weight_x in ((0, 1 - right_weight), (1, right_weight)):
            row, col = top + dy, left + dx
            inside = (row >= 0) & (row <= height - 1) & (col >= 0) & (col <= width - 1)
            values = pixels[index, xp.clip(row, 0, height - 1).astype(np.int64),
                            xp.clip(col, 0, width - 1).astype(np.int64)]
            total = total + values * (weight_y * weight_x * inside)[..., None]
    return xp.ascontiguousarray(total.transpose(0, 3, 1, 2)).astype(data.dtype)


# --- GridGenerator ----------------------------------------------------------------------------

def _grid_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return shapes, [None]
    if attrs.transform_type == "affine":
        if len(data) != 2 or data[1] not in (0, 6):
            raise ShapeError(f"GridGenerator (affine): data must be (N, 6); got {data}")
        height, width = _target(attrs, "GridGenerator")
        return shapes, [(data[0], 2, height, width)]
    if len(data) != 4 or data[1] not in (0, 2):
        raise ShapeError(f"GridGenerator (warp): data must be a (N, 2, H, W) flow; got {data}")
    return shapes, [data]


def _target(attrs: Attrs, what: str) -> tuple[int, int]:
    shape = attrs.target_shape
    if len(shape) != 2 or min(shape) <= 0:
        raise ShapeError(f"{what}: target_shape must be two positive sizes; got {shape}")
    return shape[0], shape[1]


def _grid_kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    if attrs.transform_type == "affine":
        return affine_grid(xp, data, *_target(attrs, "GridGenerator"))
    return warp_grid(xp, data)


register(OpDef(
    name="GridGenerator",
    params=(Param("transform_type", choice("affine", "warp")),
            Param("target_shape", parse_int_tuple, (0, 0))),
    hidden_outputs=1,
    infer_shape=_grid_infer,
    kernel=_grid_kernel,
    doc="A sampling grid from an affine transform (N, 6) or a pixel flow (N, 2, H, W).",
))


# --- BilinearSampler and SpatialTransformer ---------------------------------------------------

def _sampler_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data, grid = shapes
    if data is None or grid is None:
        return shapes, [None]
    if len(data) != 4 or len(grid) != 4 or grid[1] not in (0, 2):
        raise ShapeError(f"BilinearSampler: data must be (N, C, H, W) and grid (N, 2, h, w); "
                         f"got {data} and {grid}")
    return shapes, [(data[0], data[1], grid[2], grid[3])]


register(OpDef(
    name="BilinearSampler",
    params=(Param("cudnn_off", optional(parse_bool), None),),
    inputs=("data", "grid"),
    hidden_outputs=1,
    infer_shape=_sampler_infer,
    kernel=lambda xp, attrs, data, grid: bilinear_sample(xp, data, grid),
    doc="Bilinear samples of data at a normalised grid; zero outside the image.",
))


def _transformer_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data, loc = shapes
    if loc is not None and (len(loc) != 2 or loc[1] not in (0, 6)):
        raise ShapeError(f"SpatialTransformer: loc must be (N, 6); got {loc}")
    if data is None:
        return shapes, [None]
    return shapes, [(data[0], data[1], *_target(attrs, "SpatialTransformer"))]


def _transformer_kernel(xp: Any, attrs: Attrs, data: Any, loc: Any) -> Any:
    grid = affine_grid(xp, loc, *_target(attrs, "SpatialTransformer"))
    return bilinear_sample(xp, data, grid)


register(OpDef(
    name="SpatialTransformer",
    params=(Param("target_shape", parse_int_tuple, (0, 0)),
            Param("transform_type", choice("affine")),
            Param("sampler_type", choice("bilinear")),
            Param("cudnn_off", optional(parse_bool), None)),
    inputs=("data", "loc"),
    hidden_outputs=2,
    infer_shape=_transformer_infer,
    kernel=_transformer_kernel,
    doc="data resampled bilinearly through the affine transform loc, to target_shape.",
))
