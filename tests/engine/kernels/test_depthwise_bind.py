"""Depthwise convolutions bound into plans (`engine.kernels.depthwise_bind`) agree with the
kernel."""

from __future__ import annotations

import numpy as np
import pytest

from engine import sym
from engine.kernels import depthwise_bind, depthwise_kernel, depthwise_vector
from engine.ops.nn import conv
from tests.engine.runtime.helpers import load_pair, run_allocation, step_funcs

RNG = np.random.default_rng(5)
CHANNELS = 6

# (kernel, stride, pad, dilate): MobileNet's 3x3 stride 1 and 2, 5x5, dilation, odd strides,
# an unpadded kernel wider than tall, 1-D and 3-D.
GEOMETRIES = [
    ((3, 3), (1, 1), (1, 1), (1, 1)),
    ((3, 3), (2, 2), (1, 1), (1, 1)),
    ((5, 5), (1, 1), (2, 2), (1, 1)),
    ((3, 3), (1, 1), (2, 2), (2, 2)),
    ((3, 3), (2, 2), (2, 2), (2, 2)),
    ((2, 4), (3, 2), (0, 0), (1, 1)),
    ((3, 3), (2, 1), (1, 1), (1, 1)),
    ((3, 3), (1, 3), (1, 2), (1, 2)),
    ((3,), (2,), (1,), (1,)),
    ((3, 3, 3), (1, 2, 1), (1, 1, 1), (1, 1, 1)),
]


def depthwise_block(kernel: tuple, stride: tuple, pad: tuple, dilate: tuple, no_bias: bool,
                    multiplier: int = 1):
    """Two depthwise convolutions (sharing the plan's scratch), each with a ReLU6 (clip)."""
    data = sym.var("data")
    first = sym.Convolution(data, kernel=kernel, stride=stride, pad=pad, dilate=dilate,
                            num_filter=CHANNELS * multiplier, num_group=CHANNELS,
                            no_bias=no_bias, name="first")
    first = sym.clip(first, a_min=0, a_max=6)
    second = sym.Convolution(first, kernel=kernel, pad=pad, dilate=dilate,
                             num_filter=CHANNELS * multiplier, num_group=CHANNELS * multiplier,
                             name="second")
    return sym.clip(second, a_min=0, a_max=6, name="relu6")


