"""Region proposals of MXNet's Faster R-CNN: ``_contrib_Proposal`` and ``_contrib_MultiProposal``.

Inputs: ``cls_prob (N, 2A, H, W)`` (background then foreground score per anchor),
``bbox_pred (N, 4A, H, W)`` and ``im_info (N, 3)`` (image height, width, scale). Each feature-map
cell carries ``A = len(ratios) * len(scales)`` anchors; each anchor's deltas make a box, clipped
to the image. Boxes under ``rpn_min_size * scale`` or on cells outside the image get score -1.
The ``rpn_pre_nms_top_n`` best go through greedy NMS; the ``rpn_post_nms_top_n`` survivors are
written as ``(batch index, x1, y1, x2, y2)``, repeated cyclically when fewer survive.
Sizes use MXNet's legacy "+1" pixel convention (a box from 0 to 15 is 16 wide).
Proposal handles one image; MultiProposal any number, image after image.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import parse_bool, parse_float, parse_float_tuple, parse_int
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred
from engine.ops.vision.boxes import host


def anchors(attrs: Attrs) -> np.ndarray:
    """``(A, 4)`` anchors around the first cell, ratios outer and scales inner, as MXNet."""
    side = float(attrs.feature_stride)
    centre = 0.5 * (side - 1.0)
    rows = []
    for ratio in attrs.ratios:
        for scale in attrs.scales:
            base_width = np.floor(np.sqrt(np.floor(side * side / ratio)) + 0.5)
            width = np.float32(base_width * scale)
            height = np.float32(np.floor(base_width * ratio + 0.5) * scale)
            rows.append([centre - 0.5 * (width - 1), centre - 0.5 * (height - 1),
                         centre + 0.5 * (width - 1), centre + 0.5 * (height - 1)])
    return np.array(rows, np.float32)


def shifted_anchors(attrs: Attrs, height: int, width: int) -> np.ndarray:
    """``(H, W, A, 4)`` anchors of every cell."""
    stride = attrs.feature_stride
    shift_x = np.arange(width, dtype=np.float32) * stride
    shift_y = np.arange(height, dtype=np.float32) * stride
    shifts = np.stack(np.broadcast_arrays(shift_x[None, :], shift_y[:, None],
                                          shift_x[None, :], shift_y[:, None]), axis=-1)
    return (shifts[:, :, None, :] + anchors(attrs)[None, None]).astype(np.float32)


def _decode(attrs: Attrs, boxes: np.ndarray, deltas: np.ndarray, info: np.ndarray) -> np.ndarray:
    """Boxes moved by their deltas (``(H, W, A, 4)`` both) and clipped to the image."""
    if attrs.iou_loss:  # deltas move the corners directly
        moved = boxes + deltas
    else:
        size = boxes[..., 2:4] - boxes[..., 0:2] + np.float32(1)
        centre = boxes[..., 0:2] + np.float32(0.5) * (size - np.float32(1))
        new_centre = deltas[..., 0:2] * size + centre
        new_size = np.exp(deltas[..., 2:4]) * size
        half = np.float32(0.5) * (new_size - np.float32(1))
        moved = np.concatenate([new_centre - half, new_centre + half], axis=-1)
    limit = np.array([info[1], info[0], info[1], info[0]], np.float32) - np.float32(1)
    return np.maximum(np.minimum(moved, limit), np.float32(0)).astype(np.float32)


def _scored_boxes(attrs: Attrs, scores: np.ndarray, deltas: np.ndarray,
                  info: np.ndarray) -> np.ndarray:
    """``(H*W*A, 5)`` rows ``(x1, y1, x2, y2, score)`` of one image, cell-major as MXNet."""
    count, height, width = scores.shape[0] // 2, scores.shape[1], scores.shape[2]
    boxes = shifted_anchors(attrs, height, width)
    moved = _decode(attrs, boxes, deltas.reshape(count, 4, height, width).transpose(2, 3, 0, 1),
                    info)
    score = scores[count:].transpose(1, 2, 0).copy()
    outside = ((np.arange(height) >= int(info[0] / attrs.feature_stride))[:, None]
               | (np.arange(width) >= int(info[1] / attrs.feature_stride))[None, :])
    score[outside] = -1
    rows = np.concatenate([moved, score[..., None]], axis=-1).reshape(-1, 5)
    return _filter_small(rows, np.float32(attrs.rpn_min_size * info[2]))


def _filter_small(rows: np.ndarray, min_size: np.float32) -> np.ndarray:
    """Boxes narrower or lower than ``min_size`` grow by it and lose their score (-1)."""
    size = rows[:, 2:4] - rows[:, 0:2] + np.float32(1)
    small = (size < min_size).any(axis=1)
    grow = np.array([-1, -1, 1, 1], np.float32) * (min_size / np.float32(2))
    rows[small, 0:4] += grow
    rows[small, 4] = -1
    return rows


def _suppress(rows: np.ndarray, threshold: float, limit: int) -> list[int]:
    """Greedy NMS with "+1" areas over score-ordered rows; at most ``limit`` survivors."""
    area = (rows[:, 2] - rows[:, 0] + 1) * (rows[:, 3] - rows[:, 1] + 1)
    suppressed = np.zeros(len(rows), bool)
    keep: list[int] = []
    for index in range(len(rows)):
        if len(keep) >= limit:
            break
        if suppressed[index]:
            continue
        keep.append(index)
        low = np.maximum(rows[index, 0:2], rows[index + 1:, 0:2])
        high = np.minimum(rows[index, 2:4], rows[index + 1:, 2:4])
        inter = np.maximum(np.float32(0), high - low + np.float32(1)).prod(axis=1)
        overlap = inter / (area[index] + area[index + 1:] - inter)
        suppressed[index + 1:] |= overlap > np.float32(threshold)
    return keep


def _propose_one(attrs: Attrs, scores: np.ndarray, deltas: np.ndarray,
                 info: np.ndarray) -> np.ndarray:
    """``(rpn_post_nms_top_n, 5)`` rows ``(x1, y1, x2, y2, score)`` for one image."""
    rows = _scored_boxes(attrs, scores, deltas, info)
    order = np.argsort(-rows[:, 4], kind="stable")
    if attrs.rpn_pre_nms_top_n > 0:
        order = order[:attrs.rpn_pre_nms_top_n]
    ordered = rows[order]
    keep = _suppress(ordered, attrs.threshold, attrs.rpn_post_nms_top_n)
    picks = [keep[k % len(keep)] for k in range(attrs.rpn_post_nms_top_n)]
    return ordered[picks]


def _kernel(xp: Any, attrs: Attrs, cls_prob: Any, bbox_pred: Any, im_info: Any) -> Any:
    scores, deltas, info = host(cls_prob), host(bbox_pred), host(im_info)
    rois, kept_scores = [], []
    for image in range(scores.shape[0]):
        rows = _propose_one(attrs, scores[image], deltas[image], info[image])
        index = np.full((len(rows), 1), image, np.float32)
        rois.append(np.concatenate([index, rows[:, 0:4]], axis=1))
        kept_scores.append(rows[:, 4:5])
    output = xp.asarray(np.concatenate(rois).astype(cls_prob.dtype))
    if not attrs.output_score:
        return output
    return output, xp.asarray(np.concatenate(kept_scores).astype(cls_prob.dtype))


def _infer(single_image: bool) -> Any:
    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        cls_prob, bbox_pred, im_info = shapes
        count = len(attrs.ratios) * len(attrs.scales)
        if cls_prob is not None and (len(cls_prob) != 4 or cls_prob[1] not in (0, 2 * count)):
            raise ShapeError(f"cls_prob must be (N, {2 * count}, H, W) for {count} anchors "
                             f"({len(attrs.ratios)} ratios x {len(attrs.scales)} scales); "
                             f"got {cls_prob}")
        batch = 0 if cls_prob is None else cls_prob[0]
        if single_image and batch not in (0, 1):
            raise ShapeError(f"_contrib_Proposal takes one image; got a batch of {batch} "
                             "(MultiProposal takes several)")
        if cls_prob is not None:
            bbox_pred = (batch, 4 * count, cls_prob[2], cls_prob[3])
            im_info = (batch, 3)
        rows = batch * attrs.rpn_post_nms_top_n
        outputs = [(rows, 5), (rows, 1)]
        return [cls_prob, bbox_pred, im_info], outputs if attrs.output_score else outputs[:1]
    return infer


PARAMS = (
    Param("rpn_pre_nms_top_n", parse_int, 6000),
    Param("rpn_post_nms_top_n", parse_int, 300),
    Param("threshold", parse_float, 0.7),
    Param("rpn_min_size", parse_int, 16),
    Param("scales", parse_float_tuple, (4.0, 8.0, 16.0, 32.0)),
    Param("ratios", parse_float_tuple, (0.5, 1.0, 2.0)),
    Param("feature_stride", parse_int, 16),
    Param("output_score", parse_bool, False),
    Param("iou_loss", parse_bool, False),
)

for _name, _single in (("_contrib_Proposal", True), ("_contrib_MultiProposal", False)):
    register(OpDef(
        name=_name,
        params=PARAMS,
        inputs=("cls_prob", "bbox_pred", "im_info"),
        outputs=lambda attrs: ("output", "score") if attrs.output_score else ("output",),
        hidden_outputs=lambda attrs: 0 if attrs.output_score else 1,
        infer_shape=_infer(_single),
        infer_dtype=lambda attrs, dtypes: (
            dtypes, [dtypes[0]] * (2 if attrs.output_score else 1)),
        kernel=_kernel,
        uncapturable="reads scores, deltas and image sizes on the host every run",
        doc="Faster R-CNN region proposals: anchors moved by their deltas, clipped, filtered "
            "by size, top-k by score, greedy NMS; rows (batch index, x1, y1, x2, y2).",
    ))
