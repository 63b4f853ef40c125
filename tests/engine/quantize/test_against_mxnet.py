"""precision int8 against MXNet 1.9.1's own ``quantize_net`` of the same float model (naive
calibration on the same inputs; tools/mxnet_fixtures/generate_ptq.py): the same fused layers
with the same calibrated ranges, and outputs at least as close to float32 as MXNet's."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import engine

# int8's semantics, on any host (where our kernels are missing, on the NumPy path).
pytestmark = pytest.mark.usefixtures("int8_kernels_counted")

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "mxnet_quantized" / "ptq"


@pytest.fixture(scope="module")
def models() -> tuple[engine.Model, list[dict], dict[str, np.ndarray]]:
    io = dict(np.load(FIXTURE / "io.npz"))
    ours = engine.load_model(FIXTURE / "float-symbol.json", FIXTURE / "float-0000.params",
                             precision="int8", calibration={"data": io["calibration"]})
    theirs = json.loads((FIXTURE / "int8-symbol.json").read_text())["nodes"]
    return ours, theirs, io


def test_the_same_layers_are_fused_with_the_same_ranges(models) -> None:  # noqa: ANN001
    ours, theirs, _ = models
    our_ops = Counter(node.op for node in ours.run_graph.nodes)
    their_ops = Counter(node["op"] for node in theirs)
    for op in ("_sg_mkldnn_conv", "_sg_mkldnn_fully_connected"):
        assert our_ops[op] == their_ops[op] > 0, op
    our_convs = [node for node in ours.run_graph.nodes if node.op == "_sg_mkldnn_conv"]
    their_convs = [node["attrs"] for node in theirs if node["op"] == "_sg_mkldnn_conv"]
    # Each layer's calibrated maximum (MXNet orders the layers differently), and the signed
    # layers' minimum (every sum here ends in its relu, uint8 from 0).
    ours_high = sorted(float(node.params.max_calib_range) for node in our_convs)
    theirs_high = sorted(float(attrs["max_calib_range"]) for attrs in their_convs)
    np.testing.assert_allclose(ours_high, theirs_high, rtol=2e-6)
    signed = sorted(float(attrs["min_calib_range"]) for attrs in their_convs
                    if float(attrs["min_calib_range"]) < 0)
    ours_signed = sorted(float(node.params.min_calib_range) for node in our_convs
                         if node.params.min_calib_range < 0)
    np.testing.assert_allclose(ours_signed, signed, rtol=2e-6)
    (entry,) = [node for node in ours.run_graph.nodes if node.name == "data_quantize"]
    (their_entry,) = [node["attrs"] for node in theirs if node["op"] == "_contrib_quantize_v2"]
    assert float(entry.params.min_calib_range) == pytest.approx(
        float(their_entry["min_calib_range"]), rel=2e-6)
    assert float(entry.params.max_calib_range) == pytest.approx(
        float(their_entry["max_calib_range"]), rel=2e-6)


def test_the_outputs_are_as_close_to_float32_as_mxnets(models) -> None:  # noqa: ANN001
    ours, _, io = models
    (got,) = ours.infer({"data": io["data"]}).values()
    want, theirs = io["float_output"], io["int8_output"]
    np.testing.assert_allclose(ours.reference({"data": io["data"]})[ours.output_names[0]],
                               want, rtol=1e-4, atol=1e-4)

    def error(values: np.ndarray) -> float:
        return float(np.abs(values - want).max() / np.abs(want).max())

    def top1(values: np.ndarray) -> float:
        return float(np.mean(values.argmax(axis=1) == want.argmax(axis=1)))

    # Measured: ours 0.22 of the largest logit, MXNet's 0.37 (its signed residuals cap the
    # relu'd sums at half their range).
    assert error(got) < 0.8 * error(theirs)
    assert top1(got) >= top1(theirs)
