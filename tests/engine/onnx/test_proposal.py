"""MultiProposal's ONNX form against the engine's kernel where ties, repeats and images differ.

The conformance cases (tests/engine/onnx/test_ops.py) hold the export to MXNet on random data;
here the inputs are built so that scores tie, few boxes survive the suppression (the rows then
repeat cyclically) and the images of one batch have different sizes and scales.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")  # an optional dev dependency; installed by `make test`

import engine  # noqa: E402
from engine.onnx import export  # noqa: E402
from tests.conformance.fixtures import DEFAULT_TOLERANCE, assert_close  # noqa: E402
from tests.engine.onnx.helpers import check, one_op_symbol, run  # noqa: E402

ATTRS = {"feature_stride": "8", "scales": "(2, 4)", "ratios": "(0.5, 1, 2)",
         "rpn_pre_nms_top_n": "40", "rpn_post_nms_top_n": "12", "threshold": "0.6",
         "rpn_min_size": "4", "output_score": "True"}
HEIGHT, WIDTH, ANCHORS = 4, 5, 6


def _feed(seed: int) -> dict[str, np.ndarray]:
    """Three images: one the size of a single cell (every box clips to it), one cropped, one
    full; scores on a coarse grid so that many tie."""
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 4, (3, 2 * ANCHORS, HEIGHT, WIDTH)).astype(np.float32) / 4
    deltas = rng.normal(0, 0.3, (3, 4 * ANCHORS, HEIGHT, WIDTH)).astype(np.float32)
    info = np.array([[8, 8, 1], [20, 30, 1.5], [32, 40, 0.5]], np.float32)
    return {"cls_prob": scores, "bbox_pred": deltas, "im_info": info}


@pytest.mark.parametrize("iou_loss", [False, True])
def test_multi_proposal_matches_the_kernel_on_ties_and_repeats(iou_loss: bool, tmp_path) -> None:
    symbol = one_op_symbol("_contrib_MultiProposal", {**ATTRS, "iou_loss": str(iou_loss)},
                           ["cls_prob", "bbox_pred", "im_info"])
    symbol["heads"].append([3, 1, 0])  # the scores too
    symbol["node_row_ptr"][-1] += 1
    model = engine.load_model(symbol, None, optimize=False)
    feed = _feed(3)
    path = export(model, tmp_path / "proposal.onnx",
                  input_shapes={name: value.shape for name, value in feed.items()},
                  dynamic_batch=False)
    check(path)
    rois, scores = model.infer(feed).values()
    first_image = rois[:12]
    # The one-cell image keeps a single box, repeated; the batch index column counts images.
    assert len(np.unique(first_image, axis=0)) < 12
    assert np.array_equal(rois[:, 0], np.repeat(np.arange(3, dtype=np.float32), 12))
    assert len(np.unique(scores)) < len(scores)  # tied scores reached the output
    actual_rois, actual_scores = run(path, feed)
    assert_close(actual_rois, rois, DEFAULT_TOLERANCE, "rois")
    assert_close(actual_scores, scores, DEFAULT_TOLERANCE, "scores")
