"""`bench/serve_precision.py`: what it uploads is a config the server takes as meant."""

from __future__ import annotations

import pytest

from bench import serve_precision
from engine.serving.config import parse_config


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_the_upload_config_parses_with_the_precision_asked(precision: str) -> None:
    config = parse_config(serve_precision.upload_config(precision, 224, 8), "bench config")
    assert config.precision == precision
    assert config.max_batch_size >= 8  # the served batch can reach the in-process batch
    assert list(config.inputs[0].shape) == [-1, 3, 224, 224]
    if precision == "int8":
        assert config.calibration.samples == serve_precision.CALIBRATION_SAMPLES
