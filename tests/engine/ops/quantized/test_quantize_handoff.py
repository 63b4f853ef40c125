"""A calibrated quantize whose readers all take the channels-last hand-off (the graph input's,
read by the stem) writes its bytes channels-last for them (`convert`), and the logits stay the
NumPy path's, bit for bit; a reader bound to the plain kernel keeps it NCHW."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from bench import nets
from engine import sym
from engine.kernels import int8_conv
from engine.ops.quantized import fused, integer
from tests.engine.ops.quantized.int8_models import numpy_path
from tests.engine.quantize.test_int8_model import residual_net

pytestmark = pytest.mark.skipif(not int8_conv.supported_here(),
                                reason="needs AVX-512 VNNI, numba and the spin pool")

RNG = np.random.default_rng(61)


def load() -> engine.Model:
    symbol, params = residual_net()
    calibration = RNG.standard_normal((16, 3, 16, 16)).astype(np.float32)
    return engine.load_model(symbol, params, precision="int8",
                             calibration={"data": calibration})


def exact_logits(model: engine.Model, images: dict[str, np.ndarray]) -> np.ndarray:
    with numpy_path():  # the convolutions on NumPy: they read NCHW back
        return model.infer(images)["fc2_output"]


def test_the_inputs_quantize_hands_the_stem_its_bytes_channels_last():
    model = load()
    images = {"data": RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)}
    before = integer.PATHS["int8_quantize_channels_last"]
    got = model.infer(images)["fc2_output"]
    assert integer.PATHS["int8_quantize_channels_last"] - before == 1
    np.testing.assert_array_equal(got, exact_logits(model, images))


def test_a_reader_on_the_plain_kernel_keeps_the_quantize_nchw(monkeypatch):
    fused_conv = fused._FusedInt8Conv
    monkeypatch.setattr(fused, "_FusedInt8Conv", lambda attrs, weights, *rest: (
        None if weights.weight.shape[1] == 3 else fused_conv(attrs, weights, *rest)))
    model = load()  # its stem (3 input channels) bound as the plain kernel
    images = {"data": RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    before = integer.PATHS["int8_quantize_channels_last"]
    got = model.infer(images)["fc2_output"]
    assert integer.PATHS["int8_quantize_channels_last"] == before
    np.testing.assert_array_equal(got, exact_logits(model, images))


def test_a_quantize_of_many_channels_stays_nchw():
    """A float activation's 16 channels read by a convolution: its quantize writes NCHW (the
    convolution's own copy of 8 channels a word is the cheaper transpose); the input's
    3 channels still hand off."""
    data = sym.var("data")
    net = sym.Activation(sym.Convolution(data, num_filter=16, kernel=(3, 3), pad=(1, 1),
                                         name="c1"), act_type="sigmoid", name="squash")
    net = sym.Convolution(net, num_filter=16, kernel=(3, 3), pad=(1, 1), name="c2")
    net = sym.FullyConnected(net, num_hidden=4, name="fc")
    params = nets.random_params(net, (1, 3, 12, 12), seed=7)
    model = engine.load_model(net, params, precision="int8", calibration={
        "data": RNG.standard_normal((8, 3, 12, 12)).astype(np.float32)})
    assert "squash_quantize" in {node.name for node in model.run_graph.nodes}
    images = {"data": RNG.standard_normal((2, 3, 12, 12)).astype(np.float32)}
    before = integer.PATHS["int8_quantize_channels_last"]
    model.infer(images)
    assert integer.PATHS["int8_quantize_channels_last"] - before == 1
