"""Stride-1 3×3 convolutions bound as Winograd F(2×2, 3×3) (`engine.kernels.winograd_bind`) agree
with the reference kernel, and are used only where they apply. The transforms here are NumPy's,
as on a host without numba (`test_winograd_kernel` tests the compiled ones)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import engine
from engine import sym
from engine.kernels import winograd_bind
from tests.engine.runtime.helpers import load_pair, run_allocation

RNG = np.random.default_rng(7)
CHANNELS = 4
RESNET = [(64, 56), (128, 28), (256, 14), (512, 7)]  # ResNet-18's stride-1 3×3 layers


@pytest.fixture
def bound(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Winograd forced on for small shapes, its transforms NumPy's; the data shape of every
    convolution it binds."""
    numpy_transforms(monkeypatch)
    monkeypatch.setattr(winograd_bind, "MIN_CHANNELS", 1)
    monkeypatch.setattr(winograd_bind, "MIN_TILES", 1)
    shapes: list[tuple] = []
    bind = winograd_bind.bind

    def spy(xp, data, *args):
        shapes.append(data.shape)
        return bind(xp, data, *args)

    monkeypatch.setattr(winograd_bind, "bind", spy)
    return shapes


def numpy_transforms(monkeypatch: pytest.MonkeyPatch) -> None:
    """numba reported missing to Winograd alone: it binds NumPy's transforms (compiled ones
    where numba is), the plan's other kernels as they are."""
    monkeypatch.setattr(winograd_bind, "compiled", SimpleNamespace(available=lambda: False))


def two_convs(pad: int, no_bias: bool):
    """Two 3×3 convolutions in a row (sharing the plan's scratch) with a ReLU epilogue."""
    first = sym.Convolution(sym.var("data"), kernel=(3, 3), pad=(pad, pad),
                            num_filter=CHANNELS + 1, no_bias=no_bias, name="first")
    second = sym.Convolution(sym.Activation(first, act_type="relu"), kernel=(3, 3),
                             pad=(pad, pad), num_filter=CHANNELS, no_bias=no_bias, name="second")
    return sym.Activation(second, act_type="relu", name="relu")


