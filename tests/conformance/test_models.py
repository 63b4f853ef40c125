"""Every exported conformance model reproduces MXNet 1.9.1's outputs through load_model."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from tests.conformance.fixtures import (
    PARAMS,
    assert_close,
    model_files,
    model_io_sets,
    model_meta,
    model_names,
)

MODELS = model_names(fixed_batch=True)
RNN_TOLERANCE = {"rtol": 1e-3, "atol": 1e-5}


@pytest.mark.parametrize("optimize", [False, True], ids=["reference", "optimized"])
@pytest.mark.parametrize("name", MODELS)
def test_model_reproduces_mxnet(name: str, optimize: bool) -> None:
    symbol_file, params_file = model_files(name)
    model = engine.load_model(symbol_file, params_file, optimize=optimize)
    meta = model_meta(name)
    assert model.input_names == [spec["name"] for spec in meta["inputs"]]
    tolerance = RNN_TOLERANCE if "RNN" in meta.get("ops", []) else meta["tolerance"]
    for inputs, expected in model_io_sets(name):
        outputs = list(model.infer(inputs).values())
        assert len(outputs) == len(expected)
        for k, (actual, reference) in enumerate(zip(outputs, expected)):
            assert actual.dtype == reference.dtype
            assert_close(actual, reference, tolerance, f"{name} output {k}")


def test_model_from_bytes_and_objects_matches_paths() -> None:
    symbol_file, params_file = model_files("lenet")
    from_paths = engine.load_model(symbol_file, params_file)
    from_bytes = engine.load_model(symbol_file.read_bytes(), params_file.read_bytes())
    from_text = engine.load_model(symbol_file.read_text(), str(params_file))
    inputs, expected = model_io_sets("lenet")[0]
    for model in (from_paths, from_bytes, from_text):
        assert_close(list(model.infer(inputs).values())[0], expected[0], {"rtol": 1e-4,
                                                                          "atol": 1e-5})


def test_float16_cnn_matches_float32_reference() -> None:
    model = engine.load_model(PARAMS / "cnn_fp16-symbol.json", PARAMS / "cnn_fp16-0000.params")
    with np.load(PARAMS / "cnn_fp16_io.npz") as data:
        inputs = {"data": data["data"]}
        reference = data["out0_float32_reference"]
    actual = list(model.infer(inputs).values())[0]
    assert_close(actual, reference, {"rtol": 1e-2, "atol": 1e-2}, "cnn_fp16")
