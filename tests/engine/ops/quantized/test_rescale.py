"""`rescale`: a pre-activation block's BatchNorm and relu, and a relu no fused layer takes,
between quantized layers run on the integers (``_quantized_batch_norm_relu``,
``_quantized_relu``, bound to `int8_affine`), inside the channels-last hand-off: no dequantize
and quantize around them, and the logits stay the NumPy path's. A relu after a sum with a
signed residual stays in the sum's layer (``out_of_place_sum``)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import engine
from bench import nets
from engine import sym
from engine.cpu import host_features
from engine.kernels import gemm_int8, int8_conv
from tests.engine.ops.quantized.int8_models import (
    assert_agrees_with_float32,
    assert_bound_node_gives_numpys_bytes,
    load_int8,
    paths_matching_numpy,
    preactivation_block,
)

# int8's semantics, on any host (where our kernels are missing, on the NumPy path).
pytestmark = pytest.mark.usefixtures("int8_kernels_counted")

RNG = np.random.default_rng(71)
SHAPE = (3, 13, 11)


def rescaling_path() -> str | None:
    """The `integer.PATHS` name of a layer writing its reader's rescaled output on this host:
    in the product's epilogue (AMX's direct tiles, VNNI's fused ones), in the vector
    requantize pass (an AVX2 host without AVX-512 DQ, whose sums the pass adds in int32), or
    None (the reader's own pass runs)."""
    if gemm_int8.amx_available() or gemm_int8.vnni_available():
        return "int8_rescaled_in_product"
    if host_features.has("avx2") and not host_features.has("avx512dq"):
        return "int8_rescaled_in_requantize"
    return None


def preactivation_net() -> tuple[sym.Symbol, dict[str, np.ndarray]]:
    """A stem, then ResNet v2's pattern: BatchNorm and relu before a convolution, whose sum
    with the block's input the next BatchNorm reads."""
    act = preactivation_block(sym.var("data"), "b2")
    net = sym.Convolution(act, num_filter=32, kernel=(3, 3), pad=(1, 1), no_bias=True,
                          name="b2_conv")
    net = sym.FullyConnected(net, num_hidden=10, name="fc")
    return net, nets.random_params(net, (1, *SHAPE), seed=13)


@pytest.fixture(scope="module")
def model() -> engine.Model:
    return load_int8(*preactivation_net(), RNG.standard_normal((16, *SHAPE)).astype(np.float32))


def test_each_batchnorm_and_relu_becomes_one_node_on_the_integers(model):
    nodes = model.run_graph.nodes
    ops = Counter(node.op for node in nodes if not node.is_variable)
    assert ops["_quantized_batch_norm_relu"] == 2
    assert ops["BatchNorm"] == ops["Activation"] == 0
    assert ops["_contrib_quantize_v2"] == 1 and ops["_contrib_dequantize"] == 0  # the input's
    by_name = {node.name: node for node in nodes}
    for name, summed in (("b1_relu", False), ("b2_relu", True)):
        node = by_name[name]
        source = nodes[node.inputs[0].node]  # the fused layer's int8 (the stem; the sum)
        assert source.op == "_sg_mkldnn_conv" and source.params.with_sum == summed
        assert node.params.min_calib_range == 0 and node.params.max_calib_range > 0


def test_the_node_gives_numpys_bytes_on_the_pass(model):
    (node,) = [node for node in model.run_graph.nodes if node.name == "b2_relu"]
    channels = 64
    data = RNG.integers(-128, 128, (2, channels, 5, 7)).astype(np.int8)
    stats = [np.asarray(RNG.standard_normal(channels) * 0.5 + offset, np.float32)
             for offset in (1.0, 0.0, 0.0, 2.0)]
    for array in stats:
        array.flags.writeable = False  # constant, as a plan's parameters
    inputs = [data, *stats, np.array([-3.0], np.float32), np.array([3.0], np.float32)]
    assert_bound_node_gives_numpys_bytes("_quantized_batch_norm_relu", node.params, inputs,
                                         "int8_batchnorm_relu")


@pytest.mark.skipif(not int8_conv.supported_here(),
                    reason="needs AVX-512 VNNI, numba and the spin pool")
def test_the_plan_hands_off_channels_last_and_keeps_the_numpy_paths_logits(model):
    images = {"data": RNG.standard_normal((2, *SHAPE)).astype(np.float32)}
    _, ran = paths_matching_numpy(model, images)
    path = rescaling_path()
    if path is not None:
        # each BatchNorm and relu written by the layer before (the stem; the sum) from the
        # codes of its own output, beside it: no pass of their own
        assert ran[path] == ran["int8_rescaled_by_writer"] == 2
        assert ran["int8_batchnorm_relu"] == 0
    else:
        assert ran["int8_batchnorm_relu"] == 2 and ran["int8_rescaled_by_writer"] == 0
    # stem (b1_bn and the sum), b1_relu, the sum (b2_bn), b2_relu
    assert ran["int8_channels_last_handoff"] == 4


@pytest.mark.skipif(not int8_conv.supported_here(),
                    reason="needs AVX-512 VNNI, numba and the spin pool")
def test_a_batchnorm_and_relu_its_writer_runs_binds_no_step_of_its_own(model):
    """Each BatchNorm and relu bound right after the layer writing its data runs inside that
    layer's step (`handoff.Rescale.follow`): the plan calls no idle step where the product
    wrote its bytes, and its pass where it did not (the NumPy path's run above)."""
    # a generator of its own: the module's draws the tests after it take stay theirs
    images = {"data": np.random.default_rng(72).standard_normal((2, *SHAPE),
                                                                dtype=np.float32)}
    model.infer(images)
    stepped = {step.node.name for step in model.plan_for(images).steps}
    nodes = model.run_graph.nodes
    rescales = [node for node in nodes if node.op == "_quantized_batch_norm_relu"]
    assert {node.name for node in rescales} == {"b1_relu", "b2_relu"}
    assert not stepped & {"b1_relu", "b2_relu"}
    assert {nodes[node.inputs[0].node].name for node in rescales} <= stepped  # their writers
    _, ran = paths_matching_numpy(model, images)
    assert ran["int8_batchnorm_relu"] + ran["int8_rescaled_by_writer"] == 2


def test_the_int8_model_agrees_with_float32(model):
    assert_agrees_with_float32(
        model, {"data": RNG.standard_normal((32, *SHAPE)).astype(np.float32)}, "fc_output")


def signed_residual_net() -> tuple[sym.Symbol, dict[str, np.ndarray]]:
    """A block whose residual is a projection without relu (signed), its relu after the sum,
    then a convolution reading that relu."""
    data = sym.var("data")
    stem = sym.Activation(nets._conv_bn(data, "stem", 32, 3), act_type="relu", name="stem_relu")
    body = sym.Activation(nets._conv_bn(stem, "b1a", 64, 3), act_type="relu", name="b1a_relu")
    block = sym.Activation(nets._conv_bn(body, "b1b", 64, 3) + nets._conv_bn(stem, "b1d", 64, 1),
                           act_type="relu", name="b1_out")
    net = sym.Activation(nets._conv_bn(block, "b2", 32, 3), act_type="relu", name="b2_relu")
    net = sym.FullyConnected(net, num_hidden=10, name="fc")
    return net, nets.random_params(net, (1, *SHAPE), seed=17)


@pytest.fixture(scope="module")
def signed_sum_model() -> engine.Model:
    return load_int8(*signed_residual_net(),
                     RNG.standard_normal((16, *SHAPE)).astype(np.float32))


def test_the_relu_after_a_signed_sum_stays_fused_out_of_place(signed_sum_model):
    """The sum's layer writes the relu's uint8 over its whole range itself (no relu node,
    no saturation at 127 through the int8 residual's buffer)."""
    nodes = signed_sum_model.run_graph.nodes
    ops = Counter(node.op for node in nodes if not node.is_variable)
    assert ops["_quantized_relu"] == 0 and ops["Activation"] == 0
    (block,) = [node for node in nodes if node.name == "b1_out"]
    assert block.op == "_sg_mkldnn_conv" and block.params.with_sum
    assert block.params.with_postsum_act and block.params.out_of_place_sum
    summand = nodes[block.inputs[block.opdef.input_names(block.params).index("sum")].node]
    assert summand.params.min_calib_range < 0  # the projection's int8
    assert block.params.min_calib_range == 0 and block.params.max_calib_range > 0


def test_a_sum_out_of_place_reaches_past_127_steps(signed_sum_model):
    """The node's uint8 output over its relu's range, with an int8 residual: values past 127
    (MXNet's in-place sum stops there), the bound call's bytes the NumPy kernel's."""
    (node,) = [node for node in signed_sum_model.run_graph.nodes if node.name == "b1_out"]
    names = node.opdef.input_names(node.params)
    _, float_params = signed_residual_net()
    graph_nodes = signed_sum_model.run_graph.nodes
    params = {name: float_params.get(graph_nodes[entry.node].name)
              for name, entry in zip(names, node.inputs, strict=True)}

    def node_inputs(rng: np.random.Generator) -> list[np.ndarray]:
        inputs = []
        for name in names:
            if name in ("data", "sum"):
                dtype = np.uint8 if name == "data" else np.int8
                info = np.iinfo(dtype)
                inputs.append(rng.integers(info.min, info.max + 1, (2, 64, 5, 7)).astype(dtype))
            elif name.startswith(("min", "max")):
                inputs.append(np.array([-2.0 if name.startswith("min") else 2.0], np.float32))
            else:
                value = np.asarray(params[name]).copy()
                value.flags.writeable = False
                inputs.append(value)
        return inputs

    # Random bytes reach past 127 for most draws, not all: the first of a few seeded draws
    # that does, whatever other tests drew before this one.
    for seed in range(8):
        inputs = node_inputs(np.random.default_rng(seed))
        got, _, _ = node.opdef.compute(np, node.params, inputs)
        if got.max() > 127:
            break
    assert got.dtype == np.uint8 and got.max() > 127
    # the compiled kernel where the host has VNNI, else the float64 products
    path = "int8_fused_conv" if int8_conv.supported_here() else None
    assert_bound_node_gives_numpys_bytes(node.op, node.params, inputs, path)


@pytest.mark.skipif(not int8_conv.supported_here(),
                    reason="needs AVX-512 VNNI, numba and the spin pool")
def test_the_sum_out_of_place_hands_off_and_keeps_the_numpy_paths_logits(signed_sum_model):
    images = {"data": RNG.standard_normal((2, *SHAPE)).astype(np.float32)}
    got, ran = paths_matching_numpy(signed_sum_model, images)
    # stem, b1a, b1d (the residual), the sum (read by b2)
    assert ran["int8_channels_last_handoff"] == 4
    reference = signed_sum_model.reference(images)["fc_output"]
    assert np.abs(got - reference).max() < 0.05 * np.abs(reference).max()


def shared_value_net() -> tuple[sym.Symbol, dict[str, np.ndarray]]:
    """A stem's conv+BN read both by a relu (then a convolution) and by a second
    convolution: the relu joins no layer and runs on its own."""
    data = sym.var("data")
    stem = nets._conv_bn(data, "stem", 64, 3)
    left = nets._conv_bn(sym.Activation(stem, act_type="relu", name="stem_relu"), "left", 32, 3)
    right = nets._conv_bn(stem, "right", 32, 1)
    net = sym.FullyConnected(sym.Activation(left + right, act_type="relu", name="out"),
                             num_hidden=10, name="fc")
    return net, nets.random_params(net, (1, *SHAPE), seed=19)


@pytest.fixture(scope="module")
def relu_model() -> engine.Model:
    return load_int8(*shared_value_net(), RNG.standard_normal((16, *SHAPE)).astype(np.float32))


def test_a_relu_no_layer_takes_runs_on_the_integers(relu_model):
    nodes = relu_model.run_graph.nodes
    ops = Counter(node.op for node in nodes if not node.is_variable)
    assert ops["_quantized_relu"] == 1 and ops["Activation"] == 0
    assert ops["_contrib_quantize_v2"] == 1 and ops["_contrib_dequantize"] == 0  # the input's
    (relu,) = [node for node in nodes if node.op == "_quantized_relu"]
    source = nodes[relu.inputs[0].node]
    assert source.op == "_sg_mkldnn_conv" and not source.params.with_act
    assert source.params.min_calib_range < 0
    assert relu.params.min_calib_range == 0 and relu.params.max_calib_range > 0


def test_the_relu_node_gives_numpys_bytes_on_the_pass(relu_model):
    (node,) = [node for node in relu_model.run_graph.nodes if node.op == "_quantized_relu"]
    data = RNG.integers(-128, 128, (2, 64, 5, 7)).astype(np.int8)
    inputs = [data, np.array([-2.5], np.float32), np.array([2.0], np.float32)]
    assert_bound_node_gives_numpys_bytes("_quantized_relu", node.params, inputs, "int8_relu")


@pytest.mark.skipif(not int8_conv.supported_here(),
                    reason="needs AVX-512 VNNI, numba and the spin pool")
def test_the_relu_hands_off_and_keeps_the_numpy_paths_logits(relu_model):
    images = {"data": RNG.standard_normal((2, *SHAPE)).astype(np.float32)}
    got, ran = paths_matching_numpy(relu_model, images)
    path = rescaling_path()
    if path is not None:  # written by the stem, beside its own output
        assert ran[path] == ran["int8_rescaled_by_writer"] == 1
        assert ran["int8_relu"] == 0
    else:
        assert ran["int8_relu"] == 1 and ran["int8_rescaled_by_writer"] == 0
    # the stem (read by the relu and by right), the relu (read by left), right (the residual)
    assert ran["int8_channels_last_handoff"] == 3
    reference = relu_model.reference(images)["fc_output"]
    assert np.abs(got - reference).max() < 0.05 * np.abs(reference).max()


def projection_block_net() -> tuple[sym.Symbol, dict[str, np.ndarray]]:
    """ResNet v2's first block of a stage: its last 1×1 product reads its uint8 data in
    place, and its sum with a projection shortcut is the next BatchNorm and relu's data."""
    def bn_relu(net: sym.Symbol, name: str) -> sym.Symbol:
        return sym.Activation(sym.BatchNorm(net, fix_gamma=False, eps=1e-5, name=f"{name}_bn"),
                              act_type="relu", name=f"{name}_relu")

    def conv(net: sym.Symbol, name: str, filters: int, kernel: int) -> sym.Symbol:
        return sym.Convolution(net, num_filter=filters, kernel=(kernel, kernel),
                               pad=(kernel // 2, kernel // 2), no_bias=True, name=name)

    pre = bn_relu(conv(sym.var("data"), "stem", 64, 3), "b1")
    body = bn_relu(conv(bn_relu(conv(pre, "b1_c1", 64, 1), "b1_c1"), "b1_c2", 64, 3), "b1_c2")
    block = conv(body, "b1_c3", 64, 1) + conv(pre, "b1_shortcut", 64, 1)
    net = conv(bn_relu(block, "b2"), "b2_conv", 32, 3)
    net = sym.FullyConnected(net, num_hidden=10, name="fc")
    return net, nets.random_params(net, (1, *SHAPE), seed=23)


@pytest.mark.skipif(not int8_conv.supported_here() or not gemm_int8.amx_available(),
                    reason="needs AMX, numba and the spin pool")
def test_a_product_reading_its_data_in_place_writes_the_next_preactivation_too():
    """The memory plan keeps the next BatchNorm and relu's output off the buffer of the
    product's data (`OpDef.writes_ahead`), which the product's tiles read while they write
    it: the product writes it, and no pass runs."""
    model = load_int8(*projection_block_net(),
                      RNG.standard_normal((16, *SHAPE)).astype(np.float32))
    images = {"data": RNG.standard_normal((2, *SHAPE)).astype(np.float32)}
    got, ran = paths_matching_numpy(model, images)
    assert ran["int8_rescaled_in_product"] == ran["int8_rescaled_by_writer"] == 1
    assert ran["int8_batchnorm_relu"] == 0
    reference = model.reference(images)["fc_output"]
    assert np.abs(got - reference).max() < 0.05 * np.abs(reference).max()
