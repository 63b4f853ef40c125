"""Max pooling between quantized convolutions runs on int8/uint8 values
(``_contrib_quantized_pooling`` bound to `int8_pool`), inside the channels-last hand-off: the
stem hands its output to the pooling, the pooling to the block after it, and the logits stay
the NumPy path's, bit for bit."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import engine
from bench import nets
from engine import sym
from engine.kernels import int8_conv
from tests.engine.ops.quantized.int8_models import (
    assert_agrees_with_float32,
    load_int8,
    numpy_path_output,
    paths_taken,
)

# int8's semantics, on any host (where our kernels are missing, on the NumPy path).
pytestmark = pytest.mark.usefixtures("int8_kernels_counted")

RNG = np.random.default_rng(53)
SHAPE = (3, 17, 15)  # odd sides: the 3×3 stride 2 windows run past both edges


def pooled_net() -> tuple[sym.Symbol, dict[str, np.ndarray]]:
    """ResNet's opening: conv+BN+relu, max pooling 3×3 stride 2 pad 1, a block whose
    residual is the pooled value, then average pooling and a dense layer."""
    data = sym.var("data")
    stem = sym.Activation(nets._conv_bn(data, "stem", 64, 3), act_type="relu",
                          name="stem_relu")
    pooled = sym.Pooling(stem, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="max",
                         name="pool")
    body = sym.Activation(nets._conv_bn(pooled, "b1a", 64, 3), act_type="relu",
                          name="b1a_relu")
    block = sym.Activation(nets._conv_bn(body, "b1b", 64, 3) + pooled, act_type="relu",
                           name="b1_out")
    net = sym.Pooling(block, global_pool=True, kernel=(1, 1), pool_type="avg", name="gap")
    net = sym.FullyConnected(net, num_hidden=10, name="fc")
    return net, nets.random_params(net, (1, *SHAPE), seed=11)


@pytest.fixture(scope="module")
def model() -> engine.Model:
    return load_int8(*pooled_net(), RNG.standard_normal((16, *SHAPE)).astype(np.float32))


def test_the_max_pooling_reads_the_stems_int8_output(model):
    nodes = model.run_graph.nodes
    ops = Counter(node.op for node in nodes if not node.is_variable)
    # the average pooling sums the integers (`_quantized_global_average`)
    assert ops["Pooling"] == 0 and ops["_quantized_global_average"] == 1
    (pool,) = [node for node in nodes if node.op == "_contrib_quantized_pooling"]
    assert nodes[pool.inputs[0].node].name == "stem_relu"  # the fused stem, no dequantize
    assert [nodes[entry.node].name for entry in pool.inputs] == ["stem_relu"] * 3  # its range
    # one quantize for the graph's input: none around either pooling
    assert ops["_contrib_quantize_v2"] == 1 and ops["_contrib_dequantize"] == 0
    readers = {node.name for node in nodes
               if any(nodes[entry.node] is pool for entry in node.inputs)}
    assert readers == {"b1a_relu", "b1_out"}  # the block's data and its residual


@pytest.mark.skipif(not int8_conv.supported_here(),
                    reason="needs AVX-512 VNNI, numba and the spin pool")
@pytest.mark.parametrize("batch", [1, 3])
def test_the_pooling_hands_off_channels_last_and_keeps_the_numpy_paths_logits(model, batch):
    images = {"data": RNG.standard_normal((batch, *SHAPE)).astype(np.float32)}
    got, ran = paths_taken(lambda: model.infer(images)["fc_output"])
    assert ran["int8_max_pool"] == 1
    # the stem (read by the pooling alone), the pooling (read by b1a and b1b's sum), b1a,
    # and b1b (read by the global average)
    assert ran["int8_channels_last_handoff"] == 4
    # on the NumPy path the convolutions write NCHW, and the pooling reads it so
    np.testing.assert_array_equal(got, numpy_path_output(model, images, "fc_output"))


def test_the_int8_model_agrees_with_float32(model):
    assert_agrees_with_float32(
        model, {"data": RNG.standard_normal((32, *SHAPE)).astype(np.float32)}, "fc_output")
