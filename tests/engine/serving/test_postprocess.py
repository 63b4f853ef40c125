"""Each postprocess against NumPy written here, on random outputs."""

from __future__ import annotations

import numpy as np
import pytest

from engine.serving.postprocess import (
    class_map,
    class_map_to_original,
    detection_rows,
    l2_normalise,
    padded,
    padded_maps,
    softmax,
    top_k,
)
from engine.serving.postprocess_config import Detection
from engine.serving.preprocess import Geometry, preprocess_image
from engine.serving.preprocess_config import ImagePreprocess
from tests.service.image_model import encode

RNG = np.random.default_rng(11)


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax_matches_exp_over_sum(axis: int) -> None:
    logits = RNG.normal(scale=4, size=(3, 5, 7)).astype(np.float32)
    expected = np.exp(logits.astype(np.float64))
    expected /= expected.sum(axis=axis, keepdims=True)
    result = softmax(logits, axis)
    assert result.dtype == np.float32 and result.shape == logits.shape
    np.testing.assert_allclose(result, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(result.sum(axis=axis), 1.0, rtol=1e-6)


def test_softmax_of_huge_logits_does_not_overflow() -> None:
    result = softmax(np.array([[1000.0, 999.0, -1000.0]], np.float32))
    expected = np.array([1.0, np.exp(-1.0), 0.0]) / (1.0 + np.exp(-1.0))
    np.testing.assert_allclose(result[0], expected, rtol=1e-6, atol=1e-12)


def test_top_k_gives_the_highest_values_highest_first_ties_by_index() -> None:
    scores = RNG.normal(size=(4, 10)).astype(np.float32)
    scores[2, [1, 6]] = 9.0  # a tie at the top: index 1 first
    values, indices = top_k(scores, 3)
    for row in range(4):
        expected = sorted(range(10), key=lambda index: (-scores[row, index], index))[:3]
        assert indices[row].tolist() == expected
        np.testing.assert_array_equal(values[row], scores[row, expected])
    assert indices.dtype == np.int32 and indices[2, :2].tolist() == [1, 6]


def test_top_k_flattens_rows_and_stops_at_their_size() -> None:
    scores = RNG.normal(size=(2, 2, 3)).astype(np.float32)
    values, indices = top_k(scores, 50)
    assert values.shape == indices.shape == (2, 6)
    flat = scores.reshape(2, 6)
    np.testing.assert_array_equal(values, -np.sort(-flat, axis=1))
    np.testing.assert_array_equal(np.take_along_axis(flat, indices, axis=1), values)


def test_class_map_is_the_argmax_over_channels() -> None:
    scores = RNG.normal(size=(2, 4, 5, 6)).astype(np.float32)
    result = class_map(scores)
    assert result.shape == (2, 5, 6) and result.dtype == np.int32
    for n in range(2):
        for y in range(5):
            for x in range(6):
                assert result[n, y, x] == max(range(4), key=lambda c: scores[n, c, y, x])


def test_l2_normalise_gives_unit_rows_and_leaves_zero_rows() -> None:
    rows = RNG.normal(size=(3, 2, 8)).astype(np.float32)
    rows[1] = 0.0
    result = l2_normalise(rows)
    flat = rows.reshape(3, -1).astype(np.float64)
    norms = np.sqrt((flat ** 2).sum(axis=1))
    np.testing.assert_allclose(result[0], rows[0] / norms[0], rtol=1e-6)
    np.testing.assert_allclose(result[2], rows[2] / norms[2], rtol=1e-6)
    np.testing.assert_array_equal(result[1], 0.0)
    np.testing.assert_allclose(np.linalg.norm(result[[0, 2]].reshape(2, -1), axis=1), 1.0,
                               rtol=1e-6)


def _gluoncv_outputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two images, 5 rows each as GluonCV gives them: ids and scores [N, R, 1], -1 padding."""
    ids = np.array([[2, 0, 1, -1, -1], [1, 1, -1, -1, -1]], np.float32)[..., None]
    scores = np.array([[0.9, 0.3, 0.7, -1, -1], [0.4, 0.8, -1, -1, -1]], np.float32)[..., None]
    boxes = RNG.uniform(0, 64, size=(2, 5, 4)).astype(np.float32)
    return ids, scores, boxes


def test_detection_rows_keep_detections_over_the_threshold_best_first() -> None:
    ids, scores, boxes = _gluoncv_outputs()
    rows = detection_rows(ids, scores, boxes, Detection(score_threshold=0.5), [None, None])
    assert rows[0].class_ids.tolist() == [2, 1] and rows[1].class_ids.tolist() == [1]
    np.testing.assert_allclose(rows[0].scores, [0.9, 0.7])
    np.testing.assert_allclose(rows[1].scores, [0.8])
    np.testing.assert_array_equal(rows[0].boxes, boxes[0, [0, 2]])  # no geometry: as given
    np.testing.assert_array_equal(rows[1].boxes, boxes[1, [1]])
    capped = detection_rows(ids, scores, boxes, Detection(score_threshold=0.0,
                                                          max_detections=2), [])
    assert capped[0].class_ids.tolist() == [2, 1] and capped[1].class_ids.tolist() == [1, 1]


def test_detection_boxes_go_back_through_a_letterbox_and_are_clipped() -> None:
    # A 200x100 (width x height) image letterboxed into 64x64: scale 0.32, 16 rows of padding
    # above (the image is 32 high there).
    geometry = Geometry((100, 200), (0.32, 0.32), (16.0, 0.0))
    ids = np.array([[[0.0], [1.0]]], np.float32)
    scores = np.array([[[0.9], [0.8]]], np.float32)
    boxes = np.array([[[8.0, 20.0, 40.0, 44.0], [-5.0, 10.0, 70.0, 60.0]]], np.float32)
    rows = detection_rows(ids, scores, boxes, Detection(), [geometry])
    x_scale = y_scale = 0.32
    expected = np.array([[8 / x_scale, (20 - 16) / y_scale, 40 / x_scale, (44 - 16) / y_scale],
                         [0.0, 0.0, 200.0, 100.0]])  # the second box clipped to the image
    np.testing.assert_allclose(rows[0].boxes, expected, rtol=1e-5)
    kept = detection_rows(ids, scores, boxes, Detection(coordinates="input"), [geometry])
    np.testing.assert_array_equal(kept[0].boxes, boxes[0])


def test_padded_fills_missing_rows_with_minus_one() -> None:
    ids, scores, boxes = _gluoncv_outputs()
    rows = detection_rows(ids, scores, boxes, Detection(score_threshold=0.5), [None, None])
    class_ids, kept_scores, kept_boxes = padded(rows)
    assert class_ids.tolist() == [[2, 1], [1, -1]]
    np.testing.assert_allclose(kept_scores, [[0.9, 0.7], [0.8, -1.0]])
    assert kept_boxes.shape == (2, 2, 4) and (kept_boxes[1, 1] == -1).all()
    empty = padded(detection_rows(ids, scores, boxes, Detection(score_threshold=0.99),
                                  [None, None]))
    assert [array.shape for array in empty] == [(2, 0), (2, 0), (2, 0, 4)]


def test_a_class_map_resized_exactly_takes_the_class_under_each_pixel_s_centre() -> None:
    classes = np.arange(24, dtype=np.int32).reshape(4, 6)
    # A 2x3 original resized to the 4x6 input: original pixel (y, x) covers input pixels
    # 2y..2y+1, 2x..2x+1; its centre falls in input (and output) pixel (2y + 1, 2x + 1).
    resized = class_map_to_original(classes, Geometry((2, 3), (2.0, 2.0)), (4, 6))
    assert resized.tolist() == [[7, 9, 11], [19, 21, 23]]
    # An output at half the input's resolution (4x6 input, 2x3 output) covers it evenly.
    coarse = class_map_to_original(classes[:2, :3], Geometry((4, 6)), (4, 6))
    assert coarse.tolist() == [[0, 0, 1, 1, 2, 2]] * 2 + [[6, 6, 7, 7, 8, 8]] * 2
    assert resized.dtype == np.int32


def test_letterbox_padding_is_skipped_and_cropped_pixels_are_minus_one() -> None:
    classes = np.arange(16, dtype=np.int32).reshape(4, 4)
    # A 2x4 original letterboxed into 4x4: one row of padding above, one below.
    boxed = class_map_to_original(classes, Geometry((2, 4), (1.0, 1.0), (1.0, 0.0)), (4, 4))
    assert boxed.tolist() == [[4, 5, 6, 7], [8, 9, 10, 11]]
    # A 4x8 original centre-cropped to 4x4: two columns cut off on each side.
    cropped = class_map_to_original(classes, Geometry((4, 8), (1.0, 1.0), (0.0, -2.0)), (4, 4))
    assert cropped[:, :2].tolist() == [[-1, -1]] * 4 and (cropped[:, 6:] == -1).all()
    assert cropped[:, 2:6].tolist() == classes.tolist()


def test_a_photo_s_class_map_goes_back_through_its_real_letterbox() -> None:
    # A 90x160 photo, dark left of column 100, bright right of it, letterboxed to 64x64; the
    # "model" classes each pixel of its input by brightness at a quarter of the resolution.
    pixels = np.zeros((90, 160, 3), np.uint8)
    pixels[:, 100:] = 255
    options = ImagePreprocess(resize={"letterbox": [64, 64], "pad_value": 128})
    row, geometry = preprocess_image(encode(pixels, "PNG"), options)
    grey = row.mean(axis=0).reshape(16, 4, 16, 4).mean(axis=(1, 3))
    # 0 dark, 1 bright, 3 padding only (128), 2 mixed (the letterbox's and the step's edges).
    classes = np.select([grey < 32, grey > 224, grey == 128], [0, 1, 3], 2).astype(np.int32)
    resized = class_map_to_original(classes, geometry, (64, 64))
    assert resized.shape == (90, 160)
    # Rows 5 to 84 land in input rows 16 to 47, wholly image: away from the step (one output
    # pixel is 4 input pixels, 10 original ones) each pixel has its own class.
    assert (resized[5:85, :90] == 0).all() and (resized[5:85, 110:] == 1).all()
    assert (resized[:5] == 2).all() and (resized[85:] == 2).all()
    assert 3 not in resized  # the padding is never read


def test_padded_maps_pads_smaller_maps_with_minus_one() -> None:
    batch = padded_maps([np.zeros((2, 3), np.int32), np.ones((3, 1), np.int32)])
    assert batch.shape == (2, 3, 3)
    assert batch[0].tolist() == [[0, 0, 0], [0, 0, 0], [-1, -1, -1]]
    assert batch[1].tolist() == [[1, -1, -1]] * 3
