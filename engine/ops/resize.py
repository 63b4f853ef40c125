"""``_image_resize`` (``_npx__image_resize``): resize HWC images or NHWC batches as MXNet does
with OpenCV's ``cv::resize``.

``size`` is (width, height), or one edge: both edges, or with ``keep_ratio`` the short edge
(the long one scaled by integer arithmetic). ``interp`` 0 is OpenCV's nearest neighbour
(source index ``floor(x * in / out)``) and 1 its bilinear (half-pixel centres, clamped at the
borders); OpenCV's area, cubic and Lanczos filters are refused by name.

Both are separable: each output column reads two source columns with weights that depend only
on the sizes, and likewise for rows, so the tables are built on the host once per size and the
image is blended with array operations. uint8 images are blended in float32 and rounded;
OpenCV's fixed-point arithmetic can differ from that by one grey level.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ModelFormatError, ShapeError
from engine.ops.attrs import parse_bool, parse_int, parse_int_tuple
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred
from engine.ops.workspace import uploaded

FLOAT32 = np.dtype(np.float32)
_INTERPOLATIONS = {0: "nearest", 1: "bilinear", 2: "cubic", 3: "area", 4: "Lanczos"}


def _parse_interp(value: Any) -> int:
    code = parse_int(value)
    if code not in (0, 1):
        name = _INTERPOLATIONS.get(code, "unknown")
        raise ValueError(f"interp={code} ({name}) is not supported; only 0 (nearest) and "
                         "1 (bilinear) are")
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


def axis_table(source: int, target: int, interp: int) -> tuple[np.ndarray, ...]:
    """(low index, high index, high weight) for each output position along one axis."""
    scale = 1.0 / (target / source)  # OpenCV's rounding of the scale, to the last bit
    positions = np.arange(target)
    if interp == 0:
        low = np.minimum(np.floor(positions * scale).astype(np.int64), source - 1)
        return low, low, np.zeros(target, FLOAT32)
    exact = ((positions + 0.5) * scale - 0.5).astype(FLOAT32)
    low = np.floor(exact).astype(np.int64)
    weight = exact - low
    clamp = (low < 0) | (low >= source - 1)
    low = np.clip(low, 0, source - 1)
    weight = np.where(clamp, 0, weight).astype(FLOAT32)
    return low, np.minimum(low + 1, source - 1), weight


def _resize(xp: Any, attrs: Attrs, data: Any) -> Any:
    height, width = data.shape[-3:-1]
    new_height, new_width = resized_size(attrs, height, width)
    key = ("_image_resize", height, width, new_height, new_width, attrs.interp)
    rows_low, rows_high, row_weight, cols_low, cols_high, col_weight = uploaded(
        xp, key, lambda: (*axis_table(height, new_height, attrs.interp),
                          *axis_table(width, new_width, attrs.interp)))
    image = data if data.dtype == np.float64 else data.astype(FLOAT32)
    dtype = image.dtype
    col_weight = col_weight.astype(dtype)[:, None]
    row_weight = row_weight.astype(dtype)[:, None, None]
    # Columns first, as OpenCV's horizontal pass, then rows.
    across = (xp.take(image, cols_low, axis=-2) * (1 - col_weight)
              + xp.take(image, cols_high, axis=-2) * col_weight)
    blended = (xp.take(across, rows_low, axis=-3) * (1 - row_weight)
               + xp.take(across, rows_high, axis=-3) * row_weight)
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


for _name in ("_image_resize", "_npx__image_resize"):
    register(OpDef(
        name=_name,
        params=(Param("size", parse_int_tuple, ()), Param("keep_ratio", parse_bool, False),
                Param("interp", _parse_interp, 1)),
        infer_shape=_infer,
        infer_dtype=_check_dtype,
        kernel=_resize,
        doc="Resize an HWC image (or NHWC batch) to size (width, height) or one edge, nearest "
            "(interp 0) or bilinear (interp 1), as OpenCV does.",
    ))
