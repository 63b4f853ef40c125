"""precision int8 on MobileNet v2's pieces: relu6 (clip from 0) fused into the int8
convolution before it (`engine.quantize.chains`), checked against the float32 model and the
NumPy path."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import engine
from bench import nets
from engine import sym
from engine.kernels import int8_conv
from engine.ops.quantized import integer
from tests.engine.ops.quantized.int8_models import numpy_path

# int8's semantics, on any host (where our kernels are missing, on the NumPy path).
pytestmark = pytest.mark.usefixtures("int8_kernels_counted")

RNG = np.random.default_rng(62)
SIZE = 16


def relu6(value: sym.Symbol, name: str) -> sym.Symbol:
    return sym.clip(value, a_min=0.0, a_max=6.0, name=name)


def inverted_residual_net() -> tuple[sym.Symbol, dict[str, np.ndarray]]:
    """A stem, two MobileNet v2 blocks (1×1 expansion, 3×3 depthwise, 1×1 projection; the
    first adds its input back), pooling and a dense layer."""
    net = relu6(nets._conv_bn(sym.var("data"), "stem", 16, 3), "stem_relu6")
    for name, stride in (("b1", 1), ("b2", 2)):
        body = relu6(nets._conv_bn(net, f"{name}_expand", 48, 1), f"{name}_expand_relu6")
        body = relu6(nets._conv_bn(body, f"{name}_dw", 48, 3, stride, group=48),
                     f"{name}_dw_relu6")
        body = nets._conv_bn(body, f"{name}_project", 16, 1)
        net = body + net if stride == 1 else body
    pooled = sym.Pooling(net, kernel=(1, 1), global_pool=True, pool_type="avg", name="pool")
    out = sym.FullyConnected(sym.Flatten(pooled), num_hidden=10, name="fc")
    return out, nets.random_params(out, (1, 3, SIZE, SIZE), seed=9)


@pytest.fixture(scope="module")
def net() -> tuple[sym.Symbol, dict[str, np.ndarray]]:
    return inverted_residual_net()


@pytest.fixture(scope="module")
def model(net) -> engine.Model:  # noqa: ANN001
    symbol, params = net
    calibration = np.random.default_rng(62).standard_normal((32, 3, SIZE, SIZE))
    return engine.load_model(symbol, params, precision="int8",
                             calibration={"data": calibration.astype(np.float32)})


def test_relu6_joins_its_convolution(model) -> None:  # noqa: ANN001
    ops = Counter(node.op for node in model.run_graph.nodes if not node.is_variable)
    assert ops["_sg_mkldnn_conv"] == 7 and ops["clip"] == 0 and ops["elemwise_add"] == 0
    # a quantize for the graph's input, none for the dense layer's (the pooling sums the
    # integers) and no dequantize: no pair left around relu6, the residual sum or the head
    assert ops["_contrib_quantize_v2"] == 1 and ops["_contrib_dequantize"] == 0
    assert ops["_quantized_global_average"] == 1 and ops["_contrib_quantized_flatten"] == 1
    by_name = {node.name: node for node in model.run_graph.nodes}
    stem = by_name["stem_relu6"]
    assert stem.params.with_act and stem.params.min_calib_range == 0  # uint8 after relu6
    assert stem.params.max_calib_range <= 6


def test_the_int8_model_agrees_with_float32(model) -> None:  # noqa: ANN001
    images = np.random.default_rng(7).standard_normal((256, 3, SIZE, SIZE)).astype(np.float32)
    got = model.infer({"data": images})["fc_output"]
    want = model.reference({"data": images})["fc_output"]
    # measured: 0.042 and 98.4% (with relu6 run in float between a dequantize and a
    # quantize: 0.048 and 97.7%)
    assert float(np.abs(got - want).max() / np.abs(want).max()) < 0.15
    assert np.mean(got.argmax(axis=1) == want.argmax(axis=1)) >= 0.93


@pytest.mark.parametrize("batch", [1, 3])
def test_the_fused_layers_handing_off_channels_last_equal_the_numpy_path(net, batch) -> None:  # noqa: ANN001
    symbol, params = net
    calibration = RNG.standard_normal((32, 3, SIZE, SIZE)).astype(np.float32)
    images = RNG.standard_normal((batch, 3, SIZE, SIZE)).astype(np.float32)
    model = engine.load_model(symbol, params, precision="int8",
                              calibration={"data": calibration})
    before = integer.PATHS["int8_fused_conv"]
    handed = integer.PATHS["int8_channels_last_handoff"]
    for _ in range(3):  # the runs alternate armed and on one thread (`spin_pool.Choice`)
        fused = model.infer({"data": images})["fc_output"]
    assert (integer.PATHS["int8_fused_conv"] - before == 21) == int8_conv.supported_here()
    # every convolution hands its output on channels-last, the depthwise layers (reading
    # and writing) among them, the last to the global average
    handed = integer.PATHS["int8_channels_last_handoff"] - handed
    assert (handed == 3 * 7) == int8_conv.supported_here()
    with numpy_path():
        exact = engine.load_model(symbol, params, precision="int8",
                                  calibration={"data": calibration}).infer(
            {"data": images})["fc_output"]
    np.testing.assert_array_equal(fused, exact)


def test_relu6_clamps_at_six_inside_the_int8_convolution() -> None:
    """Calibrated on inputs large enough to reach the clip's top, the layer's uint8 range
    ends at 6, and inputs beyond it come out at 6, as the float clip gives them."""
    net = relu6(nets._conv_bn(sym.var("data"), "c", 8, 3), "c_relu6")
    params = nets.random_params(net, (1, 3, 8, 8), seed=3)
    calibration = 20 * RNG.standard_normal((16, 3, 8, 8)).astype(np.float32)
    model = engine.load_model(net, params, precision="int8", calibration={"data": calibration})
    images = calibration[:4]  # inside the input's calibrated range: it saturates nothing
    (node,) = [node for node in model.run_graph.nodes if node.op == "_sg_mkldnn_conv"]
    assert node.params.with_act and node.params.max_calib_range == pytest.approx(6.0)
    got = model.infer({"data": images})["c_relu6_output"]
    want = model.reference({"data": images})["c_relu6_output"]
    step = 6.0 / 255
    assert got.max() <= 6.0 + 1e-6 and got.min() >= 0.0
    assert (want == 6.0).mean() > 0.2  # many values clipped at the top
    # at the top within a step, but where the float value lies just past 6 (the input's own
    # quantisation, on its range of about ±80, moves the sums by many of the output's steps)
    clipped = got[want == 6.0]
    assert np.mean(np.abs(clipped - 6.0) <= step) > 0.95
