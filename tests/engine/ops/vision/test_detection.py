"""Detection ops beyond the MXNet cases: partial shapes, bad shapes, empty and edge inputs."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import InputError, ShapeError
from engine.ops import get_op
from engine.ops.vision.boxes import greedy_keep, pairwise_iou, to_center, to_corner
from tests.engine.ops.helpers import infer, run

RNG = np.random.default_rng(5)


def records(count: int, scores: list[float]) -> np.ndarray:
    """``[id, score, x1, y1, x2, y2]`` rows, all the same unit box (so all overlap fully)."""
    rows = np.zeros((1, count, 6), np.float32)
    rows[0, :, 1] = scores
    rows[0, :, 4:6] = 1.0
    return rows


def test_corner_and_center_round_trip_and_iou() -> None:
    boxes = np.array([[0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 3.0, 2.0]], np.float32)
    np.testing.assert_allclose(to_corner(np, to_center(np, boxes)), boxes)
    iou = pairwise_iou(np, boxes, boxes)
    np.testing.assert_allclose(iou, [[1.0, 1 / 5], [1 / 5, 1.0]], rtol=1e-6)
    empty = np.zeros((1, 4), np.float32)
    assert pairwise_iou(np, empty, empty)[0, 0] == 0.0  # zero-area boxes: no division by 0


def test_greedy_keep_strict_and_inclusive_thresholds() -> None:
    boxes = np.array([[0, 0, 1, 1], [0, 0, 0.5, 1], [0, 0, 1, 1]], np.float64)
    assert greedy_keep(boxes, None, 0.5, inclusive=False).tolist() == [True, True, False]
    assert greedy_keep(boxes, None, 0.5, inclusive=True).tolist() == [True, False, False]
    classes = np.array([0.0, 1.0, 1.0])
    assert greedy_keep(boxes, classes, 0.5, inclusive=True).tolist() == [True, True, False]


def test_box_nms_keeps_its_shape_when_nothing_is_valid() -> None:
    data = records(3, [0.1, 0.2, 0.05])
    (out,) = run("_contrib_box_nms", {"valid_thresh": "0.5"}, data)
    assert out.shape == data.shape and (out == -1).all()
    (out,) = run("_contrib_box_nms", {}, data)
    np.testing.assert_array_equal(out[0, 0], data[0, 1])  # best kept, identical boxes dropped
    assert (out[0, 1:] == -1).all()


def test_box_nms_shapes_and_bad_records() -> None:
    assert infer("_contrib_box_nms", {}, [(0, 0, 6)]) == ([(0, 0, 6)], [(0, 0, 6)])
    assert infer("_contrib_box_nms", {}, [None]) == ([None], [None])
    op = get_op("_contrib_box_nms")
    assert op.num_total_outputs(op.parse_attrs({})) == 2  # MXNet's hidden index output
    with pytest.raises(ShapeError, match=r"records of at least 7 values for coord_start=3"):
        infer("_contrib_box_nms", {"coord_start": "3"}, [(2, 5, 6)])


def test_box_iou_and_decode_shapes() -> None:
    assert infer("_contrib_box_iou", {}, [(2, 0, 4), (5, 4)])[1] == [(2, 0, 5)]
    with pytest.raises(ShapeError, match=r"box_iou rhs must end in an axis of 4"):
        infer("_contrib_box_iou", {}, [(2, 4), (5, 3)])
    assert infer("_contrib_box_decode", {}, [(0, 6, 4), (1, 6, 4)])[1] == [(0, 6, 4)]


def test_roi_align_empty_rois_negative_batch_and_bad_index() -> None:
    data = RNG.normal(size=(2, 4, 6, 6)).astype(np.float32)
    attrs = {"pooled_size": "(2, 3)", "spatial_scale": "1.0"}
    (out,) = run("_contrib_ROIAlign", attrs, data, np.zeros((0, 5), np.float32))
    assert out.shape == (0, 4, 2, 3)
    rois = np.array([[-1, 0, 0, 4, 4], [1, 0, 0, 4, 4]], np.float32)
    (out,) = run("_contrib_ROIAlign", attrs, data, rois)
    assert (out[0] == 0).all() and np.abs(out[1]).sum() > 0
    with pytest.raises(InputError, match=r"ROI batch index 2 is out of range for a batch of 2"):
        run("ROIPooling", attrs, data, np.array([[2, 0, 0, 4, 4]], np.float32))


def test_roi_align_constant_map_averages_to_the_constant() -> None:
    data = np.full((1, 1, 8, 8), 3.0, np.float32)
    rois = np.array([[0, 1.2, 0.7, 5.9, 6.3]], np.float32)
    for extra in ({}, {"aligned": "True"}, {"sample_ratio": "3"}):
        (out,) = run("_contrib_ROIAlign", {"pooled_size": "3", "spatial_scale": "1",
                                           **extra}, data, rois)
        np.testing.assert_allclose(out, 3.0, rtol=1e-6)


def test_roi_shapes_and_errors() -> None:
    attrs = {"pooled_size": "(2, 2)", "spatial_scale": "0.5"}
    assert infer("ROIPooling", attrs, [(0, 3, 0, 0), (0, 5)])[1] == [(0, 3, 2, 2)]
    with pytest.raises(ShapeError, match=r"rois must be \(R, 5\)"):
        infer("_contrib_ROIAlign", attrs, [(1, 3, 8, 8), (4, 4)])
    with pytest.raises(ShapeError, match=r"channels divisible by 2 \* 2; got 6"):
        infer("_contrib_ROIAlign", {**attrs, "position_sensitive": "True"},
              [(1, 6, 8, 8), (4, 5)])


def test_multibox_shapes_and_errors() -> None:
    assert infer("_contrib_MultiBoxPrior", {"sizes": "(0.2, 0.4)", "ratios": "(1, 2, 3)"},
                 [(1, 8, 5, 6)])[1] == [(1, 5 * 6 * 4, 4)]
    shapes = [(2, 4, 10), (2, 40), (1, 10, 4)]
    assert infer("_contrib_MultiBoxDetection", {}, shapes)[1] == [(2, 10, 6)]
    with pytest.raises(ShapeError, match=r"loc_pred has shape \(2, 36\); expected \(2, 40\)"):
        infer("_contrib_MultiBoxDetection", {}, [(2, 4, 10), (2, 36), (1, 10, 4)])


def test_multibox_detection_all_below_threshold_is_all_minus_one() -> None:
    probs = np.full((1, 3, 4), 1 / 3, np.float32)
    anchors = np.tile(np.array([0, 0, 0.5, 0.5], np.float32), (1, 4, 1))
    (out,) = run("_contrib_MultiBoxDetection", {"threshold": "0.5"}, probs,
                 np.zeros((1, 16), np.float32), anchors)
    assert out.shape == (1, 4, 6) and (out == -1).all()
