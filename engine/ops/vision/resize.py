"""``_image_resize`` (``_npx__image_resize``): resize HWC images or NHWC batches as MXNet does
with OpenCV's ``cv::resize``.

``size`` is (width, height), or one edge: both edges, or with ``keep_ratio`` the short edge
(the long one scaled by integer arithmetic). ``interp`` picks OpenCV's method: 0 nearest
neighbour (source index ``floor(x * in / out)``), 1 bilinear and 2 bicubic (``a = -0.75``) on
half-pixel centres, 3 area (averages of the covered source cells when shrinking, OpenCV's
area-weighted bilinear when enlarging) and 4 Lanczos over 8 x 8 pixels; borders repeat.

All are separable: each output column reads a few source columns with weights that depend only
on the sizes, and likewise for rows, so the tables are built on the host once per size and the
image is blended with array operations. uint8 images are blended in float32 and rounded;
OpenCV's fixed-point arithmetic can differ from that by one grey level.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.errors import ModelFormatError, ShapeError
from engine.kernels.workspace import uploaded
from engine.ops.attrs import parse_bool, parse_int, parse_int_tuple
from engine.ops.dtypes import FLOAT32
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred

_INTERPOLATIONS = {0: "nearest", 1: "bilinear", 2: "cubic", 3: "area", 4: "Lanczos"}


def _parse_interp(value: Any) -> int:
    code = parse_int(value)
    if code not in _INTERPOLATIONS:
        raise ValueError(f"interp={code} is not one of OpenCV's resize methods "
                         f"{_INTERPOLATIONS}")
    return code


def resized_size(attrs: Attrs, height: int, width: int) -> tuple[int, int]:
    """(height, width) of the resized image."""
    size = tuple(attrs.size)
    if len(size) not in (1, 2) or min(size) <= 0:
        raise ShapeError(f"_image_resize: size={size} must be (width, height) or one positive "
                         "edge")
    if len(size) == 2:
        return size[1], size[0]
    if not attrs.keep_ratio:
        return size[0], size[0]
    if height > width:
        return height * size[0] // width, size[0]
    return size[0], width * size[0] // height


def _infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is not None and len(data) not in (3, 4):
        raise ShapeError(f"_image_resize: expected an HWC image or an NHWC batch; got {data}")
    if data is None or (attrs.keep_ratio and len(attrs.size) == 1 and not all(data[-3:-1])):
        return shapes, [None]
    height, width = resized_size(attrs, data[-3], data[-2])
    return shapes, [(*data[:-3], height, width, data[-1])]


def _linear_taps(source: int, positions: np.ndarray, scale: float,
                 area: bool) -> tuple[np.ndarray, np.ndarray]:
    """OpenCV's bilinear taps; ``area`` is its INTER_AREA rule for enlarging an image."""
    if area:
        low = np.floor(positions * scale).astype(np.int64)
        fraction = ((positions + 1) - (low + 1) / scale).astype(FLOAT32)
        fraction = np.where(fraction <= 0, 0, fraction - np.floor(fraction)).astype(FLOAT32)
    else:
        exact = ((positions + 0.5) * scale - 0.5).astype(FLOAT32)
        low = np.floor(exact).astype(np.int64)
        fraction = exact - low
    clamp = (low < 0) | (low >= source - 1)
    low = np.clip(low, 0, source - 1)
    fraction = np.where(clamp, 0, fraction).astype(FLOAT32)
    index = np.stack([low, np.minimum(low + 1, source - 1)], axis=1)
    return index, np.stack([1 - fraction, fraction], axis=1)


def _cubic_weights(x: np.ndarray) -> np.ndarray:
    """OpenCV's cubic convolution weights (a = -0.75) of the four taps around fraction x."""
    a = FLOAT32.type(-0.75)
    near = lambda d: ((a + 2) * d - (a + 3)) * d * d + 1  # noqa: E731  |d| <= 1
    far = lambda d: ((a * d - 5 * a) * d + 8 * a) * d - 4 * a  # noqa: E731  1 < |d| < 2
    first, second, third = far(x + 1), near(x), near(1 - x)
    return np.stack([first, second, third, 1 - first - second - third], axis=1)


def _lanczos_weights(x: np.ndarray) -> np.ndarray:
    """Lanczos-4 weights of the eight taps around fraction x, normalised to sum to 1."""
    distance = x[:, None].astype(np.float64) + 3 - np.arange(8)
    weights = np.sinc(distance) * np.sinc(distance / 4)
    return (weights / weights.sum(axis=1, keepdims=True)).astype(FLOAT32)


