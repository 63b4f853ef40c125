"""precision int8: the float graph rewritten into MXNet's oneDNN int8 graph after calibration
(`engine.quantize`, `engine.runtime.int8`), checked against the float32 model it came from."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import engine
from bench import nets
from engine import sym
from engine.graph.ir import Entry
from engine.kernels import gemm_int8, int8_conv
from engine.ops.quantized import integer
from engine.quantize import find_chains
from engine.quantize.thresholds import TensorStats, entropy_range, naive_range
from tests.engine.ops.quantized.int8_models import numpy_path

# int8's semantics, on any host (where our kernels are missing, on the NumPy path).
pytestmark = pytest.mark.usefixtures("int8_kernels_counted")

RNG = np.random.default_rng(36)


def residual_net() -> tuple[sym.Symbol, dict[str, np.ndarray]]:
    """Conv+BN+relu, a block whose residual is the block's own input (uint8 after its relu),
    a strided block whose residual is a 1×1 conv+BN (signed), pooling and two dense layers."""
    data = sym.var("data")
    stem = nets._conv_bn(data, "stem", 16, 3)
    stem = sym.Activation(stem, act_type="relu", name="stem_relu")
    body = sym.Activation(nets._conv_bn(stem, "b1a", 16, 3), act_type="relu", name="b1a_relu")
    block = sym.Activation(nets._conv_bn(body, "b1b", 16, 3) + stem, act_type="relu",
                           name="b1_out")
    body = sym.Activation(nets._conv_bn(block, "b2a", 32, 3, 2), act_type="relu",
                          name="b2a_relu")
    down = nets._conv_bn(block, "b2d", 32, 1, 2)
    block = sym.Activation(nets._conv_bn(body, "b2b", 32, 3) + down, act_type="relu",
                           name="b2_out")
    pooled = sym.Pooling(block, kernel=(2, 2), stride=(2, 2), pool_type="avg", name="pool")
    hidden = sym.Activation(sym.FullyConnected(pooled, num_hidden=48, name="fc1"),
                            act_type="relu", name="fc1_relu")
    net = sym.FullyConnected(hidden, num_hidden=10, name="fc2")
    return net, nets.random_params(net, (1, 3, 16, 16), seed=5)


def ops_of(model: engine.Model) -> Counter:
    return Counter(node.op for node in model.run_graph.nodes if not node.is_variable)


def agreement(model: engine.Model, images: np.ndarray) -> tuple[float, float]:
    """(relative error, top-1 agreement) of the int8 plan against the float32 reference."""
    got = model.infer({"data": images})["fc2_output"]
    want = model.reference({"data": images})["fc2_output"]
    relative = float(np.abs(got - want).max() / np.abs(want).max())
    return relative, float(np.mean(got.argmax(axis=1) == want.argmax(axis=1)))


@pytest.fixture(scope="module")
def net() -> tuple[sym.Symbol, dict[str, np.ndarray]]:
    return residual_net()


def test_every_conv_and_dense_layer_becomes_one_fused_int8_node(net) -> None:  # noqa: ANN001
    symbol, params = net
    calibration = RNG.standard_normal((32, 3, 16, 16)).astype(np.float32)
    model = engine.load_model(symbol, params, precision="int8",
                              calibration={"data": calibration})
    assert model.precision == "int8"
    ops = ops_of(model)
    assert ops["_sg_mkldnn_conv"] == 6 and ops["_sg_mkldnn_fully_connected"] == 2
    for banned in ("Convolution", "BatchNorm", "FullyConnected", "elemwise_add"):
        assert ops[banned] == 0, banned
    # Every relu is fused, the signed residual's block's too (summed out of place, see
    # `rewrite`): one dequantize before the pooling (it reads the block's float value), and
    # one quantize each for the graph's input and the pooled value.
    assert ops["Activation"] == 0 and ops["_contrib_dequantize"] == 1
    assert ops["_contrib_quantize_v2"] == 2
    by_name = {node.name: node for node in model.run_graph.nodes}
    assert by_name["fc2"].params.enable_float_output  # read only by the graph's output
    for name, signed_residual in (("b1_out", False), ("b2_out", True)):
        block = by_name[name].params
        assert block.with_sum and block.with_postsum_act, name
        assert block.out_of_place_sum == signed_residual, name
        assert block.min_calib_range == 0, name  # uint8 over the relu's range
    assert by_name["stem_relu"].params.min_calib_range == 0  # uint8 after its relu


def test_the_int8_model_agrees_with_float32(net) -> None:  # noqa: ANN001
    symbol, params = net
    calibration = RNG.standard_normal((32, 3, 16, 16)).astype(np.float32)
    images = RNG.standard_normal((64, 3, 16, 16)).astype(np.float32)
    # Entropy clips each tensor's tail, so its largest error is larger on these random
    # activations (measured: naive 0.018 and 100%, entropy 0.12 and 98.4%).
    for mode, most_error in (("naive", 0.05), ("entropy", 0.2)):
        model = engine.load_model(symbol, params, precision="int8",
                                  calibration={"data": calibration},
                                  calibration_settings={"mode": mode, "num_bins": 1001})
        before = integer.PATHS["int8_gemm"]
        relative, top1 = agreement(model, images)
        assert relative < most_error, mode
        assert top1 >= 0.95, mode
        # The products run on the int8 GEMM wherever the host has VNNI.
        assert (integer.PATHS["int8_gemm"] > before) == gemm_int8.available()


@pytest.mark.parametrize("batch", [1, 3])
def test_the_fused_int8_convolutions_equal_the_numpy_path(net, batch) -> None:  # noqa: ANN001
    """The plan's convolutions run fused (`int8_conv`: compiled passes on the spin pool),
    and give the NumPy path's bytes: the same logits, bit for bit."""
    symbol, params = net
    calibration = RNG.standard_normal((32, 3, 16, 16)).astype(np.float32)
    images = RNG.standard_normal((batch, 3, 16, 16)).astype(np.float32)
    model = engine.load_model(symbol, params, precision="int8",
                              calibration={"data": calibration})
    before = integer.PATHS["int8_fused_conv"]
    for _ in range(3):  # the runs alternate armed and on one thread (`spin_pool.Choice`)
        fused = model.infer({"data": images})["fc2_output"]
    assert (integer.PATHS["int8_fused_conv"] - before == 18) == int8_conv.supported_here()
    with numpy_path():
        exact = engine.load_model(symbol, params, precision="int8",
                                  calibration={"data": calibration}).infer(
            {"data": images})["fc2_output"]
    np.testing.assert_array_equal(fused, exact)


