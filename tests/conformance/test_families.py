"""The model families MXNet users serve, each reproducing MXNet 1.9.1 through load_model.

`test_models.py` compares every output of every conformance model position by position, with
and without optimisation. Here: each family's fixture really has its architecture's
signature; detections after NMS match as sets of rows (MXNet's order of tied rows is not
stable); what a detector feeds its NMS or top-k matches position by position.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import engine
from tests.conformance.families import (
    DETECTORS,
    FAMILIES,
    assert_same_rows,
    detection_rows,
)
from tests.conformance.fixtures import (
    model_dir,
    model_files,
    model_io_sets,
    model_meta,
    model_names,
)

# (op, attributes it must carry) that make each fixture the architecture it is named after
SIGNATURES = {
    "gluoncv_resnet_v1b_tiny": [("Convolution", {"stride": "(2, 2)"})],
    "gluoncv_resnet_v1d_tiny": [("Pooling", {"pool_type": "avg", "count_include_pad": "False"})],
    "gluoncv_se_resnext_tiny": [("Convolution", {"num_group": "4"}),
                                ("Activation", {"act_type": "sigmoid"})],
    "gluoncv_resnest_tiny": [("softmax", {}), ("Convolution", {"num_group": "2"})],
    "gluoncv_mobilenet_v3_tiny": [("Convolution", {"kernel": "(5, 5)"}),
                                  ("clip", {"a_min": "0", "a_max": "6"})],  # hard swish
    "gluoncv_ssd_tiny": [("_contrib_box_nms", {}), ("_contrib_box_decode", {})],
    "gluoncv_yolo3_tiny": [("_contrib_box_nms", {}), ("repeat", {"repeats": "2"}),
                           ("LeakyReLU", {"act_type": "leaky"})],
    "gluoncv_faster_rcnn_tiny": [("_contrib_ROIAlign", {}), ("_contrib_box_nms", {})],
    "mxnet_rcnn_tiny": [("_contrib_MultiProposal", {"feature_stride": "8"}), ("ROIPooling", {})],
    "gluoncv_center_net_tiny": [("topk", {}), ("Pooling", {"pool_type": "max"})],
    "gluoncv_fcn_tiny": [("_contrib_BilinearResize2D", {})],
    "gluoncv_deeplabv3_tiny": [("Convolution", {"dilate": "(6, 6)"}),
                               ("_contrib_BilinearResize2D", {})],
    "gluoncv_fast_scnn_tiny": [("_contrib_BilinearResize2D", {}),
                               ("Convolution", {"num_group": "32"})],
    "gluoncv_simple_pose_tiny": [("Deconvolution", {})],
    "gluonnlp_bert_tiny": [("SequenceMask", {"use_sequence_length": "True"})],
    "gluonnlp_transformer_tiny": [("SequenceMask", {"use_sequence_length": "True"}),
                                  ("broadcast_lesser", {})],
    "gluonnlp_lstm_lm_tiny": [("RNN", {"mode": "lstm", "num_layers": "2"})],
    "gluonnlp_gru_lm_tiny": [("RNN", {"mode": "gru"})],
    "arcface_tiny": [("LeakyReLU", {"act_type": "prelu"}), ("BatchNorm", {"fix_gamma": "True"}),
                     ("L2Normalization", {})],
}
FAMILY_MODELS = [name for names in FAMILIES.values() for name in names]
# Raw heads hold box corners in pixels (up to 64): float32 rounding in the decoders reaches
# about 1e-5 absolute, which a corner near 0 cannot absorb relatively.
RAW_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
OPTIMIZE = pytest.mark.parametrize("optimize", [False, True], ids=["reference", "optimized"])


def test_every_family_has_its_fixtures() -> None:
    assert set(FAMILY_MODELS) <= set(model_names(fixed_batch=True))
    assert "gluoncv_faster_rcnn_tiny" not in model_names()  # its graph fixes the batch at 1
    assert set(SIGNATURES) == set(FAMILY_MODELS)


def _nodes(name: str) -> list[dict]:
    symbol_file, _ = model_files(name)
    return json.loads(symbol_file.read_text())["nodes"]


@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_fixture_has_its_architectures_signature(name: str) -> None:
    nodes = _nodes(name)
    for op, attrs in SIGNATURES[name]:
        assert any(node["op"] == op and attrs.items() <= node.get("attrs", {}).items()
                   for node in nodes), f"{name}: no {op} node with {attrs}"


def test_bert_and_transformer_take_valid_lengths() -> None:
    assert len(model_meta("gluonnlp_bert_tiny")["inputs"]) == 3  # tokens, types, valid length
    assert [len(spec["shape"]) for spec in model_meta("gluonnlp_transformer_tiny")["inputs"]] == [
        2, 1, 2, 1]  # source, source lengths, target, target lengths


def test_row_sets_ignore_order_but_not_values() -> None:
    rows = np.array([[[0, 0.9, 1, 2, 3, 4], [1, 0.9, 5, 6, 7, 8], [-1, -1, -1, -1, -1, -1]]])
    tolerance = {"rtol": 1e-4, "atol": 1e-5}
    assert_same_rows(rows[:, ::-1], rows, tolerance, "reversed")
    moved = rows.copy()
    moved[0, 1, 3] += 0.01
    with pytest.raises(AssertionError, match="has no match"):
        assert_same_rows(moved, rows, tolerance, "moved")


@OPTIMIZE
@pytest.mark.parametrize("name", DETECTORS)
def test_detections_after_nms_match_as_sets_of_rows(name: str, optimize: bool) -> None:
    model = engine.load_model(*model_files(name), optimize=optimize)
    tolerance = model_meta(name)["tolerance"]
    for number, (inputs, expected) in enumerate(model_io_sets(name)):
        actual = list(model.infer(inputs).values())
        assert_same_rows(detection_rows(actual), detection_rows(expected), tolerance,
                         f"{name} io set {number}")
        assert (detection_rows(expected)[..., 0] >= 0).any(), f"{name}: MXNet detected nothing"


@OPTIMIZE
@pytest.mark.parametrize("name", DETECTORS)
def test_raw_heads_before_nms_match_position_by_position(name: str, optimize: bool) -> None:
    meta = model_meta(name)
    symbol_file, params_file = model_files(name)
    symbol = json.loads(symbol_file.read_text())
    index = {node["name"]: number for number, node in enumerate(symbol["nodes"])}
    symbol["heads"] = [[index[raw["node"]], raw["index"], 0] for raw in meta["raw_outputs"]]
    model = engine.load_model(json.dumps(symbol), params_file, optimize=optimize)
    inputs, _ = model_io_sets(name)[0]
    with np.load(model_dir(name) / "io.npz") as data:
        expected = [data[raw["key"]] for raw in meta["raw_outputs"]]
    actual = list(model.infer(inputs).values())
    assert len(actual) == len(expected)
    for raw, got, want in zip(meta["raw_outputs"], actual, expected):
        np.testing.assert_allclose(got, want, err_msg=raw["node"], **RAW_TOLERANCE)