def _kernel_taps(source: int, positions: np.ndarray, scale: float,
                 taps: int) -> tuple[np.ndarray, np.ndarray]:
    """Cubic (4) or Lanczos (8) taps: border pixels repeat past the edges."""
    exact = ((positions + 0.5) * scale - 0.5).astype(FLOAT32)
    low = np.floor(exact).astype(np.int64)
    fraction = (exact - low).astype(FLOAT32)
    index = np.clip(low[:, None] - (taps // 2 - 1) + np.arange(taps), 0, source - 1)
    weights = _cubic_weights(fraction) if taps == 4 else _lanczos_weights(fraction)
    return index, weights.astype(FLOAT32)


def _area_taps(source: int, target: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Shrinking with INTER_AREA: each output averages the source cells it covers, edge cells
    by the fraction covered."""
    rows = []
    for position in range(target):
        start, stop = position * scale, position * scale + scale
        width = min(scale, source - start)
        first, last = math.ceil(start), min(math.floor(stop), source - 1)
        first = min(first, last)
        cells = [(cell, 1 / width) for cell in range(first, last)]
        if first - start > 1e-3:
            cells.insert(0, (first - 1, (first - start) / width))
        if stop - last > 1e-3:
            cells.append((last, min(min(stop - last, 1.0), width) / width))
        rows.append(cells)
    taps = max(len(cells) for cells in rows)
    index = np.zeros((target, taps), np.int64)
    weights = np.zeros((target, taps), FLOAT32)
    for position, cells in enumerate(rows):
        index[position, :len(cells)] = [cell for cell, _ in cells]
        weights[position, :len(cells)] = [weight for _, weight in cells]
    return index, weights


def axis_table(source: int, target: int, interp: int,
               shrinking: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(target, taps)`` source indices and weights along one axis; ``shrinking`` says
    whether the image shrinks (or keeps its size) along both axes (OpenCV's area mode)."""
    scale = 1.0 / (target / source)  # OpenCV's rounding of the scale, to the last bit
    positions = np.arange(target)
    if interp == 0:
        index = np.minimum(np.floor(positions * scale).astype(np.int64), source - 1)
        return index[:, None], np.ones((target, 1), FLOAT32)
    if interp == 3 and shrinking:
        return _area_taps(source, target, scale)
    if interp in (2, 4):
        return _kernel_taps(source, positions, scale, 4 if interp == 2 else 8)
    return _linear_taps(source, positions, scale, area=interp == 3)


def _blend(xp: Any, image: Any, index: Any, weights: Any, axis: int) -> Any:
    """Sum over taps of the image's slices at ``index`` along ``axis``, weighted."""
    shape = [1] * image.ndim
    shape[axis] = -1
    weights = weights.astype(image.dtype)
    total = None
    for tap in range(index.shape[1]):
        term = xp.take(image, index[:, tap], axis=axis) * weights[:, tap].reshape(shape)
        total = term if total is None else total + term
    return total


def _resize(xp: Any, attrs: Attrs, data: Any) -> Any:
    height, width = data.shape[-3:-1]
    new_height, new_width = resized_size(attrs, height, width)
    shrinking = new_height <= height and new_width <= width
    key = ("_image_resize", height, width, new_height, new_width, attrs.interp)
    rows, row_weights, cols, col_weights = uploaded(
        xp, key, lambda: (*axis_table(height, new_height, attrs.interp, shrinking),
                          *axis_table(width, new_width, attrs.interp, shrinking)))
    image = data if data.dtype == np.float64 else data.astype(FLOAT32)
    # Columns first, as OpenCV's horizontal pass, then rows.
    across = _blend(xp, image, cols, col_weights, image.ndim - 2)
    blended = _blend(xp, across, rows, row_weights, image.ndim - 3)
    if np.issubdtype(data.dtype, np.integer):
        info = np.iinfo(data.dtype)
        blended = xp.clip(xp.rint(blended), info.min, info.max)
    return blended.astype(data.dtype)


def _check_dtype(attrs: Attrs, dtypes: list) -> tuple[list, list]:
    dtype = dtypes[0]
    if dtype is not None and np.dtype(dtype) == np.float16:
        raise ModelFormatError("_image_resize: float16 images are not supported (OpenCV, which "
                               "MXNet resizes with, has no float16 images either)")
    return dtypes, [dtype]


register(OpDef(
    name="_image_resize",
    aliases=("_npx__image_resize",),
    params=(Param("size", parse_int_tuple, ()), Param("keep_ratio", parse_bool, False),
            Param("interp", _parse_interp, 1)),
    infer_shape=_infer,
    infer_dtype=_check_dtype,
    kernel=_resize,
    doc="Resize an HWC image (or NHWC batch) to size (width, height) or one edge with one of "
        "OpenCV's methods (interp 0-4), as MXNet does.",
))
