"""Cases for detection operators: NMS, box coding, ROI pooling and SSD's MultiBox ops."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from casefile import Case

Rng = Callable[[str], np.random.Generator]


def corner_boxes(rng: np.random.Generator, *lead: int) -> np.ndarray:
    """Random ``(x1, y1, x2, y2)`` boxes inside the unit square, in clusters that overlap."""
    start = rng.uniform(0.0, 0.6, (*lead, 2))
    size = rng.uniform(0.1, 0.4, (*lead, 2))
    return np.concatenate([start, start + size], axis=-1).astype(np.float32)


def distinct_scores(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Scores in (0, 1) without ties, so every sort order is unambiguous."""
    count = int(np.prod(shape))
    return ((rng.permutation(count) + 1) / (count + 1)).reshape(shape).astype(np.float32)


def nms_records(rng: np.random.Generator, batch: int, count: int, classes: int) -> np.ndarray:
    """``(batch, count, 6)`` rows of ``[class_id, score, x1, y1, x2, y2]``."""
    ids = rng.integers(0, classes, (batch, count, 1)).astype(np.float32)
    scores = distinct_scores(rng, batch, count, 1)
    return np.concatenate([ids, scores, corner_boxes(rng, batch, count)], axis=-1)


def box_nms_cases(rng_for: Rng) -> list[Case]:
    """``_contrib_box_nms`` over its edge attributes."""
    records = nms_records(rng_for("box_nms"), 2, 12, 3)
    records[0, 3, 1] = 0.25  # a score exactly at a threshold below
    center = records.copy()
    center[..., 2:4] = (records[..., 2:4] + records[..., 4:6]) / 2
    center[..., 4:6] = records[..., 4:6] - records[..., 2:4]
    moved = np.concatenate([records[..., 2:], records[..., :2]], axis=-1)
    op = "_contrib_box_nms"
    return [
        Case("box_nms_default", op, {"data": records}),
        Case("box_nms_class_aware", op, {"data": records},
             {"overlap_thresh": "0.3", "id_index": "0", "coord_start": "2", "score_index": "1"}),
        Case("box_nms_force_suppress", op, {"data": records},
             {"overlap_thresh": "0.3", "id_index": "0", "force_suppress": "True"}),
        Case("box_nms_valid_thresh_topk", op, {"data": records},
             {"overlap_thresh": "0.4", "valid_thresh": "0.25", "topk": "5"}),
        Case("box_nms_background", op, {"data": records},
             {"overlap_thresh": "0.4", "id_index": "0", "background_id": "1"}),
        Case("box_nms_center_to_corner", op, {"data": center},
             {"in_format": "center", "out_format": "corner", "overlap_thresh": "0.35"}),
        Case("box_nms_corner_to_center", op, {"data": records},
             {"in_format": "corner", "out_format": "center", "overlap_thresh": "0.35"}),
        Case("box_nms_coord_start0", "_contrib_box_non_maximum_suppression", {"data": moved},
             {"coord_start": "0", "score_index": "5", "id_index": "4", "overlap_thresh": "0.3"}),
        Case("box_nms_3d_batch", op, {"data": nms_records(rng_for("box_nms_3d"), 6, 5, 2)
                                      .reshape(2, 3, 5, 6)}, {"overlap_thresh": "0.2"}),
    ]


def box_coding_cases(rng_for: Rng) -> list[Case]:
    """``_contrib_box_decode`` (std, clip, formats) and ``_contrib_box_encode``."""
    rng = rng_for("box_decode")
    deltas = (rng.standard_normal((2, 6, 4)) * 0.5).astype(np.float32)
    anchors = corner_boxes(rng, 1, 6)
    center = anchors.copy()
    center[..., :2] = (anchors[..., :2] + anchors[..., 2:]) / 2
    center[..., 2:] = anchors[..., 2:] - anchors[..., :2]
    stds = {"std0": "0.1", "std1": "0.1", "std2": "0.2", "std3": "0.2"}
    rng = rng_for("box_encode")
    encode_inputs = {
        "samples": rng.choice([-1.0, 0.0, 1.0], (2, 5)).astype(np.float32),
        "matches": rng.integers(0, 3, (2, 5)).astype(np.float32),
        "anchors": corner_boxes(rng, 2, 5),
        "refs": corner_boxes(rng, 2, 3),
        "means": np.array([0.0, 0.1, -0.1, 0.0], np.float32),
        "stds": np.array([0.1, 0.1, 0.2, 0.2], np.float32),
    }
    return [
        Case("box_decode_default", "_contrib_box_decode", {"data": deltas, "anchors": anchors}),
        Case("box_decode_std_clip", "_contrib_box_decode", {"data": deltas * 8,
                                                              "anchors": anchors},
             {**stds, "clip": "0.5"}),
        Case("box_decode_center_anchors", "_contrib_box_decode",
             {"data": deltas, "anchors": center}, {"format": "center"}),
        Case("box_encode", "_contrib_box_encode", encode_inputs),
        Case("box_iou_corner", "_contrib_box_iou",
             {"lhs": corner_boxes(rng, 2, 3), "rhs": corner_boxes(rng, 4)}),
        Case("box_iou_center", "_contrib_box_iou",
             {"lhs": corner_boxes(rng, 5), "rhs": corner_boxes(rng, 3, 2)}, {"format": "center"}),
    ]


