"""SSD's anchor ops: ``_contrib_MultiBoxPrior`` (anchors) and ``_contrib_MultiBoxDetection``.

Detection keeps a fixed ``(batch, anchors, 6)`` output of ``[class, score, x1, y1, x2, y2]``:
valid detections come first by descending score, suppressed ones keep their row with class -1,
and anchors under the score threshold leave all-(-1) rows at the end. Like MXNet 1.9, class 0
is always the background (``background_id`` is accepted but does not change the result), and
with ``nms_topk`` only the best ``nms_topk`` rows are reordered; the rest of the valid rows stay
in anchor order, marked -1. On a GPU the same result comes from array ops alone
(`detect_batches`), so nothing is read on the host and the plan can be captured.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.kernels.workspace import uploaded
from engine.ops.attrs import parse_bool, parse_float, parse_float_tuple, parse_int
from engine.ops.dtypes import FLOAT32
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred
from engine.ops.vision.boxes import greedy_keep, greedy_keep_batched

# --- MultiBoxPrior ----------------------------------------------------------------------------

def _anchor_extents(attrs: Attrs, height: int, width: int) -> list[tuple[float, float]]:
    """Half (width, height) of each anchor per location, in MXNet's order."""
    aspect = height / width
    ratio = math.sqrt(attrs.ratios[0]) if attrs.ratios else 1.0
    extents = [(size * aspect * ratio / 2, size / ratio / 2) for size in attrs.sizes]
    for other in attrs.ratios[1:]:
        root = math.sqrt(other)
        extents.append((attrs.sizes[0] * aspect * root / 2, attrs.sizes[0] / root / 2))
    return extents


def _prior_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return shapes, [None]
    if len(data) != 4:
        raise ShapeError(f"MultiBoxPrior: data must be 4-D (N, C, H, W); got {data}")
    per_location = len(attrs.sizes) + len(attrs.ratios) - 1
    return shapes, [(1, data[2] * data[3] * per_location, 4)]


def _prior_kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    # Anchors depend on the feature map's size only: a device gets them uploaded once.
    height, width = data.shape[2], data.shape[3]
    return uploaded(xp, ("multibox_prior", attrs, height, width),
                    partial(_anchors, attrs, height, width))


def _anchors(attrs: Attrs, height: int, width: int) -> np.ndarray:
    """``(1, height * width * anchors, 4)`` float32 corner anchors (see `_prior_kernel`)."""
    step_y = attrs.steps[0] if attrs.steps[0] > 0 else 1.0 / height
    step_x = attrs.steps[1] if attrs.steps[1] > 0 else 1.0 / width
    center_y = (np.arange(height) + attrs.offsets[0]) * step_y
    center_x = (np.arange(width) + attrs.offsets[1]) * step_x
    half = np.array(_anchor_extents(attrs, height, width))  # (anchors, 2): half w, half h
    cy, cx = np.meshgrid(center_y, center_x, indexing="ij")
    centers = np.stack([cx, cy], axis=-1)[:, :, None, :]
    boxes = np.concatenate([centers - half, centers + half], axis=-1).reshape(1, -1, 4)
    if attrs.clip:
        boxes = np.clip(boxes, 0.0, 1.0)
    return boxes.astype(FLOAT32)


register(OpDef(
    name="_contrib_MultiBoxPrior",
    aliases=("_npx_multibox_prior",),
    params=(
        Param("sizes", parse_float_tuple, (1.0,)),
        Param("ratios", parse_float_tuple, (1.0,)),
        Param("clip", parse_bool, False),
        Param("steps", parse_float_tuple, (-1.0, -1.0)),
        Param("offsets", parse_float_tuple, (0.5, 0.5)),
    ),
    infer_shape=_prior_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [FLOAT32]),
    kernel=_prior_kernel,
    doc="Corner anchors for every feature-map location: each size with ratios[0], then "
        "sizes[0] with each further ratio.",
))


# --- MultiBoxDetection ------------------------------------------------------------------------

def decode_ssd(loc: np.ndarray, anchors: np.ndarray, variances: tuple[float, ...],
               clip: bool) -> np.ndarray:
    """Corner boxes from SSD offsets ``(n, 4)`` against corner anchors ``(n, 4)``."""
    size = anchors[:, 2:4] - anchors[:, 0:2]
    center = (anchors[:, 0:2] + anchors[:, 2:4]) / 2
    variance = np.asarray(variances, loc.dtype)
    new_center = loc[:, 0:2] * variance[0:2] * size + center
    half = np.exp(loc[:, 2:4] * variance[2:4]) * size / 2
    boxes = np.concatenate([new_center - half, new_center + half], axis=1)
    return np.clip(boxes, 0.0, 1.0) if clip else boxes


def _detect_one(probs: np.ndarray, loc: np.ndarray, anchors: np.ndarray,
                attrs: Attrs) -> np.ndarray:
    """``(anchors, 6)`` detections of one image (see the module docstring for the layout)."""
    count = probs.shape[1]
    foreground = probs[1:]
    classes = np.argmax(foreground, axis=0)
    scores = foreground[classes, np.arange(count)]
    valid = np.flatnonzero(scores >= attrs.threshold)
    boxes = decode_ssd(loc.reshape(count, 4)[valid], anchors[valid], attrs.variances, attrs.clip)
    rows = np.concatenate([classes[valid, None].astype(probs.dtype), scores[valid, None],
                           boxes.astype(probs.dtype)], axis=1)
    result = np.full((count, 6), -1, probs.dtype)
    result[:len(rows)] = rows
    if len(rows) == 0 or not 0 < attrs.nms_threshold <= 1:
        return result
    order = np.argsort(-rows[:, 1], kind="stable")
    keep = len(rows) if attrs.nms_topk <= 0 else min(attrs.nms_topk, len(rows))
    result[:keep] = rows[order[:keep]]
    result[keep:len(rows), 0] = -1
    candidates = result[:len(rows)]
    ids = None if attrs.force_suppress else candidates[:, 0]
    alive = greedy_keep(candidates[:, 2:6], ids, attrs.nms_threshold, inclusive=True,
                        alive=candidates[:, 0] >= 0)
    candidates[~alive, 0] = -1
    return result