def test_entropy_clips_a_long_tail_that_min_max_keeps() -> None:
    values = np.concatenate([RNG.standard_normal(50_000), [40.0, -35.0]]).astype(np.float32)
    stats = TensorStats()
    stats.see_extremes(values)
    stats.see_histogram(values, 2001)
    assert naive_range(stats) == pytest.approx((-35.0, 40.0))
    low, high = entropy_range(stats)
    assert low == -high and 2.0 < high < 20.0
    positive = TensorStats()
    positive.see_extremes(np.abs(values))
    positive.see_histogram(np.abs(values), 2001)
    low, high = entropy_range(positive)
    assert low == 0.0 and 2.0 < high < 20.0


def test_a_value_read_twice_ends_its_chain() -> None:
    data = sym.var("data")
    conv = sym.Convolution(data, num_filter=4, kernel=(3, 3), pad=(1, 1), name="c")
    relu = sym.Activation(conv, act_type="relu", name="r")
    net = sym.Group([relu, sym.Activation(conv, act_type="sigmoid", name="s")])
    (chain,) = find_chains(net.to_graph())
    assert chain.act is None and chain.last == chain.main
    graph = (relu + data).to_graph()
    (chain,) = find_chains(graph)
    assert chain.act is not None and chain.summand == Entry(0, 0)


