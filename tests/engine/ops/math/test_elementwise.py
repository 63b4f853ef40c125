"""Elementwise operators: semantics, dtypes, partial shape inference, aliases and ``out=``."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest

from engine.errors import ModelFormatError, ShapeError
from engine.ops import all_ops, get_op
from engine.ops.registry import OpDef

RNG = np.random.default_rng(7)


def run(name: str, *inputs: np.ndarray, out: Any = None, **raw: str) -> np.ndarray:
    op = get_op(name)
    return op.compute(np, op.parse_attrs(raw), list(inputs), out=out)[0]


def elementwise_ops() -> dict[str, OpDef]:
    """Canonical elementwise ops defined in engine/ops/math/elementwise.py."""
    return {name: op for name, op in all_ops().items()
            if op.name == name and op.kernel.__module__ == "engine.ops.math.elementwise"}


def sample_inputs(op: OpDef) -> list[np.ndarray]:
    names = op.input_names(op.parse_attrs(default_attrs(op)))
    # Values in (1.1, 3) keep log, sqrt, arccosh, power... in their domains; (-0.9, 0.9) suits
    # arcsin, arccos and arctanh.
    low, high = (-0.9, 0.9) if op.name in ("arcsin", "arccos", "arctanh") else (1.1, 3.0)
    return [RNG.uniform(low, high, size=(3, 4)).astype(np.float32) for _ in names]


def default_attrs(op: OpDef) -> dict[str, str]:
    return {"a_min": "0.5", "a_max": "2.0"} if op.name == "clip" else {}


# ---- semantics ------------------------------------------------------------------------------


def test_round_halves_away_from_zero() -> None:
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, -0.49999997, 2.4],
                 dtype=np.float32)
    np.testing.assert_array_equal(run("round", x), [-3, -2, -1, 1, 2, 3, 0, 0, 2])


def test_erf_relative_error_below_1e6_in_float32() -> None:
    x = np.concatenate([np.linspace(-6, 6, 20001), np.logspace(-8, 0.8, 2000),
                        -np.logspace(-8, 0.8, 2000)]).astype(np.float32)
    expected = np.array([math.erf(float(value)) for value in x])
    got = run("erf", x)
    assert got.dtype == np.float32
    relative = np.abs(got - expected) / np.abs(expected)
    assert relative.max() < 1e-6


def test_erf_float16_and_float64_keep_dtype() -> None:
    x = np.array([-1.5, 0.25, 2.0])
    assert run("erf", x).dtype == np.float64
    np.testing.assert_allclose(run("erf", x), [math.erf(v) for v in x], rtol=1e-7)
    assert run("erf", x.astype(np.float16)).dtype == np.float16


def test_sigmoid_is_stable_for_large_inputs() -> None:
    x = np.array([-1000.0, -20.0, 0.0, 20.0, 1000.0], dtype=np.float32)
    got = run("sigmoid", x)  # warnings are errors in this suite: no overflow allowed
    np.testing.assert_allclose(got, [0.0, 2.0611537e-09, 0.5, 1.0, 1.0], rtol=1e-6)


def test_hard_sigmoid_and_softsign() -> None:
    x = np.array([-4.0, -1.0, 0.0, 1.0, 4.0], dtype=np.float32)
    np.testing.assert_allclose(run("hard_sigmoid", x), [0.0, 0.3, 0.5, 0.7, 1.0], rtol=1e-6)
    np.testing.assert_allclose(run("hard_sigmoid", x, alpha="0.1", beta="0.4"),
                               [0.0, 0.3, 0.4, 0.5, 0.8], rtol=1e-6)
    np.testing.assert_allclose(run("softsign", x), x / (1 + np.abs(x)), rtol=1e-6)


def test_mod_follows_the_divisor_sign_and_gives_zero_for_zero_divisor() -> None:
    a = np.array([5.0, -5.0, 5.0, -5.0, 3.0], dtype=np.float32)
    b = np.array([3.0, 3.0, -3.0, -3.0, 0.0], dtype=np.float32)
    np.testing.assert_array_equal(run("_mod", a, b), [2, 1, -1, -2, 0])
    np.testing.assert_array_equal(run("_mod_scalar", a, scalar="0"), np.zeros(5))
    np.testing.assert_array_equal(run("_rmod_scalar", b, scalar="7"), [1, 1, -2, -2, 0])


def test_scalar_ops_put_the_scalar_on_the_right_side() -> None:
    x = np.array([1.0, 2.0, 4.0], dtype=np.float32)
    np.testing.assert_allclose(run("_rminus_scalar", x, scalar="2.0"), [1, 0, -2])
    np.testing.assert_allclose(run("_rdiv_scalar", x, scalar="1"), [1, 0.5, 0.25])
    np.testing.assert_allclose(run("_rpower_scalar", x, scalar="2"), [2, 4, 16])
    np.testing.assert_allclose(run("_power_scalar", x, scalar="1e-05"), x ** 1e-05, rtol=1e-6)
    np.testing.assert_allclose(run("_npi_rtrue_divide_scalar", x, scalar="8"), [8, 4, 2])


def test_scalar_attribute_spellings_and_is_int() -> None:
    op = get_op("_plus_scalar")
    assert op.parse_attrs({"scalar": "2"}).scalar == 2.0
    assert op.parse_attrs({"scalar": "1e-05"}).scalar == 1e-05
    assert op.parse_attrs({"scalar": "2.0", "is_int": "False"}).is_int is False
    assert op.parse_attrs({}).is_int is True
    with pytest.raises(ModelFormatError, match="scalar"):
        op.parse_attrs({"scalar": "two"})


def test_legacy_scalar_ops_keep_integer_dtype() -> None:
    x = np.array([1, 2, 3], dtype=np.int32)
    got = run("_mul_scalar", x, scalar="2.5")
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [2, 4, 6])  # MXNet casts the scalar to int first


def test_numpy_scalar_ops_promote_integers_for_float_scalars() -> None:
    x = np.array([1, 2, 3], dtype=np.int32)
    got = run("_npi_multiply_scalar", x, scalar="2.5", is_int="False")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, [2.5, 5.0, 7.5])
    assert run("_npi_true_divide_scalar", x, scalar="2").dtype == np.float32
    assert run("_npi_add_scalar", x, scalar="2").dtype == np.int32


def test_legacy_comparisons_return_input_dtype_and_numpy_mode_bool() -> None:
    a = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    b = np.array([2.0, 2.0, 2.0], dtype=np.float32)
    got = run("_greater", a, b)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, [0, 0, 1])
    assert run("broadcast_lesser_equal", a, b).dtype == np.float32
    assert run("_equal_scalar", a, scalar="2").tolist() == [0, 1, 0]
    got = run("_npi_less", a, b)
    assert got.dtype == np.bool_
    assert got.tolist() == [True, False, False]
    assert run("_npi_not_equal_scalar", a, scalar="2").dtype == np.bool_
    op = get_op("_npi_equal")
    assert op.infer_dtype(op.parse_attrs({}), [np.dtype(np.float32), None]) == (
        [np.float32, np.float32], [np.bool_])


def test_logical_ops() -> None:
    a = np.array([0.0, 0.0, 2.0, -1.0], dtype=np.float32)
    b = np.array([0.0, 3.0, 0.0, 1.0], dtype=np.float32)
    assert run("_logical_and", a, b).tolist() == [0, 0, 0, 1]
    assert run("broadcast_logical_or", a, b).tolist() == [0, 1, 1, 1]
    assert run("_logical_xor", a, b).tolist() == [0, 1, 1, 0]
    assert run("logical_not", a).tolist() == [1, 1, 0, 0]


def test_numpy_true_divide_of_integers_is_float32() -> None:
    a = np.array([1, 3], dtype=np.int32)
    b = np.array([2, 2], dtype=np.int32)
    got = run("_npi_true_divide", a, b)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, [0.5, 1.5])


def test_numpy_mode_arithmetic_promotes_mixed_dtypes() -> None:
    a = np.array([1.5, 2.5], dtype=np.float32)
    b = np.array([1, 2], dtype=np.int32)
    op = get_op("_npi_add")
    assert op.infer_dtype(op.parse_attrs({}), [a.dtype, b.dtype])[1] == [np.float32]
    got = run("_npi_add", a, b)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, [2.5, 4.5])


def test_clip_and_relu() -> None:
    x = np.array([-3.0, -0.5, 0.2, 7.0], dtype=np.float32)
    np.testing.assert_allclose(run("clip", x, a_min="0", a_max="6"), [0, 0, 0.2, 6])
    np.testing.assert_allclose(run("relu", x), [0, 0, 0.2, 7])
    with pytest.raises(ModelFormatError, match="a_min"):
        get_op("clip").parse_attrs({"a_max": "1"})


def test_same_shape_binary_refuses_different_shapes_at_run_time() -> None:
    with pytest.raises(ShapeError, match="elemwise_add"):
        run("elemwise_add", np.ones((2, 3), np.float32), np.ones((3,), np.float32))


# ---- shape inference ------------------------------------------------------------------------


def test_unary_shape_inference_with_partial_shapes() -> None:
    op = get_op("exp")
    attrs = op.parse_attrs({})
    assert op.infer_shape(attrs, [None]) == ([None], [None])
    assert op.infer_shape(attrs, [(0, 5)]) == ([(0, 5)], [(0, 5)])


def test_same_shape_binary_merges_partial_shapes() -> None:
    op = get_op("elemwise_mul")
    attrs = op.parse_attrs({})
    assert op.infer_shape(attrs, [(0, 3), (2, 0)]) == ([(2, 3), (2, 3)], [(2, 3)])
    assert op.infer_shape(attrs, [None, (2, 3)]) == ([(2, 3), (2, 3)], [(2, 3)])
    with pytest.raises(ShapeError):
        op.infer_shape(attrs, [(2, 3), (2, 4)])


@pytest.mark.parametrize(("lhs", "rhs", "expected"), [
    ((2, 3, 4), (1, 3, 1), (2, 3, 4)),
    ((2, 1, 4), (3, 1), (2, 3, 4)),
    ((2, 0, 4), (3, 1), (2, 3, 4)),
    ((0, 4), (3, 1), (3, 4)),
    ((0, 4), (1, 4), (0, 4)),
    ((0, 4), (0, 4), (0, 4)),
    ((5,), (0, 1), (0, 5)),
    (None, (3, 1), None),
])
def test_broadcast_shape_inference_with_partial_shapes(lhs: Any, rhs: Any, expected: Any) -> None:
    op = get_op("broadcast_add")
    _, out = op.infer_shape(op.parse_attrs({}), [lhs, rhs])
    assert out == [expected]


def test_broadcast_shape_mismatch_is_a_shape_error() -> None:
    op = get_op("broadcast_mul")
    with pytest.raises(ShapeError, match="do not broadcast"):
        op.infer_shape(op.parse_attrs({}), [(2, 3), (4, 3)])
    with pytest.raises(ShapeError, match="do not broadcast"):
        op.infer_shape(op.parse_attrs({}), [(2, 0), (4, 3)])


# ---- registry records -----------------------------------------------------------------------


@pytest.mark.parametrize(("alias", "canonical"), [
    ("_plus", "elemwise_add"), ("_Plus", "elemwise_add"), ("_add", "elemwise_add"),
    ("_minus", "elemwise_sub"), ("_Minus", "elemwise_sub"), ("_sub", "elemwise_sub"),
    ("_mul", "elemwise_mul"), ("_Mul", "elemwise_mul"), ("_div", "elemwise_div"),
    ("_Div", "elemwise_div"), ("_Maximum", "_maximum"), ("_Power", "_power"),
    ("broadcast_plus", "broadcast_add"), ("broadcast_minus", "broadcast_sub"),
    ("_npi_add", "broadcast_add"), ("_npi_subtract", "broadcast_sub"),
    ("_npi_multiply", "broadcast_mul"), ("_npi_power", "broadcast_power"),
    ("_npi_maximum", "broadcast_maximum"), ("_npi_mod", "broadcast_mod"),
    ("_npx_relu", "relu"), ("_npx_sigmoid", "sigmoid"), ("_npi_exp", "exp"),
    ("_npi_log", "log"), ("_npi_sqrt", "sqrt"), ("_npi_absolute", "abs"),
    ("_npi_negative", "negative"), ("_npi_tanh", "tanh"), ("identity", "_copy"),
    ("stop_gradient", "BlockGrad"), ("_PlusScalar", "_plus_scalar"),
    ("_RMinusScalar", "_rminus_scalar"),
])
def test_aliases_resolve_to_the_canonical_record(alias: str, canonical: str) -> None:
    assert get_op(alias) is get_op(canonical)
    assert get_op(alias).name == canonical


def test_binary_input_names_are_lhs_rhs() -> None:
    for name in ("elemwise_add", "broadcast_div", "_npi_true_divide", "_greater", "_npi_less"):
        op = get_op(name)
        assert op.input_names(op.parse_attrs({})) == ("lhs", "rhs")
    op = get_op("_plus_scalar")
    assert op.input_names(op.parse_attrs({"scalar": "1"})) == ("data",)


@pytest.mark.parametrize("name", sorted(elementwise_ops()))
def test_expression_placeholders_are_attributes(name: str) -> None:
    op = get_op(name)
    assert op.elementwise, f"{name} has no elementwise expression"
    attrs = op.parse_attrs(default_attrs(op))
    text = op.elementwise.format(**{key: repr(value) for key, value in attrs.items()})
    operands = set(re.findall(r"\b[ab]\b", text))
    assert operands <= ({"a", "b"} if len(op.input_names(attrs)) == 2 else {"a"})
    assert "a" in operands


# ---- out= -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(elementwise_ops()))
def test_out_buffer_and_in_place_give_the_same_result(name: str) -> None:
    op = get_op(name)
    attrs = op.parse_attrs(default_attrs(op))
    inputs = sample_inputs(op)
    expected = op.compute(np, attrs, inputs)[0]
    buffer = np.empty_like(expected)
    (written,) = op.compute(np, attrs, inputs, out=buffer)
    assert written is buffer
    np.testing.assert_array_equal(buffer, expected)
    if op.inplace and expected.dtype == inputs[0].dtype:
        aliased = [array.copy() for array in inputs]
        (written,) = op.compute(np, attrs, aliased, out=aliased[0])
        assert written is aliased[0]
        np.testing.assert_allclose(aliased[0], expected, rtol=1e-6)


def test_writes_out_kernels_write_straight_into_out() -> None:
    x = np.array([[-1.0, 2.0]], dtype=np.float32)
    for name in ("relu", "exp", "rsqrt", "negative", "hard_sigmoid", "clip"):
        op = get_op(name)
        assert op.writes_out, name
    out = np.full((1, 2), np.nan, dtype=np.float32)
    result = get_op("relu").kernel(np, get_op("relu").parse_attrs({}), x, out=out)
    assert result is out
    np.testing.assert_array_equal(out, [[0.0, 2.0]])


def test_broadcast_out_buffer_of_output_shape() -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.arange(3, dtype=np.float32).reshape(3, 1)
    out = np.empty((3, 4), dtype=np.float32)
    op = get_op("broadcast_sub")
    assert not op.inplace
    (written,) = op.compute(np, op.parse_attrs({}), [a, b], out=out)
    assert written is out
    np.testing.assert_array_equal(out, a - b)
