"""A plan's fused int8 convolutions hand their output to the quantized convolutions reading it
channels-last (`fused._Handoff`): the logits stay the NumPy path's, bit for bit, whichever
side of a hand-off runs fused."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from bench import nets
from engine import sym
from engine.kernels import gemm_int8, int8_conv
from engine.ops.quantized import integer
from tests.engine.ops.quantized.int8_models import numpy_path
from tests.engine.quantize.test_int8_model import residual_net

pytestmark = pytest.mark.skipif(not int8_conv.supported_here(),
                                reason="needs AVX-512 VNNI, numba and the spin pool")

RNG = np.random.default_rng(41)


@pytest.fixture(scope="module")
def models():
    """The residual net in int8 (calibrated on one set of images), fused and on the NumPy
    path, with a batch of images."""
    symbol, params = residual_net()
    calibration = RNG.standard_normal((16, 3, 16, 16)).astype(np.float32)
    images = RNG.standard_normal((3, 3, 16, 16)).astype(np.float32)
    model = engine.load_model(symbol, params, precision="int8",
                              calibration={"data": calibration})
    with numpy_path():
        exact = engine.load_model(symbol, params, precision="int8",
                                  calibration={"data": calibration}).infer(
            {"data": images})["fc2_output"]
    return model, images, exact


def test_convolutions_read_by_convolutions_hand_off_channels_last(models):
    model, images, exact = models
    before = integer.PATHS["int8_channels_last_handoff"]
    got = model.infer({"data": images})["fc2_output"]
    # stem (read by b1a and b1b's sum), b1a, b1b (read by b2a, b2d), b2a and b2d (b2b's
    # residual) hand off; b2b writes NCHW: a dequantize reads it (its relu runs in float)
    assert integer.PATHS["int8_channels_last_handoff"] - before == 5
    np.testing.assert_array_equal(got, exact)


def test_a_reader_on_the_numpy_path_takes_nchw_back(models, monkeypatch):
    """The 32-filter layers refused by the fused kernel: the writers before them still hand
    off channels-last, and those readers turn the bytes back to NCHW first."""
    model, images, exact = models
    supported = int8_conv.supported
    monkeypatch.setattr(int8_conv, "supported", lambda data, weight, *rest: (
        weight.shape[0] != 32 and supported(data, weight, *rest)))
    plan_model = engine.load_model(*residual_net(), precision="int8",
                                   calibration={"data": RNG.standard_normal(
                                       (16, 3, 16, 16)).astype(np.float32)})
    before = integer.PATHS["int8_channels_last_handoff"]
    got = plan_model.infer({"data": images})
    assert integer.PATHS["int8_channels_last_handoff"] - before == 3  # stem, b1a, b1b
    with numpy_path():
        want = plan_model.infer({"data": images})
    np.testing.assert_array_equal(got["fc2_output"], want["fc2_output"])


def test_the_numpy_path_between_fused_runs_writes_nchw(models):
    """Runs alternating with the compiled paths off (a writer then writes NCHW, and says so)
    give the same logits each time."""
    model, images, exact = models
    for fast in (True, False, True):
        before = integer.PATHS["int8_channels_last_handoff"]
        integer.use_fast_path(fast)
        try:
            got = model.infer({"data": images})["fc2_output"]
        finally:
            integer.use_fast_path(True)
        assert (integer.PATHS["int8_channels_last_handoff"] > before) == fast
        np.testing.assert_array_equal(got, exact)


def test_a_reader_bound_without_the_fused_path_keeps_its_writer_nchw(models, monkeypatch):
    """The 32-filter layers bound as the plain kernel (as a node whose weights are not
    constant is): they never take the hand-off, so the layer they read (b1b) writes NCHW."""
    from engine.ops.quantized import fused

    model, images, exact = models
    fused_conv = fused._FusedInt8Conv
    monkeypatch.setattr(fused, "_FusedInt8Conv", lambda attrs, weights, *rest: (
        None if weights.weight.shape[0] == 32 else fused_conv(attrs, weights, *rest)))
    plan_model = engine.load_model(*residual_net(), precision="int8",
                                   calibration={"data": RNG.standard_normal(
                                       (16, 3, 16, 16)).astype(np.float32)})
    before = integer.PATHS["int8_channels_last_handoff"]
    got = plan_model.infer({"data": images})
    assert integer.PATHS["int8_channels_last_handoff"] - before == 2  # stem, b1a
    with numpy_path():
        want = plan_model.infer({"data": images})
    np.testing.assert_array_equal(got["fc2_output"], want["fc2_output"])


def test_a_dequantize_reads_the_hand_off():
    """A convolution read by a dequantize (a max pooling in float after it) and as the
    residual of the next: it hands off, and the logits are the NumPy path's. The next, read
    by the dequantize alone, does not (the dequantize would transpose instead)."""
    data = sym.var("data")
    first = sym.Activation(nets._conv_bn(data, "c1", 64, 3), act_type="relu", name="c1_relu")
    net = sym.Activation(nets._conv_bn(first, "c2", 64, 3) + first, act_type="relu",
                         name="c2_relu")
    net = sym.Pooling(net + first, kernel=(2, 2), stride=(2, 2), pool_type="max",
                      name="pool")
    net = sym.FullyConnected(net, num_hidden=10, name="fc")
    params = nets.random_params(net, (1, 3, 14, 14), seed=3)
    calibration = {"data": RNG.standard_normal((8, 3, 14, 14)).astype(np.float32)}
    model = engine.load_model(net, params, precision="int8", calibration=calibration)
    assert "_contrib_dequantize" in {node.op for node in model.run_graph.nodes}
    images = {"data": RNG.standard_normal((2, 3, 14, 14)).astype(np.float32)}
    before = integer.PATHS["int8_channels_last_handoff"]
    got = model.infer(images)["fc_output"]
    assert integer.PATHS["int8_channels_last_handoff"] - before == 1
    with numpy_path():
        want = model.infer(images)["fc_output"]
    np.testing.assert_array_equal(got, want)


@pytest.mark.skipif(not gemm_int8.amx_available(), reason="needs AMX-INT8")
def test_layers_of_few_channels_per_kernel_row_run_the_direct_product(monkeypatch):
    """The stem (3 channels, 3×3) and the 1×1 down-sampling layer over 16 channels, whose K
    alone is under AMX's 64: packed as rows of taps (the stem's three kernel rows stacked in
    one 64-byte step, the 1×1 layer's one), they run the direct product on AMX; the logits
    stay the NumPy path's."""
    made = []
    original = int8_conv.FusedConv.__init__

    def spy(self, data, weight, *rest, **named):
        original(self, data, weight, *rest, **named)
        made.append((weight.shape[1:], self.tap_rows, bool(self.tile_rows), self.stack))

    monkeypatch.setattr(int8_conv.FusedConv, "__init__", spy)
    symbol, params = residual_net()
    model = engine.load_model(symbol, params, precision="int8", calibration={
        "data": RNG.standard_normal((16, 3, 16, 16)).astype(np.float32)})
    images = RNG.standard_normal((3, 3, 16, 16)).astype(np.float32)
    got = model.infer({"data": images})["fc2_output"]
    assert ((3, 3, 3), True, True, 3) in made  # the stem: its 3 kernel rows in one step
    assert ((16, 1, 1), True, True, 1) in made  # b2d
    with numpy_path():
        want = model.infer({"data": images})["fc2_output"]
    np.testing.assert_array_equal(got, want)