def roi_cases(rng_for: Rng) -> list[Case]:
    """``_contrib_ROIAlign`` (aligned, sample_ratio, scale) and ``ROIPooling``."""
    rng = rng_for("roi")
    data = rng.standard_normal((2, 3, 12, 10)).astype(np.float32)
    boxes = corner_boxes(rng, 5) * np.array([36, 30, 36, 30], np.float32)
    rois = np.concatenate([np.array([[0], [1], [0], [1], [1]], np.float32), boxes], axis=1)
    rois[4, 1:] = [40.0, 2.0, 44.0, 50.0]  # partly outside the feature map
    rois[2, 1:] = [9.0, 9.2, 9.3, 9.4]  # smaller than one feature-map cell
    inputs = {"data": data, "rois": rois}
    scale = {"spatial_scale": "0.25"}
    return [
        Case("roi_align_default", "_contrib_ROIAlign", inputs, {"pooled_size": "(3, 3)", **scale}),
        Case("roi_align_aligned", "_contrib_ROIAlign", inputs,
             {"pooled_size": "(2, 4)", "aligned": "True", **scale}),
        Case("roi_align_sample_ratio", "_contrib_ROIAlign", inputs,
             {"pooled_size": "(4, 3)", "sample_ratio": "2", **scale}),
        Case("roi_align_sample_ratio1_aligned", "_contrib_ROIAlign", inputs,
             {"pooled_size": "(2, 2)", "sample_ratio": "1", "aligned": "True",
              "spatial_scale": "0.3"}),
        Case("roi_align_position_sensitive", "_contrib_ROIAlign",
             {"data": rng.standard_normal((2, 8, 6, 5)).astype(np.float32), "rois": rois},
             {"pooled_size": "(2, 2)", "position_sensitive": "True", "spatial_scale": "0.2"}),
        Case("roi_pooling", "ROIPooling", inputs, {"pooled_size": "(3, 2)", **scale}),
        Case("roi_pooling_scale1", "ROIPooling", {"data": data, "rois": rois / 3.0},
             {"pooled_size": "(4, 4)", "spatial_scale": "1.0"}),
        Case("npx_roi_pooling", "_npx_roi_pooling", inputs,
             {"pooled_size": "(2, 2)", "spatial_scale": "0.2"}),
    ]


def multibox_cases(rng_for: Rng) -> list[Case]:
    """``_contrib_MultiBoxPrior`` and ``_contrib_MultiBoxDetection`` with their attributes."""
    feature = np.zeros((1, 2, 3, 4), np.float32)
    cases = [
        Case("multibox_prior_default", "_contrib_MultiBoxPrior", {"data": feature}),
        Case("multibox_prior_sizes_ratios", "_contrib_MultiBoxPrior", {"data": feature},
             {"sizes": "(0.5, 0.25)", "ratios": "(1, 2, 0.5)"}),
        Case("multibox_prior_ratio0_steps", "_contrib_MultiBoxPrior", {"data": feature},
             {"sizes": "(0.4,)", "ratios": "(2, 1)", "steps": "(0.3, 0.2)",
              "offsets": "(0.2, 0.7)", "clip": "True"}),
    ]
    rng = rng_for("multibox_detection")
    anchors = corner_boxes(rng, 1, 10)
    logits = rng.standard_normal((2, 4, 10)).astype(np.float32) * 2
    probs = (np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)).astype(np.float32)
    loc = (rng.standard_normal((2, 40)) * 0.5).astype(np.float32)
    inputs = {"cls_prob": probs, "loc_pred": loc, "anchor": anchors}
    op = "_contrib_MultiBoxDetection"
    cases += [
        Case("multibox_detection_default", op, inputs),
        Case("multibox_detection_force_topk", op, inputs,
             {"force_suppress": "True", "nms_topk": "4", "nms_threshold": "0.3"}),
        Case("multibox_detection_threshold_noclip", op, inputs,
             {"threshold": "0.3", "clip": "False", "variances": "(0.2, 0.2, 0.1, 0.1)"}),
        Case("multibox_detection_background2", op, inputs,
             {"background_id": "2", "nms_threshold": "0.45"}),
        Case("npx_multibox_detection", "_npx_multibox_detection", inputs, {"nms_topk": "6"}),
        Case("npx_multibox_prior", "_npx_multibox_prior", {"data": feature},
             {"sizes": "(0.3, 0.6)", "ratios": "(1, 3)"}),
    ]
    return cases


def detection_cases(rng_for: Rng) -> list[Case]:
    """Every case of this module."""
    return (box_nms_cases(rng_for) + box_coding_cases(rng_for) + roi_cases(rng_for)
            + multibox_cases(rng_for))