def test_int8_needs_calibration_inputs_it_can_use(net) -> None:  # noqa: ANN001
    symbol, params = net
    with pytest.raises(ValueError, match="precision int8 needs calibration inputs"):
        engine.load_model(symbol, params, precision="int8")
    with pytest.raises(ValueError, match="calibration input 'image' is not an input"):
        engine.load_model(symbol, params, precision="int8",
                          calibration={"image": np.zeros((2, 3, 16, 16), np.float32)})
    with pytest.raises(ValueError, match="calibration mode 'kl' is not one of naive, entropy"):
        engine.load_model(symbol, params, precision="int8",
                          calibration={"data": np.zeros((2, 3, 16, 16), np.float32)},
                          calibration_settings={"mode": "kl"})
    with pytest.raises(ValueError, match="not available on the GPU"):
        engine.runtime.precision.resolve("int8", "gpu")


def depthwise_net() -> tuple[sym.Symbol, dict[str, np.ndarray]]:
    """A convolution of one group, a depthwise one (a group a channel) and a dense layer."""
    data = sym.var("data")
    body = sym.Activation(nets._conv_bn(data, "c1", 8, 3), act_type="relu", name="c1_relu")
    body = sym.Convolution(body, num_filter=8, num_group=8, kernel=(3, 3), pad=(1, 1),
                           name="dw")
    body = sym.Activation(body, act_type="relu", name="dw_relu")
    net = sym.FullyConnected(body, num_hidden=10, name="fc2")
    return net, nets.random_params(net, (1, 3, 16, 16), seed=7)


@pytest.mark.parametrize("narrow", [True, False])
def test_convolutions_of_one_group_take_narrow_weights_where_the_host_asks(
        monkeypatch: pytest.MonkeyPatch, narrow: bool) -> None:
    """Where the host's int8 GEMM runs weights within ±63 faster (`rewrite.
    narrow_weights_here`), the rewrite marks each convolution of one group so, never a
    depthwise one nor a dense layer; the model still agrees with float32, and its fused
    convolutions give the NumPy path's bytes."""
    from engine.quantize import rewrite

    monkeypatch.setattr(rewrite, "narrow_weights_here", lambda: narrow)
    symbol, params = depthwise_net()
    calibration = RNG.standard_normal((32, 3, 16, 16)).astype(np.float32)
    images = RNG.standard_normal((64, 3, 16, 16)).astype(np.float32)
    model = engine.load_model(symbol, params, precision="int8",
                              calibration={"data": calibration})
    marked = {node.name: node.params.narrow_weights for node in model.run_graph.nodes
              if node.op == "_sg_mkldnn_conv"}
    assert marked == {"c1_relu": narrow, "dw_relu": False}
    assert rewrite.narrowed_layers(model.run_graph) == int(narrow)
    assert all("narrow_weights" not in node.attrs for node in model.run_graph.nodes
               if node.op == "_sg_mkldnn_fully_connected")
    relative, top1 = agreement(model, images)
    assert relative < 0.05 and top1 >= 0.95
    with numpy_path():
        exact = engine.load_model(symbol, params, precision="int8",
                                  calibration={"data": calibration}).infer(
            {"data": images})["fc2_output"]
    np.testing.assert_array_equal(model.infer({"data": images})["fc2_output"], exact)


def test_narrow_weights_reach_63_steps_a_channel_and_no_further() -> None:
    """Narrow weights: each channel's largest magnitude at 63 steps (±63, never 64), the
    rest rounded on the same scale, within half a step of the float weights; full-range ones
    reach 127 (or -128: -127.5 rounds to even)."""
    from engine.ops.quantized.requantize import quantized_weight_bias, weight_scales

    weight = RNG.standard_normal((6, 4, 3, 3)).astype(np.float32)
    weight[2] *= 40  # channels of very different magnitudes
    bias = RNG.standard_normal(6).astype(np.float32)
    data_scale = np.float32(20.0)
    for narrow, top, reaches in ((True, 63, {63}), (False, 127, {127, 128})):
        scales = weight_scales(weight, bias, data_scale, True, narrow)
        weight_q, _ = quantized_weight_bias(weight, bias, data_scale, scales, narrow)
        reach = np.abs(weight_q.reshape(6, -1).astype(np.int64)).max(axis=1)
        assert set(reach.tolist()) <= reaches and top in reach
        steps = weight * scales.reshape(-1, 1, 1, 1)
        inside = np.abs(steps) < top  # the largest saturate at the top
        assert np.abs(weight_q[inside] - steps[inside]).max() <= 0.5
