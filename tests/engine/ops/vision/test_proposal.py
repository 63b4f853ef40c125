"""Region proposal ops beyond the MXNet cases: anchors, padding by repetition, bad shapes."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ShapeError
from engine.ops import get_op
from engine.ops.vision.proposal import anchors
from tests.engine.ops.helpers import infer, run

FASTER_RCNN = {"scales": "(8, 16, 32)", "ratios": "(0.5, 1, 2)", "feature_stride": "16"}


def test_anchors_are_the_classic_faster_rcnn_ones() -> None:
    attrs = get_op("_contrib_Proposal").parse_attrs(FASTER_RCNN)
    expected = [[-84, -40, 99, 55], [-176, -88, 191, 103], [-360, -184, 375, 199],
                [-56, -56, 71, 71], [-120, -120, 135, 135], [-248, -248, 263, 263],
                [-36, -80, 51, 95], [-80, -168, 95, 183], [-168, -344, 183, 359]]
    np.testing.assert_array_equal(anchors(attrs), np.array(expected, np.float32))


def test_fewer_survivors_than_asked_repeat_cyclically() -> None:
    attrs = {"scales": "(1,)", "ratios": "(1,)", "feature_stride": "4", "threshold": "0.1",
             "rpn_min_size": "1", "rpn_post_nms_top_n": "5", "output_score": "True"}
    scores = np.zeros((1, 2, 1, 3), np.float32)
    scores[0, 1] = [[0.9, 0.5, 0.7]]  # three cells 4 px apart: no two boxes overlap
    rois, kept = run("_contrib_Proposal", attrs, scores, np.zeros((1, 4, 1, 3), np.float32),
                     np.array([[4, 12, 1]], np.float32))
    np.testing.assert_allclose(kept[:, 0], [0.9, 0.7, 0.5, 0.9, 0.7], rtol=1e-6)
    np.testing.assert_array_equal(rois[:, 1], [0, 8, 4, 0, 8])
    assert (rois[:, 0] == 0).all()


def test_proposal_takes_one_image_and_anchor_count_must_fit() -> None:
    with pytest.raises(ShapeError, match="one image; got a batch of 2 .*MultiProposal"):
        infer("_contrib_Proposal", FASTER_RCNN, [(2, 18, 4, 4), None, None])
    with pytest.raises(ShapeError, match=r"cls_prob must be \(N, 18, H, W\) for 9 anchors"):
        infer("_contrib_MultiProposal", FASTER_RCNN, [(2, 12, 4, 4), None, None])
    inputs, outputs = infer("_contrib_MultiProposal", {**FASTER_RCNN, "output_score": "True",
                                                       "rpn_post_nms_top_n": "7"},
                            [(3, 18, 4, 5), None, None])
    assert inputs[1:] == [(3, 36, 4, 5), (3, 3)]
    assert outputs == [(21, 5), (21, 1)]
