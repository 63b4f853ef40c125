"""Region-of-interest pooling: ``_contrib_ROIAlign`` (bilinear, averaged) and ``ROIPooling`` (max).

``rois`` is ``(R, 5)``: a batch index then ``(x1, y1, x2, y2)`` in input-image coordinates, which
``spatial_scale`` maps onto the feature map. A negative batch index gives a zero output.

ROIAlign's bilinear sampling is separable: every sample row ``y`` reads two feature rows with
weights that depend on ``y`` only, and likewise for columns. Each ROI therefore becomes two small
weight matrices and ``rows @ feature @ cols.T``, built on the host and multiplied with ``xp``.
Both ops read ``rois`` on the host, so a GPU plan holding one is not captured as a CUDA graph.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.errors import InputError, ShapeError
from engine.ops.attrs import parse_bool, parse_float, parse_int, parse_int_tuple
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred
from engine.ops.vision.boxes import host


def pooled_size(attrs: Attrs) -> tuple[int, int]:
    """(height, width) of every pooled ROI; one value means a square."""
    size = attrs.pooled_size
    if len(size) == 1:
        size = (size[0], size[0])
    if len(size) != 2 or min(size) <= 0:
        raise ShapeError(f"pooled_size must be one or two positive values; got {attrs.pooled_size}")
    return size[0], size[1]


def _roi_infer(channels_per_bin: bool) -> Any:
    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        data, rois = shapes
        if data is not None and len(data) != 4:
            raise ShapeError(f"ROI pooling data must be 4-D (N, C, H, W); got {data}")
        if rois is not None and (len(rois) != 2 or rois[1] not in (0, 5)):
            raise ShapeError(f"rois must be (R, 5): batch index, x1, y1, x2, y2; got {rois}")
        if data is None or rois is None:
            return shapes, [None]
        height, width = pooled_size(attrs)
        channels = data[1]
        if channels_per_bin and attrs.position_sensitive:
            if channels % (height * width):
                raise ShapeError(f"position-sensitive ROIAlign needs channels divisible by "
                                 f"{height} * {width}; got {channels}")
            channels //= height * width
        return shapes, [(rois[0], channels, height, width)]

    return infer


def _batch_index(roi: np.ndarray, batch: int) -> int:
    index = int(roi[0])
    if index >= batch:
        raise InputError(f"ROI batch index {index} is out of range for a batch of {batch}")
    return index


# --- ROIAlign ---------------------------------------------------------------------------------

def sample_weights(start: float, extent: float, bins: int, grid: int, length: int) -> np.ndarray:
    """``(bins * grid, length)`` bilinear weights of the samples along one axis."""
    offsets = (np.arange(grid) + 0.5) * extent / bins / grid
    position = (start + np.arange(bins)[:, None] * extent / bins + offsets[None, :]).ravel()
    inside = (position >= -1.0) & (position <= length)
    position = np.maximum(position, 0.0)
    low = np.floor(position).astype(np.int64)
    at_edge = low >= length - 1
    low = np.where(at_edge, length - 1, low)
    high = np.where(at_edge, length - 1, low + 1)
    fraction = np.where(at_edge, 0.0, position - low) * inside
    weights = np.zeros((position.size, length))
    rows = np.arange(position.size)
    np.add.at(weights, (rows, low), (1.0 - fraction) * inside)
    np.add.at(weights, (rows, high), fraction)
    return weights


def _align_one(xp: Any, attrs: Attrs, feature: Any, roi: np.ndarray) -> Any:
    """``(C, PH, PW)`` ROIAlign output of one ROI over one ``(C, H, W)`` feature map."""
    bins_h, bins_w = pooled_size(attrs)
    shift = 0.5 if attrs.aligned else 0.0
    x1, y1, x2, y2 = (float(value) * attrs.spatial_scale - shift for value in roi[1:5])
    extent_w, extent_h = x2 - x1, y2 - y1
    if not attrs.aligned:
        extent_w, extent_h = max(extent_w, 1.0), max(extent_h, 1.0)
    grid_h = attrs.sample_ratio if attrs.sample_ratio > 0 else math.ceil(extent_h / bins_h)
    grid_w = attrs.sample_ratio if attrs.sample_ratio > 0 else math.ceil(extent_w / bins_w)
    rows = sample_weights(y1, extent_h, bins_h, grid_h, feature.shape[1])
    cols = sample_weights(x1, extent_w, bins_w, grid_w, feature.shape[2])
    rows = xp.asarray(rows / max(grid_h * grid_w, 1), dtype=feature.dtype)
    cols = xp.asarray(cols, dtype=feature.dtype)
    samples = xp.matmul(xp.matmul(rows, feature), cols.T)
    channels = feature.shape[0]
    return samples.reshape(channels, bins_h, grid_h, bins_w, grid_w).sum(axis=(2, 4))


def _position_sensitive(xp: Any, pooled: Any, bins_h: int, bins_w: int) -> Any:
    """Output channel c, bin (i, j) reads input channel ``(c * bins_h + i) * bins_w + j``."""
    channels = pooled.shape[0] // (bins_h * bins_w)
    grouped = pooled.reshape(channels, bins_h, bins_w, bins_h, bins_w)
    i, j = np.arange(bins_h)[:, None], np.arange(bins_w)[None, :]
    return grouped[:, i, j, i, j]


def _align_kernel(xp: Any, attrs: Attrs, data: Any, rois: Any) -> Any:
    boxes = host(rois)
    bins_h, bins_w = pooled_size(attrs)
    outputs = []
    for roi in boxes:
        if roi[0] < 0:
            pooled = xp.zeros((data.shape[1], bins_h, bins_w), data.dtype)
        else:
            pooled = _align_one(xp, attrs, data[_batch_index(roi, data.shape[0])], roi)
        if attrs.position_sensitive:
            pooled = _position_sensitive(xp, pooled, bins_h, bins_w)
        outputs.append(pooled)
    if not outputs:
        return _roi_empty(xp, attrs, data, True)
    return xp.stack(outputs)


def _roi_empty(xp: Any, attrs: Attrs, data: Any, channels_per_bin: bool) -> Any:
    _, (shape,) = _roi_infer(channels_per_bin)(attrs, [data.shape, (0, 5)])
    return xp.zeros(shape, data.dtype)


register(OpDef(
    name="_contrib_ROIAlign",
    params=(
        Param("pooled_size", parse_int_tuple),
        Param("spatial_scale", parse_float),
        Param("sample_ratio", parse_int, -1),
        Param("position_sensitive", parse_bool, False),
        Param("aligned", parse_bool, False),
    ),
    inputs=("data", "rois"),
    infer_shape=_roi_infer(True),
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=_align_kernel,
    uncapturable="reads each ROI's sampling grid (its size too) from rois on the host",
    doc="Average of bilinear samples in each of pooled_size bins per ROI (sample_ratio "
        "samples per bin side, or adaptive; aligned shifts by half a pixel).",
))


# --- ROIPooling -------------------------------------------------------------------------------

def _round_half_away(value: float) -> int:
    return int(math.copysign(math.floor(abs(value) + 0.5), value))


def _bin_edges(start: int, extent: int, bins: int, length: int) -> list[tuple[int, int]]:
    """``[begin, end)`` of every bin along one axis, clipped to the feature map."""
    size = extent / bins
    edges = []
    for index in range(bins):
        begin = min(max(math.floor(index * size) + start, 0), length)
        end = min(max(math.ceil((index + 1) * size) + start, 0), length)
        edges.append((begin, end))
    return edges


def _pool_one(xp: Any, attrs: Attrs, feature: Any, roi: np.ndarray) -> Any:
    x1, y1, x2, y2 = (_round_half_away(float(value) * attrs.spatial_scale) for value in roi[1:5])
    bins_h, bins_w = pooled_size(attrs)
    rows = _bin_edges(y1, max(y2 - y1 + 1, 1), bins_h, feature.shape[1])
    cols = _bin_edges(x1, max(x2 - x1 + 1, 1), bins_w, feature.shape[2])
    pooled = xp.zeros((feature.shape[0], bins_h, bins_w), feature.dtype)
    for i, (top, bottom) in enumerate(rows):
        for j, (left, right) in enumerate(cols):
            if bottom > top and right > left:
                pooled[:, i, j] = feature[:, top:bottom, left:right].max(axis=(1, 2))
    return pooled


def _pool_kernel(xp: Any, attrs: Attrs, data: Any, rois: Any) -> Any:
    boxes = host(rois)
    bins_h, bins_w = pooled_size(attrs)
    outputs = [xp.zeros((data.shape[1], bins_h, bins_w), data.dtype) if roi[0] < 0 else
               _pool_one(xp, attrs, data[_batch_index(roi, data.shape[0])], roi)
               for roi in boxes]
    return xp.stack(outputs) if outputs else _roi_empty(xp, attrs, data, False)


register(OpDef(
    name="ROIPooling",
    aliases=("_npx_roi_pooling",),
    params=(
        Param("pooled_size", parse_int_tuple),
        Param("spatial_scale", parse_float),
    ),
    inputs=("data", "rois"),
    hidden_outputs=1,
    infer_shape=_roi_infer(False),
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=_pool_kernel,
    uncapturable="reads each ROI's bins from rois on the host",
    doc="Max over each of pooled_size bins per ROI, with ROI corners rounded to the feature "
        "map grid; empty bins give 0.",
))
