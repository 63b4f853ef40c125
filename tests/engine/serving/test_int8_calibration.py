"""An int8 model at load (`engine.serving.calibration`): calibrated on the version's
calibration.npz or on random sample rows, checked against float32 like bf16, the record in
its checks, and refused past the thresholds or on a calibration file that does not fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.serving.config import CALIBRATION_NAME, parse_config
from engine.serving.errors import InvalidModel
from engine.serving.validate import Validated, checks_of, default_loader, load_and_validate
from tests.conformance.fixtures import model_files

# int8's semantics, on any host (where our kernels are missing, on the NumPy path).
pytestmark = pytest.mark.usefixtures("int8_kernels_counted")

CLASSIFIER = ('{"precision": "int8", "outputs": [{"name": "lenet_dense2_fwd_output", '
              '"postprocess": "softmax"}]%s}')


def validate(version_dir: Path, extra: str = "") -> Validated:
    symbol, params = model_files("lenet")
    return load_and_validate(
        version_dir, parse_config(CLASSIFIER % extra, "config.json"), device="cpu",
        where="upload of lenet",
        loader=lambda _s, _p, **options: default_loader(symbol, params, **options))


def precision_record(validated: Validated) -> dict[str, Any]:
    checks = checks_of(validated.model)
    assert checks is not None
    return checks.as_dict()["precision"]


def test_without_a_calibration_file_random_sample_rows_calibrate(tmp_path: Path) -> None:
    validated = validate(tmp_path, ', "calibration": {"samples": 8, "num_bins": 1001}')
    assert validated.model.precision == "int8"
    assert any(node.op == "_sg_mkldnn_conv" for node in validated.model.run_graph.nodes)
    record = precision_record(validated)
    assert record["calibration"] == {"source": "random sample inputs", "rows": 8,
                                     "mode": "naive", "num_bins": 1001}
    assert record["ran"] is True and record["inputs"] == "random rows"
    output = record["outputs"]["lenet_dense2_fwd_output"]
    assert output["judged_by"] == "top1_agreement" and output["top1_agreement"] >= 0.99
    assert 0 < output["relative_error"] < 0.05


def test_an_uploaded_calibration_file_calibrates_and_checks(tmp_path: Path) -> None:
    images = np.random.default_rng(1).uniform(0, 1, (24, 1, 28, 28)).astype(np.float32)
    np.savez(tmp_path / CALIBRATION_NAME, data=images)
    record = precision_record(validate(tmp_path, ', "calibration": {"mode": "entropy", '
                                                 '"num_bins": 1001}'))
    assert record["calibration"] == {"source": CALIBRATION_NAME, "rows": 24,
                                     "mode": "entropy", "num_bins": 1001}
    assert record["inputs"] == "the uploaded calibration inputs" and record["samples"] == 16
    output = record["outputs"]["lenet_dense2_fwd_output"]
    assert output["top1_agreement"] >= 0.9 and output["relative_error"] < 0.2


@pytest.mark.parametrize(("arrays", "message"), [
    ({"image": np.zeros((4, 1, 28, 28), np.float32)}, r"unknown \['image'\], missing \['data'\]"),
    ({"data": np.zeros((4, 3, 28, 28), np.float32)}, r"array 'data' has shape \[4, 3, 28, 28\]"),
    ({"data": np.zeros((4, 1, 28, 28), np.int32)}, "array 'data' is int32; input 'data' takes"),
    ({"data": np.array([{"a": 1}] * 4, dtype=object)}, "not a readable .npz of plain arrays"),
])
def test_a_calibration_file_that_does_not_fit_is_refused(tmp_path: Path, arrays: dict,
                                                         message: str) -> None:
    np.savez(tmp_path / CALIBRATION_NAME, **arrays)
    with pytest.raises(InvalidModel, match=message):
        validate(tmp_path)


def test_a_model_past_the_threshold_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidModel, match=r"in int8 differs from float32 by .*"
                                           r"max_relative_error is 1e-06"):
        validate(tmp_path, ', "outputs": [], "precision_check": {"max_relative_error": 1e-6}, '
                           '"calibration": {"num_bins": 1001}')


def test_the_calibration_settings_are_checked() -> None:
    with pytest.raises(InvalidModel, match="num_bins must be odd"):
        parse_config('{"calibration": {"num_bins": 1000}}', "config.json")
    with pytest.raises(InvalidModel, match="mode"):
        parse_config('{"calibration": {"mode": "kl"}}', "config.json")


@pytest.mark.parametrize("narrow", [True, False])
def test_the_record_says_how_the_weights_were_quantized(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        narrow: bool) -> None:
    """Where the host's int8 GEMM takes weights within ±63 (AVX2 without VNNI), the record
    says so and in how many convolutions (LeNet's two), and the check measures that model."""
    from engine.quantize import rewrite

    monkeypatch.setattr(rewrite, "narrow_weights_here", lambda: narrow)
    validated = validate(tmp_path, ', "calibration": {"samples": 8, "num_bins": 1001}')
    record = precision_record(validated)
    if narrow:
        assert record["weights"].startswith("within ±63 in 2 convolution(s)")
    else:
        assert record["weights"] == "full-range int8 (±127)"
    assert rewrite.narrowed_layers(validated.model.run_graph) == (2 if narrow else 0)
    output = record["outputs"]["lenet_dense2_fwd_output"]
    assert output["top1_agreement"] >= 0.99 and output["relative_error"] < 0.05
