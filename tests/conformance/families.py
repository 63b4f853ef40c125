"""The model families of issue #19 and how their outputs compare with MXNet's.

Detections after NMS are compared as sets of rows: MXNet's order of tied rows is not stable.
"""

from __future__ import annotations

import numpy as np

FAMILIES = {
    "classification": ("gluoncv_resnet_v1b_tiny", "gluoncv_resnet_v1d_tiny",
                       "gluoncv_se_resnext_tiny", "gluoncv_resnest_tiny",
                       "gluoncv_mobilenet_v3_tiny"),
    "detection": ("gluoncv_ssd_tiny", "gluoncv_yolo3_tiny", "gluoncv_faster_rcnn_tiny",
                  "gluoncv_center_net_tiny"),
    # MXNet's example/rcnn: Proposal and ROIPooling; its ROI rows keep MXNet's order (no ties)
    "detection_rpn": ("mxnet_rcnn_tiny",),
    "segmentation": ("gluoncv_fcn_tiny", "gluoncv_deeplabv3_tiny", "gluoncv_fast_scnn_tiny"),
    "pose": ("gluoncv_simple_pose_tiny",),
    "text": ("gluonnlp_bert_tiny", "gluonnlp_transformer_tiny", "gluonnlp_lstm_lm_tiny",
             "gluonnlp_gru_lm_tiny"),
    "face": ("arcface_tiny",),
}
DETECTORS = FAMILIES["detection"]


def detection_rows(outputs: list[np.ndarray]) -> np.ndarray:
    """(batch, detections, id + score + box) from a detector's ids, scores and boxes."""
    return np.concatenate([np.asarray(out, np.float64).reshape(out.shape[0], out.shape[1], -1)
                           for out in outputs], axis=-1)


def assert_same_rows(actual: np.ndarray, expected: np.ndarray, tolerance: dict[str, float],
                     what: str) -> None:
    """Per image, every expected row matches a distinct actual row within the tolerance."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    for image, (got, want) in enumerate(zip(actual, expected)):
        unmatched = list(got)
        for row in want:
            close = [k for k, candidate in enumerate(unmatched)
                     if np.allclose(candidate, row, rtol=tolerance["rtol"],
                                    atol=tolerance["atol"])]
            assert close, f"{what}: image {image}: MXNet's row {row.tolist()} has no match"
            unmatched.pop(close[0])
