"""Position-sensitive ROI pooling (R-FCN): ``_contrib_PSROIPooling`` and
``_contrib_DeformablePSROIPooling``.

Output channel ``ctop``, bin ``(ph, pw)`` of a ROI pools input channel
``(ctop * group_size + gh) * group_size + gw``, where ``(gh, gw)`` is the bin's cell in a
``group_size`` grid. ``rois`` rows are (batch index, x1, y1, x2, y2); corners are rounded
before ``spatial_scale`` maps them onto the feature map, as in MXNet.

PSROIPooling averages each integer bin, read from a summed-area table (in float64, so large maps
keep their digits); the deformable variant averages ``sample_per_part``^2 bilinear samples per
bin, its bins shifted by ``trans`` (scaled by ``trans_std`` and the ROI size). Both compute every
bin with array operations on the device, reading nothing back to the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import parse_bool, parse_float, parse_int
from engine.ops.dtypes import FLOAT64
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred, merge


def _group_size(attrs: Attrs) -> int:
    return attrs.group_size or attrs.pooled_size


def _infer(deformable: bool) -> Any:
    op = "DeformablePSROIPooling" if deformable else "PSROIPooling"

    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        data, rois = shapes[:2]
        if data is not None and len(data) != 4:
            raise ShapeError(f"{op}: data must be (N, C, H, W); got {data}")
        rois = merge(rois, (0, 5), f"{op} rois (R, 5)")
        group, size = _group_size(attrs), attrs.pooled_size
        if group < 1 or size < 1:
            raise ShapeError(f"{op}: pooled_size ({size}) and group_size ({group}) must be "
                             "positive")
        expected = attrs.output_dim * group * group
        if data is not None and data[1] and data[1] != expected:
            raise ShapeError(f"{op}: data has {data[1]} channels; expected output_dim * "
                             f"group_size^2 = {expected}")
        filled = [data, rois, *shapes[2:]]
        if len(shapes) > 2 and shapes[2] is not None and len(shapes[2]) != 4:
            raise ShapeError(f"{op}: trans must be (R, 2 * classes, part, part); got {shapes[2]}")
        out = None if rois[0] == 0 else (rois[0], attrs.output_dim, size, size)
        return filled, [out]

    return infer


def _grid(xp: Any, attrs: Attrs) -> tuple[Any, Any, Any]:
    """Broadcastable (1, D, P, 1), (1, 1, P, 1) and (1, 1, 1, P) output channel, row and column
    indices, and the input channel each output cell reads."""
    size, group = attrs.pooled_size, _group_size(attrs)
    bins = xp.arange(size)
    cell = xp.clip(xp.floor(bins * group / size).astype(np.int64), 0, group - 1)
    channel = (xp.arange(attrs.output_dim)[:, None, None] * group + cell[None, :, None]) * group \
        + cell[None, None, :]
    return bins, channel[None], size


def _roi_box(xp: Any, attrs: Attrs, rois: Any, shift: float) -> tuple[Any, ...]:
    """Per ROI (R, 1, 1, 1): batch index, start x/y, width, height (after rounding, scaling)."""
    corners = xp.where(rois[:, 1:] >= 0, xp.floor(rois[:, 1:] + 0.5),
                       xp.ceil(rois[:, 1:] - 0.5))  # C's round: halves away from zero
    scale = rois.dtype.type(attrs.spatial_scale)
    start_x, start_y = corners[:, 0] * scale - shift, corners[:, 1] * scale - shift
    end_x, end_y = (corners[:, 2] + 1) * scale - shift, (corners[:, 3] + 1) * scale - shift
    minimum = rois.dtype.type(0.1)
    width, height = xp.maximum(end_x - start_x, minimum), xp.maximum(end_y - start_y, minimum)
    batch = rois[:, 0].astype(np.int64)
    return tuple(value.reshape(-1, 1, 1, 1) for value in (batch, start_x, start_y, width, height))


def _psroi_pool(xp: Any, attrs: Attrs, data: Any, rois: Any) -> Any:
    batch_count, _, height, width = data.shape
    bins, channel, size = _grid(xp, attrs)
    bins = bins.astype(rois.dtype)  # bin edges in the rois' precision, as MXNet floors them
    batch, start_x, start_y, roi_w, roi_h = _roi_box(xp, attrs, rois, 0.0)
    bin_h, bin_w = roi_h / size, roi_w / size
    rows, cols = bins[None, None, :, None], bins[None, None, None, :]
    top = xp.clip(xp.floor(rows * bin_h + start_y), 0, height).astype(np.int64)
    bottom = xp.clip(xp.ceil((rows + 1) * bin_h + start_y), 0, height).astype(np.int64)
    left = xp.clip(xp.floor(cols * bin_w + start_x), 0, width).astype(np.int64)
    right = xp.clip(xp.ceil((cols + 1) * bin_w + start_x), 0, width).astype(np.int64)
    table = xp.zeros((*data.shape[:2], height + 1, width + 1), FLOAT64)
    table[:, :, 1:, 1:] = data.astype(FLOAT64).cumsum(axis=2).cumsum(axis=3)
    plane = xp.clip(batch, 0, batch_count - 1) * data.shape[1] + channel  # (R, D, P, P)
    flat = table.reshape(-1)

    def corner(row: Any, col: Any) -> Any:
        return xp.take(flat, (plane * (height + 1) + row) * (width + 1) + col)

    total = corner(bottom, right) - corner(top, right) - corner(bottom, left) + corner(top, left)
    area = (bottom - top) * (right - left)
    mean = total / xp.maximum(area, 1)
    return xp.where(area > 0, mean, 0).astype(data.dtype)


register(OpDef(
    name="_contrib_PSROIPooling",
    params=(Param("spatial_scale", parse_float), Param("output_dim", parse_int),
            Param("pooled_size", parse_int), Param("group_size", parse_int, 0)),
    inputs=("data", "rois"),
    infer_shape=_infer(False),
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=_psroi_pool,
    doc="Position-sensitive average pooling of each ROI into pooled_size^2 bins, bin (i, j) "
        "of output channel c reading its own input channel.",
))


# --- deformable -------------------------------------------------------------------------------

def _part_shift(xp: Any, attrs: Attrs, trans: Any, size: int) -> tuple[Any, Any]:
    """(R, D, P, P) x and y shifts of each bin, in units of the ROI's width and height."""
    parts = attrs.part_size or size
    classes = trans.shape[1] // 2
    per_class = attrs.output_dim // classes
    bins = xp.arange(size)
    part = xp.floor(bins / size * parts).astype(np.int64)
    class_id = xp.arange(attrs.output_dim) // per_class
    rows = part[None, None, :, None]
    cols = part[None, None, None, :]
    roi = xp.arange(trans.shape[0])[:, None, None, None]
    shift_x = trans[roi, (2 * class_id)[None, :, None, None], rows, cols]
    shift_y = trans[roi, (2 * class_id + 1)[None, :, None, None], rows, cols]
    std = trans.dtype.type(attrs.trans_std)
    return shift_x * std, shift_y * std