def assert_same_runs(optimized, reference, shape: tuple) -> None:
    for _ in range(2):  # a second run: the padding left in the workspace must still be zero
        x = RNG.normal(scale=3, size=shape).astype(np.float32)
        got = optimized.infer({"data": x})["relu6_output"]
        want = reference.infer({"data": x})["relu6_output"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def calls_reference_kernel(plan) -> bool:
    return conv._convolution in step_funcs(plan)


def calls_compiled_kernel(plan) -> bool:
    funcs = step_funcs(plan)
    return any(kernel in funcs for kernel in (depthwise_kernel.depthwise_rows,
                                              depthwise_kernel.depthwise_planes,
                                              depthwise_kernel.depthwise_same_3x3,
                                              depthwise_vector.depthwise_3x3))


def calls_vector_kernel(plan) -> bool:
    return depthwise_vector.depthwise_3x3 in step_funcs(plan)


def without_vector_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """numba's kernels for the layers the vector kernel would take (these tests are theirs)."""
    monkeypatch.setattr(depthwise_vector, "applies", lambda *arguments: False)


def calls_same_kernel(plan) -> bool:
    return depthwise_kernel.depthwise_same_3x3 in step_funcs(plan)


def calls_planes_kernel(plan) -> bool:
    return depthwise_kernel.depthwise_planes in step_funcs(plan)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("no_bias", [False, True])
@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "numpy"])
def test_bound_depthwise_matches_reference(geometry: tuple, batch: int, no_bias: bool,
                                           compiled: bool,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    if not compiled:  # NumPy's binding: neither numba's kernels nor the vector kernel
        monkeypatch.setattr("engine.cpu.compiled.available", lambda: False)
        without_vector_kernel(monkeypatch)
    spatial = {1: (13,), 2: (12, 11), 3: (7, 6, 5)}[len(geometry[0])]
    shape = (batch, CHANNELS, *spatial)
    optimized, reference = load_pair(depthwise_block(*geometry, no_bias), shape, RNG)
    plan = optimized.plan_for({"data": np.zeros(shape, np.float32)})
    assert not calls_reference_kernel(plan)
    # The compiled kernel takes the 2-D ones (numba is a dependency); 1-D and 3-D stay NumPy.
    assert calls_compiled_kernel(plan) == (compiled and len(geometry[0]) == 2)
    assert_same_runs(optimized, reference, shape)


@pytest.mark.parametrize("geometry", [g for g in GEOMETRIES if len(g[0]) == 2], ids=str)
@pytest.mark.parametrize("spatial", [(12, 11), (9, 14)])
def test_kernel_reading_the_input_matches_reference(geometry: tuple, spatial: tuple,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Every size takes the per-plane kernel here (it only takes large strided planes by
    # default): each stride across (1, 2, 3) has its own copy loop, odd and even widths.
    monkeypatch.setattr(depthwise_bind, "PLANE_CELLS", 0)
    without_vector_kernel(monkeypatch)
    shape = (2, CHANNELS, *spatial)
    optimized, reference = load_pair(depthwise_block(*geometry, False), shape, RNG)
    plan = optimized.plan_for({"data": np.zeros(shape, np.float32)})
    # The first convolution is strided where the geometry is; the second never is.
    assert calls_planes_kernel(plan) == (max(geometry[1]) > 1)
    assert_same_runs(optimized, reference, shape)


@pytest.mark.parametrize("spatial", [(12, 11), (7, 7), (3, 3), (2, 5), (1, 4), (6, 1), (4, 3),
                                     (5, 2)])
def test_same_3x3_kernel_matches_reference(spatial: tuple,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # Every size takes the 3x3 stride-1 kernel: its inside run, its top/bottom rows and
    # corners, and planes too small to have an inside.
    without_vector_kernel(monkeypatch)
    shape = (2, CHANNELS, *spatial)
    optimized, reference = load_pair(depthwise_block((3, 3), (1, 1), (1, 1), (1, 1), False),
                                     shape, RNG)
    assert calls_same_kernel(optimized.plan_for({"data": np.zeros(shape, np.float32)}))
    assert_same_runs(optimized, reference, shape)
    height, width = spatial
    # A corner reaches the top row, the first column and the inside; NaNs in the first and
    # last columns of an inside row must not reach across the row's end to the row beside.
    for y, x in ((0, 0), (height // 2, 0), (height // 2, width - 1)):
        data = RNG.normal(scale=3, size=shape).astype(np.float32)
        data[1, 2, y, x] = np.nan
        got = optimized.infer({"data": data})["relu6_output"]
        want = reference.infer({"data": data})["relu6_output"]
        assert np.isnan(want).any()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_large_planes_take_the_kernels_reading_the_input(
        monkeypatch: pytest.MonkeyPatch) -> None:
    without_vector_kernel(monkeypatch)  # (a host without AVX-512)
    shape = (1, CHANNELS, 120, 120)
    block = depthwise_block((3, 3), (1, 1), (1, 1), (1, 1), False)
    optimized, reference = load_pair(block, shape, RNG)
    assert calls_same_kernel(optimized.plan_for({"data": np.zeros(shape, np.float32)}))
    assert_same_runs(optimized, reference, shape)


@pytest.mark.parametrize(("size", "planes"), [(56, True), (55, False)])
def test_large_strided_planes_take_the_kernel_reading_the_input(
        size: int, planes: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    without_vector_kernel(monkeypatch)
    shape = (1, CHANNELS, size, size)
    block = depthwise_block((3, 3), (2, 2), (1, 1), (1, 1), False)
    optimized, reference = load_pair(block, shape, RNG)
    plan = optimized.plan_for({"data": np.zeros(shape, np.float32)})
    assert calls_planes_kernel(plan) == planes
    assert calls_compiled_kernel(plan)
    assert_same_runs(optimized, reference, shape)


@pytest.mark.skipif(depthwise_vector._task(1) is None, reason="no vector kernel on this host")
@pytest.mark.parametrize(("stride", "size", "vector"), [
    (2, 112, True), (2, 7, True), (1, 55, True), (1, 56, True), (1, 1, True), (1, 64, True)])
def test_vector_kernel_takes_strided_and_smaller_planes(stride: int, size: int,
                                                        vector: bool) -> None:
    # Stride 2 at every size, stride 1 too, 56 wide among them (3.5 vectors a row, which
    # numba's kernel had read as a flat run); the block's second convolution is stride 1 on
    # the first's output (112 → 56).
    shape = (1, CHANNELS, size, size)
    block = depthwise_block((3, 3), (stride, stride), (1, 1), (1, 1), False)
    optimized, reference = load_pair(block, shape, RNG)
    plan = optimized.plan_for({"data": np.zeros(shape, np.float32)})
    assert calls_vector_kernel(plan) == vector
    assert calls_compiled_kernel(plan)
    assert_same_runs(optimized, reference, shape)


def test_channels_in_several_blocks_with_even_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    # One channel of a 12x11 map, 3x3 stride 1 pad 1, needs (9 taps + 1 result) rows of
    # 11*13 + 11 = 154 floats, 6.2 KB: 6 KB takes one channel at a time, 14 KB two.
    monkeypatch.setattr("engine.cpu.compiled.available", lambda: False)  # blocks are NumPy's
    for budget in (6_000, 14_000):
        monkeypatch.setattr(depthwise_bind, "BLOCK_BYTES", budget)
        block = depthwise_block((3, 3), (1, 1), (1, 1), (1, 1), False)
        optimized, reference = load_pair(block, (1, CHANNELS, 12, 11), RNG)
        assert_same_runs(optimized, reference, (1, CHANNELS, 12, 11))


def test_channel_multiplier_falls_back_to_the_kernel() -> None:
    shape = (2, CHANNELS, 9, 8)
    optimized, reference = load_pair(
        depthwise_block((3, 3), (1, 1), (1, 1), (1, 1), False, multiplier=2), shape, RNG)
    assert calls_reference_kernel(optimized.plan_for({"data": np.zeros(shape, np.float32)}))
    assert_same_runs(optimized, reference, shape)


def test_bound_depthwise_allocates_nothing_per_run() -> None:
    shape = (2, CHANNELS, 64, 64)
    optimized, _ = load_pair(depthwise_block((3, 3), (2, 2), (1, 1), (1, 1), False), shape, RNG)
    feed = {"data": RNG.normal(size=shape).astype(np.float32)}
    plan = optimized.plan_for(feed)
    peak, _ = run_allocation(plan, feed, 10)
    # The padded input is 2*6*66*66*4 = 209 KB and the reference kernel's per-tap temporary
    # 2*6*32*32*4 = 49 KB: a run building either afresh would show here. What a run may use is
    # numpy's bounded ufunc buffer for broadcasts (8192 elements) and small objects.
    assert peak < 48 * 1024, f"a run allocated up to {peak} bytes"


def test_compiled_kernel_absorbs_the_clip_and_keeps_nan() -> None:
    shape = (2, CHANNELS, 10, 9)
    optimized, reference = load_pair(depthwise_block((3, 3), (2, 2), (1, 1), (1, 1), False),
                                     shape, RNG)
    plan = optimized.plan_for({"data": np.zeros(shape, np.float32)})
    assert calls_compiled_kernel(plan)
    # Both ReLU6 steps run inside the kernel: no clip call is left in the plan.
    assert np.clip not in step_funcs(plan)
    assert not any("clip" in getattr(func, "__name__", "") for func in step_funcs(plan))
    x = RNG.normal(scale=3, size=shape).astype(np.float32)
    x[0, 1, 4, 4] = np.nan
    got = optimized.infer({"data": x})["relu6_output"]
    want = reference.infer({"data": x})["relu6_output"]
    assert np.isnan(want).any()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # NaN where the reference has
