"""Activation ops: erf accuracy, overflow-free kernels, prelu gamma shape, softmax options."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.ops import get_op
from engine.ops.math.stable_functions import erf, sigmoid


def run(op_name: str, raw: dict, inputs: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    op = get_op(op_name)
    return op.compute(np, op.parse_attrs(raw), inputs)


def test_erf_is_float32_accurate_everywhere() -> None:
    x = np.concatenate([np.linspace(-6, 6, 20001), np.logspace(-20, 1, 500),
                        -np.logspace(-20, 1, 500), [0.0, 1e30, -np.inf]]).astype(np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        result = erf(np, x)
    expected = np.array([math.erf(float(value)) for value in x])
    assert result.dtype == np.float32
    np.testing.assert_allclose(result, expected, rtol=5e-7, atol=1e-30)


def test_sigmoid_and_softrelu_do_not_overflow() -> None:
    x = np.array([-1000.0, -30.0, 0.0, 30.0, 1000.0], np.float32)
    with np.errstate(over="raise"):
        logistic = sigmoid(np, x)
        (soft,) = run("Activation", {"act_type": "softrelu"}, [x])
    np.testing.assert_allclose(logistic, [0.0, 9.357623e-14, 0.5, 1.0, 1.0], rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(soft, [0.0, 9.357623e-14, math.log(2), 30.0, 1000.0], rtol=1e-6)


def test_activation_keeps_dtype_and_shape() -> None:
    op = get_op("Activation")
    attrs = op.parse_attrs({"act_type": "tanh"})
    assert op.infer_shape(attrs, [(2, 0, 3)]) == ([(2, 0, 3)], [(2, 0, 3)])
    (out,) = op.compute(np, attrs, [np.ones((2, 3), np.float16)])
    assert out.dtype == np.float16
    assert get_op("_npx_activation") is op


def test_prelu_gamma_shape_from_data_and_broadcast_over_axis1() -> None:
    op = get_op("LeakyReLU")
    attrs = op.parse_attrs({"act_type": "prelu"})
    assert op.input_names(attrs) == ("data", "gamma")
    assert op.infer_shape(attrs, [(2, 3, 4), None]) == ([(2, 3, 4), (3,)], [(2, 3, 4)])
    assert op.infer_shape(attrs, [(2, 3, 4), (1,)])[0][1] == (1,)
    data = -np.ones((2, 3, 2), np.float32)
    (out,) = op.compute(np, attrs, [data, np.array([0.1, 0.2, 0.3], np.float32)])
    np.testing.assert_allclose(out[1, :, 0], [-0.1, -0.2, -0.3])
    (shared,) = op.compute(np, attrs, [data, np.array([0.5], np.float32)])
    np.testing.assert_allclose(shared, -0.5 * np.ones_like(data))


def test_rrelu_has_two_visible_outputs() -> None:
    op = get_op("LeakyReLU")
    attrs = op.parse_attrs({"act_type": "rrelu", "lower_bound": "0.2", "upper_bound": "0.4"})
    assert op.num_outputs(attrs) == 2
    assert op.infer_dtype(attrs, [np.dtype(np.float32)])[1] == [np.dtype(np.float32)] * 2
    out, _ = op.compute(np, attrs, [np.array([-1.0, 2.0], np.float32)])
    np.testing.assert_allclose(out, [-0.3, 2.0], rtol=1e-6)


def test_elu_uses_slope_as_alpha_and_large_inputs_are_finite() -> None:
    with np.errstate(over="raise"):
        (out,) = run("LeakyReLU", {"act_type": "elu"}, [np.array([-2.0, 500.0], np.float32)])
    np.testing.assert_allclose(out, [0.25 * math.expm1(-2.0), 500.0], rtol=1e-6)


def test_softmax_length_shape_dtype_and_masking() -> None:
    op = get_op("softmax")
    attrs = op.parse_attrs({"axis": "1", "use_length": "True", "dtype": "float64"})
    assert op.input_names(attrs) == ("data", "length")
    assert op.infer_shape(attrs, [(2, 5, 3), None]) == ([(2, 5, 3), (2, 3)], [(2, 5, 3)])
    in_dtypes, out_dtypes = op.infer_dtype(attrs, [np.dtype(np.float32), None])
    assert in_dtypes[1] == np.dtype(np.int32) and out_dtypes == [np.dtype(np.float64)]
    data = np.zeros((1, 4, 2), np.float32)
    (out,) = op.compute(np, attrs, [data, np.array([[2, 0]], np.int32)])
    assert out.dtype == np.float64
    np.testing.assert_allclose(out[0, :, 0], [0.5, 0.5, 0.0, 0.0])
    np.testing.assert_allclose(out[0, :, 1], [0.0, 0.0, 0.0, 0.0])


def test_log_softmax_and_softmin_are_consistent_with_softmax() -> None:
    data = np.random.default_rng(0).normal(size=(3, 6)).astype(np.float32)
    (soft,) = run("softmax", {"temperature": "2"}, [data])
    (log,) = run("log_softmax", {"temperature": "2"}, [data])
    (mins,) = run("softmin", {}, [data])
    (neg,) = run("softmax", {}, [-data])
    np.testing.assert_allclose(np.exp(log), soft, rtol=1e-5)
    np.testing.assert_allclose(mins, neg, rtol=1e-6)


@pytest.mark.parametrize(("raw", "label"), [({}, (2, 3, 4)), ({"multi_output": "True"}, (2, 4, 5)),
                                            ({"preserve_shape": "True"}, (2, 3, 4))])
def test_softmax_output_label_shape(raw: dict, label: tuple) -> None:
    op = get_op("SoftmaxOutput")
    inputs, outputs = op.infer_shape(op.parse_attrs(raw), [(2, 3, 4, 5), None])
    assert inputs[1] == label and outputs == [(2, 3, 4, 5)]
    assert get_op("Softmax") is op


def test_regression_heads() -> None:
    data = np.array([[-1.0, 0.0, 3.0]], np.float32)
    label = np.zeros_like(data)
    assert get_op("MAERegressionOutput").infer_shape(
        get_op("MAERegressionOutput").parse_attrs({}), [(1, 3), None])[0] == [(1, 3), (1, 3)]
    np.testing.assert_array_equal(run("MAERegressionOutput", {}, [data, label])[0], data)
    np.testing.assert_allclose(run("LogisticRegressionOutput", {}, [data, label])[0],
                               1 / (1 + np.exp(-data)), rtol=1e-6)


def test_dropout_is_identity_at_inference_with_a_hidden_mask() -> None:
    op = get_op("Dropout")
    attrs = op.parse_attrs({"p": "0.7", "axes": "(2, 3)"})
    assert op.num_outputs(attrs) == 1 and op.num_total_outputs(attrs) == 2
    data = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    (out,) = op.compute(np, attrs, [data])
    np.testing.assert_array_equal(out, data)
    assert out is not data
    assert get_op("_npx_dropout") is op