def _detection_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    probs, loc, anchors = shapes
    if probs is None:
        return shapes, [None]
    if len(probs) != 3:
        raise ShapeError(f"MultiBoxDetection: cls_prob must be (batch, classes, anchors); "
                         f"got {probs}")
    batch, _, count = probs
    if loc is not None and tuple(loc) != (batch, count * 4):
        raise ShapeError(f"MultiBoxDetection: loc_pred has shape {loc}; expected "
                         f"({batch}, {count * 4}) for {count} anchors")
    if anchors is not None and tuple(anchors[-2:]) != (count, 4):
        raise ShapeError(f"MultiBoxDetection: anchor has shape {anchors}; expected "
                         f"(1, {count}, 4)")
    return shapes, [(batch, count, 6)]


def _detection_kernel(xp: Any, attrs: Attrs, cls_prob: Any, loc_pred: Any, anchor: Any) -> Any:
    anchors = anchor.reshape(-1, 4)
    if xp is not np:
        return detect_batches(xp, cls_prob, loc_pred, anchors, attrs)
    return np.stack([_detect_one(cls_prob[b], loc_pred[b], anchors, attrs)
                     for b in range(cls_prob.shape[0])])


def _decode_batches(xp: Any, loc: Any, anchors: Any, attrs: Attrs) -> Any:
    """`decode_ssd` of ``(B, n, 4)`` offsets against ``(n, 4)`` anchors, with array ops only."""
    size = anchors[:, 2:4] - anchors[:, 0:2]
    center = (anchors[:, 0:2] + anchors[:, 2:4]) / 2
    variance = uploaded(xp, ("ssd_variances", attrs.variances, loc.dtype.str),
                        lambda: np.asarray(attrs.variances, loc.dtype))
    new_center = loc[..., 0:2] * variance[0:2] * size + center
    half = xp.exp(loc[..., 2:4] * variance[2:4]) * size / 2
    boxes = xp.concatenate([new_center - half, new_center + half], axis=-1)
    return xp.clip(boxes, 0.0, 1.0) if attrs.clip else boxes


def _valid_rows(xp: Any, probs: Any, loc: Any, anchors: Any, attrs: Attrs) -> tuple[Any, Any]:
    """``(B, n, 6)`` rows of the anchors over the threshold, in anchor order and first (the
    others after them), and how many there are per image ``(B, 1)``."""
    foreground = probs[:, 1:]
    classes = xp.argmax(foreground, axis=1)
    scores = xp.take_along_axis(foreground, classes[:, None], axis=1)[:, 0]
    boxes = _decode_batches(xp, loc.reshape(*scores.shape, 4), anchors, attrs)
    rows = xp.concatenate([classes[..., None].astype(probs.dtype), scores[..., None],
                           boxes.astype(probs.dtype)], axis=-1)
    valid = scores >= attrs.threshold
    order = xp.argsort((~valid).astype(np.int8), axis=1, kind="stable")
    return xp.take_along_axis(rows, order[..., None], axis=1), valid.sum(axis=1, keepdims=True)


def detect_batches(xp: Any, probs: Any, loc: Any, anchors: Any, attrs: Attrs) -> Any:
    """`_detect_one` for every image at once with array ops only: nothing is read on the host,
    so a GPU plan holding the op can be captured as a CUDA graph."""
    rows, count = _valid_rows(xp, probs, loc, anchors, attrs)
    position = xp.arange(rows.shape[1])[None, :]
    minus_one = probs.dtype.type(-1)
    if not 0 < attrs.nms_threshold <= 1:
        return xp.where((position < count)[..., None], rows, minus_one)
    key = xp.where(position < count, -rows[..., 1], xp.inf)
    ranked = xp.take_along_axis(rows, xp.argsort(key, axis=1, kind="stable")[..., None], axis=1)
    keep = count if attrs.nms_topk <= 0 else xp.minimum(count, attrs.nms_topk)
    alive = position < keep
    # The best ``keep`` rows sorted; the other valid rows stay in anchor order, class -1.
    result = xp.where(alive[..., None], ranked, rows)
    result = xp.where((position < count)[..., None], result, minus_one)
    limit = rows.shape[1] if attrs.nms_topk <= 0 else min(attrs.nms_topk, rows.shape[1])
    classes = None if attrs.force_suppress else result[:, :limit, 0]
    greedy_keep_batched(xp, result[:, :limit, 2:6], classes, attrs.nms_threshold, True,
                        alive[:, :limit])
    result[..., 0] = xp.where(alive, result[..., 0], minus_one)
    return result


register(OpDef(
    name="_contrib_MultiBoxDetection",
    aliases=("_npx_multibox_detection",),
    params=(
        Param("clip", parse_bool, True),
        Param("threshold", parse_float, 0.01),
        Param("background_id", parse_int, 0),
        Param("nms_threshold", parse_float, 0.5),
        Param("force_suppress", parse_bool, False),
        Param("variances", parse_float_tuple, (0.1, 0.1, 0.2, 0.2)),
        Param("nms_topk", parse_int, -1),
    ),
    inputs=("cls_prob", "loc_pred", "anchor"),
    infer_shape=_detection_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=_detection_kernel,
    doc="SSD detections per anchor: best foreground class and score, decoded box, then "
        "greedy NMS (fixed (batch, anchors, 6) output; see the module notes).",
))
