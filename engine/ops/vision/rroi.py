"""``_contrib_RROIAlign``: ROIAlign over rotated boxes.

``rois`` rows are (batch index, centre x, centre y, width, height, angle in degrees), scaled by
``spatial_scale``; widths and heights below 1 become 1. Each of the ``pooled_size`` bins averages
a ``grid x grid`` set of bilinear samples (``sampling_ratio``, or ``ceil`` of the bin size when
it is not positive), taken in the box's own frame and rotated onto the feature map. Samples past
the map by more than one pixel count as 0; others are clamped onto it, as in MXNet.

The sampling grid's size depends on each ROI, so the sample positions and weights are built on
the host (in float32, as MXNet computes them) and the feature map is gathered on the device; a
GPU plan with this op is therefore not captured as a CUDA graph.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import parse_float, parse_int, parse_int_tuple
from engine.ops.dtypes import FLOAT32
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred, merge
from engine.ops.vision.boxes import host
from engine.ops.vision.roi import pooled_size


def _infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data, rois = shapes
    if data is not None and len(data) != 4:
        raise ShapeError(f"RROIAlign: data must be (N, C, H, W); got {data}")
    rois = merge(rois, (0, 6), "RROIAlign rois (R, 6): batch, x, y, w, h, angle")
    height, width = pooled_size(attrs)
    if data is None or not rois[0]:
        return [data, rois], [None]
    return [data, rois], [(rois[0], data[1], height, width)]


def _axis_samples(start: Any, bin_size: Any, bins: int, grid: int) -> np.ndarray:
    """``(bins, grid)`` sample coordinates along one box axis, in float32."""
    index = np.arange(bins, dtype=FLOAT32)[:, None]
    offset = (np.arange(grid, dtype=FLOAT32) + FLOAT32.type(0.5))[None, :]
    return start + index * bin_size + offset * bin_size / FLOAT32.type(grid)


def _sample_table(roi: np.ndarray, attrs: Attrs, height: int,
                  width: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat map positions ``(bins_h, bins_w, samples, 4)`` and their weights (already divided
    by the sample count) for one rotated ROI."""
    bins_h, bins_w = pooled_size(attrs)
    scale = FLOAT32.type(attrs.spatial_scale)
    center_x, center_y = roi[1] * scale, roi[2] * scale
    roi_w = max(roi[3] * scale, FLOAT32.type(1))
    roi_h = max(roi[4] * scale, FLOAT32.type(1))
    theta = FLOAT32.type(float(roi[5]) * math.pi / 180.0)
    bin_h, bin_w = roi_h / FLOAT32.type(bins_h), roi_w / FLOAT32.type(bins_w)
    ratio = attrs.sampling_ratio
    grid_h = ratio if ratio > 0 else math.ceil(roi_h / bins_h)
    grid_w = ratio if ratio > 0 else math.ceil(roi_w / bins_w)
    yy = _axis_samples(-roi_h / FLOAT32.type(2), bin_h, bins_h, grid_h)[:, None, :, None]
    xx = _axis_samples(-roi_w / FLOAT32.type(2), bin_w, bins_w, grid_w)[None, :, None, :]
    cos, sin = np.cos(theta), np.sin(theta)
    x = (xx * cos + yy * sin + center_x).reshape(bins_h, bins_w, -1)
    y = (yy * cos - xx * sin + center_y).reshape(bins_h, bins_w, -1)
    outside = (y < -1) | (y > height) | (x < -1) | (x > width)
    y, x = np.maximum(y, 0), np.maximum(x, 0)
    y_low = np.minimum(y.astype(np.int64), height - 1)
    x_low = np.minimum(x.astype(np.int64), width - 1)
    y = np.where(y_low >= height - 1, y_low.astype(FLOAT32), y)
    x = np.where(x_low >= width - 1, x_low.astype(FLOAT32), x)
    y_high, x_high = np.minimum(y_low + 1, height - 1), np.minimum(x_low + 1, width - 1)
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    positions = np.stack([y_low * width + x_low, y_low * width + x_high,
                          y_high * width + x_low, y_high * width + x_high], axis=-1)
    weights = np.stack([hy * hx, hy * lx, ly * hx, ly * lx], axis=-1)
    weights = np.where(outside[..., None], 0, weights) / FLOAT32.type(max(grid_h * grid_w, 1))
    return np.where(outside[..., None], 0, positions), weights.astype(FLOAT32)


def _rroi_align(xp: Any, attrs: Attrs, data: Any, rois: Any) -> Any:
    boxes = host(rois).astype(FLOAT32)
    batch, channels, height, width = data.shape
    bins_h, bins_w = pooled_size(attrs)
    flat = data.reshape(batch, channels, height * width)
    outputs = []
    for roi in boxes:
        positions, weights = _sample_table(roi, attrs, height, width)
        index = min(max(int(roi[0]), 0), batch - 1)
        samples = xp.take(flat[index], xp.asarray(positions.reshape(-1)), axis=1)
        samples = samples.reshape(channels, *positions.shape)
        pooled = (samples * xp.asarray(weights, dtype=data.dtype)).sum(axis=(3, 4))
        outputs.append(pooled)
    if not outputs:
        return xp.zeros((0, channels, bins_h, bins_w), data.dtype)
    return xp.stack(outputs).astype(data.dtype)


register(OpDef(
    name="_contrib_RROIAlign",
    params=(Param("pooled_size", parse_int_tuple), Param("spatial_scale", parse_float),
            Param("sampling_ratio", parse_int, -1)),
    inputs=("data", "rois"),
    infer_shape=_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=_rroi_align,
    uncapturable="reads each rotated ROI's sampling grid (its size too) from rois on the host",
    doc="ROIAlign over rotated boxes (centre, size, angle in degrees): bilinear samples "
        "averaged in each of pooled_size bins.",
))