def _bilinear(xp: Any, flat: Any, plane: Any, x: Any, y: Any, height: int, width: int) -> Any:
    """Bilinear samples at (x, y) inside the map; ``plane`` selects (batch, channel)."""
    x1, y1 = xp.floor(x), xp.floor(y)
    x2, y2 = xp.ceil(x), xp.ceil(y)
    dx, dy = x - x1, y - y1

    def at(row: Any, col: Any) -> Any:
        return xp.take(flat, (plane * height + row.astype(np.int64)) * width
                       + col.astype(np.int64))

    return ((1 - dx) * (1 - dy) * at(y1, x1) + (1 - dx) * dy * at(y2, x1)
            + dx * (1 - dy) * at(y1, x2) + dx * dy * at(y2, x2))


def _deformable_pool(xp: Any, attrs: Attrs, data: Any, rois: Any, trans: Any = None) -> Any:
    batch_count, channels, height, width = data.shape
    bins, channel, size = _grid(xp, attrs)
    bins = bins.astype(data.dtype)
    batch, start_x, start_y, roi_w, roi_h = _roi_box(xp, attrs, rois, 0.5)
    bin_h, bin_w = roi_h / size, roi_w / size
    shift_x = shift_y = data.dtype.type(0)
    if not attrs.no_trans:
        shift_x, shift_y = _part_shift(xp, attrs, trans, size)
    left = bins[None, None, None, :] * bin_w + start_x + shift_x * roi_w
    top = bins[None, None, :, None] * bin_h + start_y + shift_y * roi_h
    plane = xp.clip(batch, 0, batch_count - 1) * channels + channel
    flat = data.reshape(-1)
    total = xp.zeros(plane.shape, data.dtype)
    count = xp.zeros(plane.shape, data.dtype)
    samples = attrs.sample_per_part
    for i in range(samples):
        for j in range(samples):
            x = left + j * (bin_w / samples)
            y = top + i * (bin_h / samples)
            inside = (x >= -0.5) & (x <= width - 0.5) & (y >= -0.5) & (y <= height - 0.5)
            x = xp.clip(x, 0, width - 1)
            y = xp.clip(y, 0, height - 1)
            value = _bilinear(xp, flat, plane, x, y, height, width)
            total += xp.where(inside, value, 0)
            count += inside
    return xp.where(count > 0, total / xp.maximum(count, 1), 0).astype(data.dtype)


register(OpDef(
    name="_contrib_DeformablePSROIPooling",
    params=(Param("spatial_scale", parse_float), Param("output_dim", parse_int),
            Param("group_size", parse_int), Param("pooled_size", parse_int),
            Param("part_size", parse_int, 0), Param("sample_per_part", parse_int, 1),
            Param("trans_std", parse_float, 0.0), Param("no_trans", parse_bool, False)),
    inputs=lambda attrs: ("data", "rois") if attrs.no_trans else ("data", "rois", "trans"),
    hidden_outputs=1,
    infer_shape=_infer(True),
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=_deformable_pool,
    doc="Position-sensitive pooling of bilinear samples per bin, each bin shifted by trans "
        "(R-FCN's deformable PSROI pooling).",
))
