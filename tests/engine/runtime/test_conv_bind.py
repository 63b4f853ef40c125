"""Convolutions bound into plans (`engine.ops.conv_bind`) agree with the reference kernel."""

from __future__ import annotations

import numpy as np
import pytest

from engine import sym
from engine.ops import conv_bind
from tests.engine.runtime.helpers import load_pair, run_allocation

RNG = np.random.default_rng(3)

# (kernel, stride, pad, dilate): 2-D, 1-D and 3-D; strided 1x1 and 7x7 stems; dilation.
GEOMETRIES = [
    ((3, 3), (1, 1), (1, 1), (1, 1)),
    ((7, 7), (2, 2), (3, 3), (1, 1)),
    ((1, 1), (2, 2), (0, 0), (1, 1)),
    ((1, 1), (1, 1), (0, 0), (1, 1)),
    ((3, 3), (1, 1), (2, 2), (2, 2)),
    ((3, 2), (2, 1), (0, 1), (1, 1)),
    ((3,), (1,), (1,), (1,)),
    ((3, 3, 3), (1, 2, 1), (1, 1, 1), (1, 1, 1)),
]


def two_convs(kernel: tuple, stride: tuple, pad: tuple, dilate: tuple, no_bias: bool):
    """Two convolutions in a row (they share the plan's scratch) with a ReLU epilogue."""
    data = sym.var("data")
    first = sym.Convolution(data, kernel=kernel, stride=stride, pad=pad, dilate=dilate,
                            num_filter=5, no_bias=no_bias, name="first")
    second = sym.Convolution(sym.Activation(first, act_type="relu"), kernel=kernel, pad=pad,
                             dilate=dilate, num_filter=4, name="second")
    return second


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("no_bias", [False, True])
def test_bound_convolution_matches_reference(geometry: tuple, batch: int, no_bias: bool) -> None:
    kernel = geometry[0]
    spatial = {1: (11,), 2: (12, 10), 3: (7, 6, 5)}[len(kernel)]
    shape = (batch, 3, *spatial)
    optimized, reference = load_pair(two_convs(*geometry, no_bias), shape, RNG)
    for _ in range(2):  # a second run: the padding left in the workspace must still be zero
        x = RNG.normal(size=shape).astype(np.float32)
        got = optimized.infer({"data": x})["second_output"]
        want = reference.infer({"data": x})["second_output"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_samples_in_several_chunks_with_a_remainder(monkeypatch: pytest.MonkeyPatch) -> None:
    # 3 x (3*9) x (12*10) floats is ~13 KB of patches per sample: 30 KB takes two samples at
    # a time, so a batch of 5 runs as chunks of 2, 2 and 1.
    monkeypatch.setattr(conv_bind, "PATCH_BYTES", 30_000)
    optimized, reference = load_pair(two_convs((3, 3), (1, 1), (1, 1), (1, 1), False),
                                     (5, 3, 12, 10), RNG)
    x = RNG.normal(size=(5, 3, 12, 10)).astype(np.float32)
    np.testing.assert_allclose(optimized.infer({"data": x})["second_output"],
                               reference.infer({"data": x})["second_output"],
                               rtol=1e-4, atol=1e-4)
    plan = optimized.plan_for({"data": x})
    assert plan.workspace.scratch.nbytes < 60_000  # sized for a chunk, not the whole batch


def test_bound_convolutions_allocate_nothing_per_run() -> None:
    optimized, _ = load_pair(two_convs((3, 3), (1, 1), (1, 1), (1, 1), False), (2, 3, 64, 64),
                             RNG)
    feed = {"data": RNG.normal(size=(2, 3, 64, 64)).astype(np.float32)}
    plan = optimized.plan_for(feed)
    peak, _ = run_allocation(plan, feed, 10)
    # The smallest padded input is 2*3*66*66*4 = 105 KB and a patch array 2*45*4096*4 = 1.5 MB:
    # a run building either afresh would show here. What a run may use is numpy's bounded
    # ufunc buffer for the broadcast bias add (8192 elements) and small objects.
    assert peak < 48 * 1024, f"a run allocated up to {peak} bytes"
