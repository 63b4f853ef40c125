"""Cases for the RPN proposal ops of MXNet's own Faster R-CNN: ``_contrib_Proposal`` and
``_contrib_MultiProposal`` (anchors, box deltas, clipping, min-size filter, NMS, padding)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from casefile import Case
from cases_detection import distinct_scores

Rng = Callable[[str], np.random.Generator]
ANCHORS = {"scales": "(2, 4)", "ratios": "(0.5, 1, 2)", "feature_stride": "8"}  # 6 anchors


def rpn_inputs(rng: np.random.Generator, batch: int, im_info: list[list[float]]
               ) -> dict[str, np.ndarray]:
    """Foreground/background scores (distinct), small box deltas and image sizes, 5x5 maps."""
    scores = distinct_scores(rng, batch, 12, 5, 5)
    deltas = rng.normal(0, 0.2, (batch, 24, 5, 5)).astype(np.float32)
    return {"cls_prob": scores, "bbox_pred": deltas,
            "im_info": np.array(im_info, np.float32)}


def proposal_cases(rng_for: Rng) -> list[Case]:
    """Every attribute of the two ops on 40x40 images (one case crops the image to 30x36)."""
    full = rpn_inputs(rng_for("proposal"), 1, [[40, 40, 1.0]])
    cropped = rpn_inputs(rng_for("proposal_cropped"), 1, [[30, 36, 1.5]])
    batch = rpn_inputs(rng_for("multi_proposal"), 2, [[40, 40, 1.0], [33, 40, 0.8]])
    top = {"rpn_pre_nms_top_n": "60", "rpn_post_nms_top_n": "10", "rpn_min_size": "4"}
    return [
        Case("proposal_scores", "_contrib_Proposal", full,
             {**ANCHORS, **top, "threshold": "0.7", "output_score": "True"}),
        Case("proposal_rois_only", "_contrib_Proposal", full,
             {**ANCHORS, **top, "threshold": "0.5"}),
        Case("proposal_cropped_image", "_contrib_Proposal", cropped,
             {**ANCHORS, **top, "threshold": "0.6", "output_score": "True"}),
        Case("proposal_min_size", "_contrib_Proposal", full,
             {**ANCHORS, "rpn_pre_nms_top_n": "150", "rpn_post_nms_top_n": "6",
              "rpn_min_size": "20", "threshold": "0.7", "output_score": "True"}),
        Case("proposal_iou_loss", "_contrib_Proposal", full,
             {**ANCHORS, **top, "threshold": "0.7", "iou_loss": "True",
              "output_score": "True"}),
        Case("multi_proposal", "_contrib_MultiProposal", batch,
             {**ANCHORS, **top, "threshold": "0.7", "output_score": "True"}),
        Case("multi_proposal_rois_only", "_contrib_MultiProposal", batch,
             {**ANCHORS, "rpn_pre_nms_top_n": "40", "rpn_post_nms_top_n": "8",
              "rpn_min_size": "2", "threshold": "0.6"}),
    ]
