"""A clip or ReLU after a bound convolution runs inside its last pass
(`engine.kernels.epilogue`)."""

from __future__ import annotations

import numpy as np
import pytest

from engine import sym
from engine.kernels import epilogue, gemm_kernel
from tests.engine.runtime.helpers import load_pair, step_funcs

RNG = np.random.default_rng(23)


def funcs(plan) -> list:
    return step_funcs(plan)


@pytest.mark.parametrize(("kernel", "stride", "pad"), [((1, 1), (1, 1), (0, 0)),
                                                       ((3, 3), (2, 2), (1, 1))], ids=str)
@pytest.mark.parametrize("activation", ["clip", "relu"])
def test_bias_and_clamp_in_one_pass(kernel: tuple, stride: tuple, pad: tuple,
                                    activation: str) -> None:
    data = sym.var("data")
    net = sym.Convolution(data, kernel=kernel, stride=stride, pad=pad, num_filter=5,
                          name="conv")
    if activation == "clip":
        net = sym.clip(net, a_min=-0.5, a_max=1.5, name="out")
    else:
        net = sym.Activation(net, act_type="relu", name="out")
    shape = (2, 3, 9, 8)
    optimized, reference = load_pair(net, shape, RNG)
    x = RNG.normal(size=shape).astype(np.float32)
    x[1, 2, 3, 3] = np.nan
    plan = optimized.plan_for({"data": x})
    ours = any(isinstance(step.call, gemm_kernel.Product) for step in plan.steps)
    # One compiled pass, or none where our GEMM adds and clamps as it stores.
    assert epilogue.bias_clamp in funcs(plan) or ours
    assert np.add not in funcs(plan) and np.clip not in funcs(plan)
    for _ in range(2):
        want = reference.infer({"data": x})["out_output"]
        assert np.isnan(want).any()
        np.testing.assert_allclose(optimized.infer({"data": x})["out_output"], want,
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("clamp", [True, False])
@pytest.mark.parametrize("kernel", [(1, 1), (3, 3)])
def test_bias_residual_add_and_clamp_in_one_pass(clamp: bool, kernel: tuple) -> None:
    # ResNet's and MobileNet v2's block ends: conv + bias, + the block's input, (ReLU).
    data = sym.var("data")
    conv = sym.Convolution(data, kernel=kernel, pad=(kernel[0] // 2,) * 2, num_filter=4,
                           name="conv")
    net = sym.elemwise_add(conv, data, name="add")
    net = sym.clip(net, a_min=0, a_max=6, name="out") if clamp else net
    shape = (2, 4, 6, 7)
    optimized, reference = load_pair(net, shape, RNG)
    plan = optimized.plan_for({"data": np.zeros(shape, np.float32)})
    called = funcs(plan)
    # One compiled pass; or, where our GEMM adds the bias as it stores and nothing clamps,
    # the add alone (an AVX2 host's 8-lane tile takes these four filters).
    ours = any(isinstance(step.call, gemm_kernel.Product) for step in plan.steps)
    assert epilogue.bias_add_clamp in called or (ours and not clamp)
    assert np.clip not in called and epilogue.bias_clamp not in called
    name = "out_output" if clamp else "add_output"
    for _ in range(2):  # a second run: nothing left over from the first
        x = RNG.normal(scale=4, size=shape).astype(np.float32)
        x[1, 3, 2, 2] = np.nan
        want = reference.infer({"data": x})[name]
        assert np.isnan(want).any()
        np.testing.assert_allclose(optimized.infer({"data": x})[name], want,
                                   rtol=1e-5, atol=1e-5)


def test_a_clamp_after_a_broadcast_add_is_left_alone() -> None:
    # An operand of another shape than the output: the NumPy steps run as they are.
    data = sym.var("data")
    conv = sym.Convolution(data, kernel=(1, 1), num_filter=4, name="conv")
    pooled = sym.Pooling(data, kernel=(6, 6), pool_type="avg", global_pool=True, name="pool")
    net = sym.clip(sym.broadcast_add(conv, pooled), a_min=0, a_max=6, name="out")
    optimized, reference = load_pair(net, (1, 4, 6, 6), RNG)
    feed = {"data": RNG.normal(size=(1, 4, 6, 6)).astype(np.float32)}
    called = funcs(optimized.plan_for(feed))
    assert epilogue.bias_clamp not in called and epilogue.bias_add_clamp not in called
    np.testing.assert_allclose(optimized.infer(feed)["out_output"],
                               reference.infer(feed)["out_output"], rtol=1e-5, atol=1e-5)


def test_dense_layers_keep_the_numpy_passes() -> None:
    # The seed MLP's first run must not wait for numba (see `_bias_added`).
    data = sym.var("data")
    net = sym.Activation(sym.FullyConnected(data, num_hidden=7, name="dense"),
                         act_type="relu", name="out")
    optimized, reference = load_pair(net, (3, 6), RNG)
    x = RNG.normal(size=(3, 6)).astype(np.float32)
    assert epilogue.bias_clamp not in funcs(optimized.plan_for({"data": x}))
    np.testing.assert_allclose(optimized.infer({"data": x})["out_output"],
                               reference.infer({"data": x})["out_output"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("clamp", ["relu", "clip"])
def test_dense_bias_and_clamp_on_whole_shape_operands(rows: int, clamp: str) -> None:
    data = sym.var("data")
    net = sym.FullyConnected(data, num_hidden=7, name="dense")
    net = (sym.Activation(net, act_type="relu", name="out") if clamp == "relu"
           else sym.clip(net, a_min=-0.5, a_max=0.5, name="out"))
    optimized, reference = load_pair(net, (rows, 6), RNG)
    x = RNG.normal(size=(rows, 6)).astype(np.float32)
    x[0, 0] = np.nan  # the whole first row of the output is NaN, and stays NaN
    steps = optimized.plan_for({"data": x}).steps
    # The bias and the clamp's bounds become operands of the output's shape, the clamp folded
    # into the FullyConnected's calls (one row included: a row of zeros beats a scalar there).
    whole = [step.call for step in steps
             if any(getattr(arg, "shape", None) == (rows, 7) for arg in step.call.args[1:2])]
    assert len(whole) == (3 if clamp == "clip" else 2)
    assert len(steps) == len(whole) + 1  # and the GEMM: no clamp step of its own
    assert epilogue.bias_clamp not in funcs(optimized.plan_for({"data": x}))
    got = optimized.infer({"data": x})["out_output"]
    want = reference.infer({"data": x})["out_output"]
    assert np.isnan(want[0]).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    x2 = RNG.normal(size=(rows, 6)).astype(np.float32)  # a second run: nothing left stale
    np.testing.assert_allclose(optimized.infer({"data": x2})["out_output"],
                               reference.infer({"data": x2})["out_output"], rtol=1e-5, atol=1e-5)