def assert_same_runs(optimized, reference, shape: tuple, runs: int = 2) -> None:
    for _ in range(runs):  # later runs: the padding left in the workspace must still be zero
        x = RNG.normal(size=shape).astype(np.float32)
        got = optimized.infer({"data": x})["relu_output"]
        want = reference.infer({"data": x})["relu_output"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("spatial", [(12, 10), (9, 7)], ids=["even", "odd"])
@pytest.mark.parametrize("pad", [0, 1, 2])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("no_bias", [False, True])
def test_winograd_matches_reference(bound: list, spatial: tuple, pad: int, batch: int,
                                    no_bias: bool) -> None:
    shape = (batch, CHANNELS, *spatial)
    optimized, reference = load_pair(two_convs(pad, no_bias), shape, RNG)
    assert_same_runs(optimized, reference, shape)
    assert len(bound) == 2


def test_samples_in_several_chunks(bound: list, monkeypatch: pytest.MonkeyPatch) -> None:
    # 12×10 outputs are 30 tiles a sample: 60 tiles take two samples at a time (2, 2 and 1).
    monkeypatch.setattr(winograd_bind, "CHUNK_TILES", 60)
    shape = (5, CHANNELS, 12, 10)
    optimized, reference = load_pair(two_convs(1, False), shape, RNG)
    assert_same_runs(optimized, reference, shape)
    assert len(bound) == 2


def test_inputs_of_7_and_8_rows_keep_their_own_padding(bound: list) -> None:
    # Padded to whole tiles, 7×7 and 8×8 inputs both take 10×10 cells; sharing them, the 8×8
    # input would leave data in the row the 7×7 one reads as zero.
    data = sym.var("data")
    first = sym.Convolution(data, kernel=(3, 3), pad=(1, 1), num_filter=CHANNELS, name="first")
    shrink = sym.Convolution(first, kernel=(2, 2), num_filter=CHANNELS, name="shrink")
    second = sym.Convolution(shrink, kernel=(3, 3), pad=(1, 1), num_filter=CHANNELS,
                             name="second")
    shape = (2, CHANNELS, 8, 8)
    optimized, reference = load_pair(sym.Activation(second, act_type="relu", name="relu"),
                                     shape, RNG)
    assert_same_runs(optimized, reference, shape, runs=3)
    assert [s[2:] for s in bound] == [(8, 8), (7, 7)]


def test_winograd_allocates_nothing_per_run(bound: list) -> None:
    shape = (2, 16, 64, 64)
    optimized, _ = load_pair(two_convs(1, False), shape, RNG)
    feed = {"data": RNG.normal(size=shape).astype(np.float32)}
    plan = optimized.plan_for(feed)
    peak, _ = run_allocation(plan, feed, 10)
    # Every transform operand is 2 × 32 × 66 × 16 floats (270 KB) or more: a run building any
    # afresh would show here. What a run may use is numpy's bounded iterator buffers for
    # strided ufunc operands (8192 elements each, for up to three operands) and small objects.
    assert len(bound) == 2
    assert peak < 128 * 1024, f"a run allocated up to {peak} bytes"


def test_a_weight_fed_as_input_is_not_transformed(bound: list) -> None:
    conv = sym.Convolution(sym.var("data"), sym.var("weight"), kernel=(3, 3), pad=(1, 1),
                           num_filter=CHANNELS, no_bias=True, name="conv")
    model = engine.load_model(conv, {}, optimize=True)
    reference = engine.load_model(conv, {}, optimize=False)
    for _ in range(2):  # a new weight each run
        feed = {"data": RNG.normal(size=(2, CHANNELS, 9, 8)).astype(np.float32),
                "weight": RNG.normal(size=(CHANNELS, CHANNELS, 3, 3)).astype(np.float32)}
        np.testing.assert_allclose(model.infer(feed)["conv_output"],
                                   reference.infer(feed)["conv_output"], rtol=1e-4, atol=1e-4)
    assert bound == []


def constant(shape: tuple, dtype=np.float32) -> np.ndarray:
    """A read-only weight, as a plan hands out its constants."""
    array = np.zeros(shape, dtype)
    array.flags.writeable = False
    return array


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("layer", RESNET, ids=str)
def test_applies_to_resnet_layers_with_enough_tiles(batch: int, layer: tuple) -> None:
    channels, size = layer
    geometry = ((3, 3), (1, 1), (1, 1), (1, 1))
    # 512×7 at batch 1 is 16 tiles, the fewest that measured faster.
    assert winograd_bind.applies((batch, channels, size, size),
                                 constant((channels, channels, 3, 3)), geometry)
    small = winograd_bind.applies((batch, channels, 5, 5),  # 9 tiles a sample
                                  constant((channels, channels, 3, 3)), geometry)
    assert small == (batch * 9 >= 16)


@pytest.mark.parametrize("case", [
    ("stride 2", ((3, 3), (2, 2), (1, 1), (1, 1)), (64, 64, 3, 3), np.float32),
    ("dilation", ((3, 3), (1, 1), (2, 2), (2, 2)), (64, 64, 3, 3), np.float32),
    ("1x1", ((1, 1), (1, 1), (1, 1), (0, 0)), (64, 64, 1, 1), np.float32),
    ("3-D", ((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1)), (64, 64, 3, 3, 3), np.float32),
    ("float64", ((3, 3), (1, 1), (1, 1), (1, 1)), (64, 64, 3, 3), np.float64),
    ("few channels", ((3, 3), (1, 1), (1, 1), (1, 1)), (16, 64, 3, 3), np.float32),
], ids=lambda case: case[0])
def test_does_not_apply(case: tuple) -> None:
    _, geometry, weight_shape, dtype = case
    data_shape = (8, weight_shape[1], *(28,) * (len(weight_shape) - 2))
    assert not winograd_bind.applies(data_shape, constant(weight_shape, dtype), geometry)


def test_does_not_apply_to_a_writable_weight() -> None:
    geometry = ((3, 3), (1, 1), (1, 1), (1, 1))
    assert not winograd_bind.applies((8, 64, 28, 28), np.zeros((64, 64, 3, 3), np.float32),
                                     geometry)
    assert winograd_bind.applies((8, 64, 28, 28), constant((64, 64, 3, 3)), geometry)


def test_plans_of_one_model_share_the_transformed_weights(bound: list) -> None:
    optimized, _ = load_pair(two_convs(1, False), (1, CHANNELS, 8, 8), RNG)
    optimized.activation_bytes({"data": (1, CHANNELS, 8, 8)})
    once = optimized.derived_bytes
    # U is (16, C, F) per layer: (4 → 5) and (5 → 4) channels.
    assert once == 16 * (CHANNELS * (CHANNELS + 1)) * 2 * 4
    optimized.activation_bytes({"data": (3, CHANNELS, 8, 8)})
    assert len(bound) == 4 and optimized.derived_bytes == once
    assert optimized.stats()["derived_bytes"] == once


@pytest.mark.parametrize("spatial", [(8, 8), (7, 7)], ids=["even", "odd"])
def test_the_sixteen_products_of_a_wide_layer_are_one_call_of_our_kernel(
        spatial: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.kernels import gemm_kernel

    if not gemm_kernel.available():
        pytest.skip("llvmlite cannot compile for this CPU")
    numpy_transforms(monkeypatch)
    channels = winograd_bind.MIN_CHANNELS  # 16 tiles a sample, 64 filters: whole vectors
    conv = sym.Convolution(sym.var("data"), kernel=(3, 3), pad=(1, 1), num_filter=channels,
                           name="conv")
    shape = (1, channels, *spatial)
    optimized, reference = load_pair(sym.Activation(conv, act_type="relu", name="relu"), shape,
                                     RNG)
    feed = {"data": RNG.normal(size=shape).astype(np.float32)}
    plan = optimized.plan_for(feed)
    products = [step.call for step in plan.steps
                if isinstance(step.call, gemm_kernel.Product)]
    assert len(products) == 1  # the panels of all 16 products streamed in one pass
    for _ in range(2):
        got = optimized.infer(feed)["relu_output"]
        want = reference.infer(feed)["relu_output"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        feed = {"data": RNG.normal(size=shape).astype(np.float32)}
