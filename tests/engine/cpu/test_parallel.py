"""Bound steps cut into slabs over threads (`engine.cpu.parallel`) compute what they did whole."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from engine import sym
from engine.cpu import parallel
from engine.kernels import depthwise_bind, depthwise_kernel, depthwise_vector
from tests.engine.runtime.helpers import load_pair

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def small_slabs(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(parallel, "MIN_BYTES", 1024)
    yield
    parallel.set_threads(None)


def run_both(make_call, out: np.ndarray, count: int = 3) -> tuple[np.ndarray, object]:
    """(what the whole call wrote, the split call), each run on a fresh output."""
    make_call().__call__()
    whole = out.copy()
    out[...] = np.nan
    split = parallel.split(make_call(), count)
    split()
    return whole, split


@pytest.mark.parametrize("count", [2, 3])
def test_ufunc_with_broadcast_operand(count: int) -> None:
    data = RNG.normal(size=(1, 8, 20, 20)).astype(np.float32)
    bias = RNG.normal(size=(1, 8, 1, 1)).astype(np.float32)
    out = np.empty_like(data)
    whole, split = run_both(lambda: partial(np.add, data, bias, out), out, count)
    assert isinstance(split, parallel.SplitCall) and len(split.slabs) == count
    np.testing.assert_array_equal(out, whole)


def test_strided_copy_and_in_place_ufunc() -> None:
    source = RNG.normal(size=(2, 6, 41, 41)).astype(np.float32)[:, :, ::2, ::2]
    out = np.empty((2, 6, 21, 21), np.float32)
    whole, split = run_both(lambda: partial(np.copyto, out, source), out)
    assert isinstance(split, parallel.SplitCall)
    np.testing.assert_array_equal(out, whole)
    expected = np.maximum(out, 0.5)
    in_place = parallel.split(partial(np.maximum, out, 0.5, out=out), 2)
    assert isinstance(in_place, parallel.SplitCall)  # the same view in and out: element-wise
    in_place()
    np.testing.assert_array_equal(out, expected)


def test_stacked_matmul_cut_only_on_stacking_axes() -> None:
    left = RNG.normal(size=(1, 12, 1, 9)).astype(np.float32)
    right = RNG.normal(size=(1, 12, 9, 50)).astype(np.float32)
    out = np.empty((1, 12, 1, 50), np.float32)
    whole, split = run_both(lambda: partial(np.matmul, left, right, out), out, 2)
    assert isinstance(split, parallel.SplitCall)
    assert split.slabs[0].keywords["out"].shape == (1, 6, 1, 50)
    np.testing.assert_allclose(out, whole, rtol=1e-6)
    matrix = RNG.normal(size=(64, 64)).astype(np.float32)
    square = np.empty((64, 64), np.float32)
    call = partial(np.matmul, matrix, matrix, square)
    assert parallel.split(call, 2) is call  # a plain GEMM is BLAS's to thread


def test_calls_left_whole() -> None:
    buffer = RNG.normal(size=(4, 64, 64)).astype(np.float32)
    shifted = partial(np.copyto, buffer[:, 1:], buffer[:, :-1])
    assert parallel.split(shifted, 2) is shifted  # one slab would read what another writes
    small = partial(np.add, buffer[0, :4, :4], 1.0, buffer[0, :4, :4])
    assert parallel.split(small, 2) is small
    other = partial(np.sort, buffer)
    assert parallel.split(other, 2) is other
    flat = partial(np.add, buffer, 1.0, buffer)
    assert parallel.split(flat, 1) is flat
    with pytest.raises(ValueError, match="at least 1"):
        parallel.set_threads(0)


def test_plan_with_split_steps_matches_reference() -> None:
    data = sym.var("data")
    net = sym.Convolution(data, kernel=(3, 3), pad=(1, 1), num_filter=8, name="conv")
    net = sym.clip(net, a_min=0, a_max=6)
    net = sym.Convolution(net, kernel=(3, 3), pad=(1, 1), num_filter=8, num_group=8,
                          name="dw")
    net = sym.clip(net, a_min=0, a_max=6, name="out")
    parallel.set_threads(2)
    shape = (2, 4, 24, 24)
    optimized, reference = load_pair(net, shape, RNG)
    x = RNG.normal(scale=3, size=shape).astype(np.float32)
    plan = optimized.plan_for({"data": x})
    assert any(isinstance(step.call, parallel.SplitCall) for step in plan.steps)
    for _ in range(2):
        np.testing.assert_allclose(optimized.infer({"data": x})["out_output"],
                                   reference.infer({"data": x})["out_output"],
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch", [1, 2, 5])
@pytest.mark.parametrize("geometry", [((3, 3), (1, 1), (1, 1)), ((3, 3), (2, 2), (1, 1)),
                                      ((5, 5), (1, 1), (2, 2))], ids=str)
def test_depthwise_kernels_cut_into_planes(batch: int, geometry: tuple,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # Every 2-D kernel: the 3x3 one reading the input, the per-plane phase grids (each slab
    # needs a grid of its own), the whole-layer phases; whole samples or one sample's channels.
    monkeypatch.setattr(depthwise_bind, "PLANE_CELLS", 0)
    monkeypatch.setattr(depthwise_kernel, "SLAB_MIN_BYTES", 0)
    # numba's kernels (these slabs are theirs), not the vector kernel the 3x3 ones would take
    monkeypatch.setattr(depthwise_vector, "applies", lambda *arguments: False)
    kernel, stride, pad = geometry
    data = sym.var("data")
    net = sym.Convolution(data, kernel=kernel, stride=stride, pad=pad, num_filter=7,
                          num_group=7, name="dw")
    net = sym.clip(net, a_min=0, a_max=6, name="relu6")
    shape = (batch, 7, 12, 11)
    parallel.set_threads(3)
    optimized, reference = load_pair(net, shape, RNG)
    plan = optimized.plan_for({"data": np.zeros(shape, np.float32)})
    split = [step.call for step in plan.steps if isinstance(step.call, parallel.SplitCall)
             and isinstance(step.call.whole, depthwise_kernel.DepthwiseCall)]
    assert len(split) == 1 and len(split[0].slabs) == (min(3, batch) if batch > 1 else 3)
    for _ in range(2):
        x = RNG.normal(scale=3, size=shape).astype(np.float32)
        np.testing.assert_allclose(optimized.infer({"data": x})["relu6_output"],
                                   reference.infer({"data": x})["relu6_output"],
                                   rtol=1e-4, atol=1e-4)
