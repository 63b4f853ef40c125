"""`average`: a network's head, a global average pooling of int8/uint8 values whose result a
quantized layer reads, sums the integers exactly and requantizes once over the result's
calibrated range (``_quantized_global_average``): no dequantize, float pooling and quantize
between the last layers, a pre-activation head's BatchNorm and relu on the integers too, and
the logits stay the NumPy path's and near float32's."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import engine
from bench import nets
from engine import sym
from engine.errors import ShapeError
from engine.kernels import int8_conv
from engine.ops.quantized import ranges
from engine.ops.registry import get_op
from tests.engine.ops.quantized.int8_models import (
    assert_agrees_with_float32,
    assert_bound_node_gives_numpys_bytes,
    load_int8,
    paths_matching_numpy,
    preactivation_block,
)

# int8's semantics, on any host (where our kernels are missing, on the NumPy path).
pytestmark = pytest.mark.usefixtures("int8_kernels_counted")

RNG = np.random.default_rng(97)
SHAPE = (3, 12, 14)
OP = "_quantized_global_average"


def preactivation_head_net() -> tuple[sym.Symbol, dict[str, np.ndarray]]:
    """A stem, a pre-activation block, then ResNet v2's head: BatchNorm and relu of the
    block's sum, global average pooling, Flatten and a dense layer."""
    net = preactivation_block(sym.var("data"), "last")
    net = sym.Pooling(net, kernel=(1, 1), global_pool=True, pool_type="avg", name="gap")
    net = sym.FullyConnected(sym.Flatten(net, name="flat"), num_hidden=10, name="fc")
    return net, nets.random_params(net, (1, *SHAPE), seed=29)


@pytest.fixture(scope="module")
def model() -> engine.Model:
    return load_int8(*preactivation_head_net(),
                     RNG.standard_normal((16, *SHAPE)).astype(np.float32))


def test_the_head_runs_on_the_integers(model):
    nodes = model.run_graph.nodes
    ops = Counter(node.op for node in nodes if not node.is_variable)
    assert ops["_quantized_batch_norm_relu"] == 2  # the block's and the head's
    assert ops[OP] == 1 and ops["_contrib_quantized_flatten"] == 1
    assert ops["Pooling"] == ops["Flatten"] == ops["BatchNorm"] == 0
    assert ops["_contrib_quantize_v2"] == 1 and ops["_contrib_dequantize"] == 0  # the input's
    (average,) = [node for node in nodes if node.op == OP]
    assert nodes[average.inputs[0].node].name == "last_relu"
    assert average.params.min_calib_range >= 0 < average.params.max_calib_range


def test_the_int8_model_agrees_with_float32(model):
    assert_agrees_with_float32(
        model, {"data": RNG.standard_normal((32, *SHAPE)).astype(np.float32)}, "fc_output")


@pytest.mark.skipif(not int8_conv.supported_here(),
                    reason="needs AVX-512 VNNI, numba and the spin pool")
def test_the_plan_reads_the_relu_channels_last_and_keeps_the_numpy_paths_logits(model):
    images = {"data": RNG.standard_normal((2, *SHAPE)).astype(np.float32)}
    _, ran = paths_matching_numpy(model, images)
    assert ran["int8_global_average"] == 1
    # stem (b1_bn and the sum), b1_relu, the sum (last_bn), last_relu (the average)
    assert ran["int8_channels_last_handoff"] == 4


def _params(low: float, high: float):
    return get_op(OP).parse_attrs({"min_calib_range": repr(low), "max_calib_range": repr(high)})


@pytest.mark.parametrize("in_dtype,data_range,out_range,out_dtype", [
    (np.uint8, (0.0, 6.0), (0.0, 4.0), np.uint8),
    (np.int8, (-3.0, 4.0), (-1.0, 1.5), np.int8),
])
def test_each_channel_is_its_mean_requantized_within_half_a_step(in_dtype, data_range,
                                                                 out_range, out_dtype):
    info = np.iinfo(in_dtype)
    data = RNG.integers(info.min, info.max + 1, (3, 16, 5, 7)).astype(in_dtype)
    data[:, 0] = info.max  # a channel whose mean passes the output's range: saturated
    low, high = (np.array([bound], np.float32) for bound in data_range)
    got, got_low, got_high = get_op(OP).compute(np, _params(*out_range), [data, low, high])
    assert got.dtype == out_dtype and got.shape == (3, 16, 1, 1)
    assert (float(got_low[0]), float(got_high[0])) == out_range
    step = ranges.max_abs(*data_range) / float(ranges.QUANTIZED_RANGE[np.dtype(in_dtype)])
    mean = data.astype(np.float64).mean(axis=(2, 3), keepdims=True) * step
    want = mean * float(ranges.quantize_scale(out_dtype, *out_range))
    limits = np.iinfo(out_dtype)
    inside = (want > limits.min) & (want < limits.max)
    assert inside.mean() > 0.9 and not inside[:, 0].any()
    assert np.abs(got[inside] - want[inside]).max() <= 0.5 + 1e-3
    np.testing.assert_array_equal(got[~inside], np.clip(np.rint(want[~inside]), limits.min,
                                                        limits.max))


def test_the_bound_node_gives_the_kernels_bytes():
    data = RNG.integers(0, 256, (2, 64, 7, 7)).astype(np.uint8)
    inputs = [data, np.array([0.0], np.float32), np.array([5.0], np.float32)]
    assert_bound_node_gives_numpys_bytes(OP, _params(0.0, 2.0), inputs, "int8_global_average")


def test_bad_input_is_refused_by_name():
    values = [np.array([0.0], np.float32), np.array([5.0], np.float32)]
    with pytest.raises(ShapeError, match=f"{OP}: needs min_calib_range"):
        get_op(OP).compute(np, get_op(OP).parse_attrs({}),
                           [np.zeros((1, 4, 2, 2), np.uint8), *values])
    with pytest.raises(ShapeError, match=rf"{OP}: data must be \(N, C, H, W\)"):
        get_op(OP).compute(np, _params(0.0, 1.0), [np.zeros((4, 2, 2), np.uint8), *values])
    with pytest.raises(ShapeError, match="input 'data' has dtype float32"):
        get_op(OP).compute(np, _params(0.0, 1.0), [np.zeros((1, 4, 2, 2), np.float32),
                                                    *values])


def test_the_bound_flatten_copies_the_bytes_and_the_range():
    op = get_op("_contrib_quantized_flatten")
    inputs = [RNG.integers(0, 256, (2, 64, 1, 1)).astype(np.uint8),
              np.array([0.0], np.float32), np.array([2.5], np.float32)]
    want = op.compute(np, op.parse_attrs({}), inputs)
    out = tuple(np.zeros_like(part) for part in want)
    for call in op.bind_calls(np, op.parse_attrs({}), inputs, out):
        call()
    for got, expected in zip(out, want, strict=True):
        np.testing.assert_array_equal(got, expected)
    assert out[0].shape == (2, 64) and float(out[2][0]) == 2.5
