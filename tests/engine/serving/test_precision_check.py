"""A bf16 model's load-time check against float32 (`engine.serving.precision_check`): recorded in
the checks, refused past the config's thresholds, skipped (and said so) where bf16, or int8,
cannot run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.cpu import host_features
from engine.kernels import gemm_kernel, int8_conv
from engine.serving.config import ModelConfig, PrecisionCheck, TensorConfig, parse_config
from engine.serving.errors import InvalidModel
from engine.serving.precision_check import check_precision, compare
from engine.serving.validate import Validated, checks_of, default_loader, load_and_validate
from tests.conformance.fixtures import model_files

needs_bf16 = pytest.mark.skipif(not gemm_kernel.available(gemm_kernel.BF16),
                                reason="this CPU lacks AVX-512 BF16")


def validate(name: str, config: ModelConfig) -> Validated:
    symbol, params = model_files(name)
    return load_and_validate(
        Path("unused"), config, device="cpu", where=f"upload of {name}",
        loader=lambda _s, _p, **options: default_loader(symbol, params, **options))


def precision_record(validated: Validated) -> dict[str, Any] | None:
    checks = checks_of(validated.model)
    assert checks is not None
    return checks.as_dict().get("precision")


def test_config_reads_the_precision_and_its_thresholds() -> None:
    config = parse_config('{"precision": "bf16", "precision_check": '
                          '{"min_top1_agreement": 0.95, "samples": 8}}', "config.json")
    assert config.precision == "bf16"
    assert config.precision_check == PrecisionCheck(min_top1_agreement=0.95, samples=8)
    assert ModelConfig().precision == "fp32"
    with pytest.raises(InvalidModel, match="precision"):
        parse_config('{"precision": "bf17"}', "config.json")
    with pytest.raises(InvalidModel, match="min_top1_agreement"):
        parse_config('{"precision_check": {"min_top1_agreement": 1.5}}', "config.json")


def test_an_fp32_model_has_no_precision_check() -> None:
    assert precision_record(validate("seed_mlp", ModelConfig())) is None


@needs_bf16
def test_a_bf16_classifier_is_checked_by_top1_agreement() -> None:
    config = parse_config('{"precision": "bf16", "outputs": [{"name": "lenet_dense2_fwd_output",'
                          ' "postprocess": "softmax"}]}', "config.json")
    validated = validate("lenet", config)
    assert validated.model.precision == "bf16"
    record = precision_record(validated)
    assert record is not None and record["ran"] is True
    assert record["asked"] == record["running"] == "bf16" and record["samples"] == 16
    output = record["outputs"]["lenet_dense2_fwd_output"]
    assert output["judged_by"] == "top1_agreement" and output["top1_agreement"] >= 0.99
    assert 0 < output["relative_error"] < 0.05


@needs_bf16
def test_an_unbatched_model_is_checked_on_its_sample() -> None:
    record = precision_record(validate("lenet", ModelConfig(precision="bf16", max_batch_size=0)))
    assert record is not None and record["ran"] is True and record["samples"] == 1
    (output,) = record["outputs"].values()
    assert 0 < output["relative_error"] < 0.05


@needs_bf16
def test_other_outputs_are_judged_by_relative_error() -> None:
    # multi_io's concatenation is 2-D, but no classifier's: its argmax could move while every
    # value stays close, so its relative error judges it.
    record = precision_record(validate("multi_io", ModelConfig(precision="bf16")))
    assert record is not None
    for output in record["outputs"].values():
        assert output["judged_by"] == "relative_error" and output["relative_error"] < 0.05


@needs_bf16
def test_a_model_past_the_relative_threshold_is_refused() -> None:
    # No bf16 product is as close as 1e-9 to float32's: the model must be refused, by name.
    config = ModelConfig(precision="bf16", precision_check=PrecisionCheck(max_relative_error=1e-9))
    with pytest.raises(InvalidModel, match=r"^upload of resblock: output '.*' in bf16 differs "
                                           r"from float32 by .* precision_check."
                                           r"max_relative_error is 1e-09"):
        validate("resblock", config)


class SwappingModel:
    """A bf16 model whose scores swap classes 0 and 1 on every fourth row: 75% agreement."""

    precision = "bf16"

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = len(inputs["data"])
        scores = np.tile(np.array([[1.0, 0.5, 0.0]]), (rows, 1))
        return {"scores": scores}

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        scores = self.reference(inputs)["scores"].copy()
        scores[::4] = scores[::4, [1, 0, 2]]
        return {"scores": scores}


def test_a_classifier_past_the_agreement_threshold_is_refused() -> None:
    inputs = [TensorConfig(name="data", datatype="FP32", shape=(-1, 4))]
    marked = ModelConfig.model_validate({
        "precision": "bf16", "precision_check": {"min_top1_agreement": 0.8, "samples": 8},
        "outputs": [{"name": "scores", "postprocess": "softmax"}]})
    with pytest.raises(InvalidModel, match=r"^upload: output 'scores' in bf16 picks the float32 "
                                           r"top-1 class on 75.0% of 8 random rows; "
                                           r"precision_check.min_top1_agreement is 80.0%"):
        check_precision(SwappingModel(), marked, inputs, {"data": (1, 4)}, "upload")
    # Unmarked, the same output is judged by its relative error (0.5 of 1.0): within 0.6.
    unmarked = marked.model_copy(update={
        "outputs": None, "precision_check": PrecisionCheck(max_relative_error=0.6, samples=8)})
    record = check_precision(SwappingModel(), unmarked, inputs, {"data": (1, 4)}, "upload")
    assert record is not None
    assert record["outputs"]["scores"] == {"relative_error": 0.5, "top1_agreement": 0.75,
                                           "judged_by": "relative_error"}


def test_a_host_without_bf16_records_that_it_runs_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_features, "bf16_dot_product", lambda: False)
    record = precision_record(validate("lenet", ModelConfig(precision="bf16")))
    assert record == {"asked": "bf16", "running": "fp32", "ran": False,
                      "reason": "this CPU lacks AVX-512 BF16: the model runs in fp32"}


def test_a_host_without_int8_kernels_records_that_it_runs_fp32(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(int8_conv, "supported_here", lambda: False)
    config = parse_config('{"precision": "int8", "calibration": {"samples": 4}}', "config.json")
    validated = validate("lenet", config)
    assert validated.model.precision == "fp32"
    record = precision_record(validated)
    assert record is not None
    reason = record.pop("reason")
    # Nothing calibrated it and nothing was compared: no calibration record, no figures.
    assert record == {"asked": "int8", "running": "fp32", "ran": False}
    assert reason.startswith("our int8 kernels cannot run on this CPU (")
    assert reason.endswith("): the model runs in fp32")


def test_compare_counts_agreeing_rows_and_the_relative_error() -> None:
    reference = np.array([[1.0, 2.0, 0.0], [3.0, 1.0, 0.0], [0.0, 0.0, 4.0], [1, 0, 0]])
    reduced = reference.copy()
    reduced[1] = [1.0, 3.0, 0.0]  # another class, off by 2 of the largest 4
    found = compare(reduced, reference, rows=4)
    assert found == {"relative_error": 0.5, "top1_agreement": 0.75}
    assert "top1_agreement" not in compare(reduced[:, :1], reference[:, :1], rows=4)
