"""A downsampling block's shortcut 1×1 product merged into the product adding its output
(`engine.kernels.gemm_amx_shortcut`): in a bf16 plan at batch 1, the shortcut's step lays
its activation's words and the block's last 1×1 product runs over both K; the outputs are
the unmerged plan's up to float32 rounding, near fp32's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import engine
from bench import nets
from engine import sym
from engine.kernels import bf16_handoff, gemm_amx_shortcut, gemm_kernel, jobs
from engine.kernels.workspace import Workspace
from tests.engine.kernels.test_bf16_handoff import steps_on, watch_asks

pytestmark = pytest.mark.skipif(not gemm_kernel.available(gemm_kernel.AMX),
                                reason="needs AMX")


def downsampling(stride: int, channels: int, mid: int, filters: int,
                 shared: bool = False, clamped: bool = False) -> Any:
    """A ResNet v2 downsampling block: a pre-activation (BatchNorm and ReLU after a sum, so
    that nothing folds it away), a 1×1, a 3×3 of ``stride``, a last 1×1 adding a 1×1
    shortcut of ``stride``; ``shared``: the shortcut's output read once more (a second sum
    with it), which no merged product can spare; ``clamped``: a ReLU after the sum."""
    pre = sym.Activation(sym.BatchNorm(sym.var("data") + 1, fix_gamma=False, eps=2e-5,
                                       name="bn"), act_type="relu")
    body = sym.Activation(sym.Convolution(pre, num_filter=mid, kernel=(1, 1), no_bias=True,
                                          name="conv1"), act_type="relu")
    body = sym.Activation(sym.Convolution(body, num_filter=mid, kernel=(3, 3), pad=(1, 1),
                                          stride=(stride, stride), no_bias=True, name="conv2"),
                          act_type="relu")
    body = sym.Convolution(body, num_filter=filters, kernel=(1, 1), no_bias=True, name="conv3")
    shortcut = sym.Convolution(pre, num_filter=filters, kernel=(1, 1), stride=(stride, stride),
                               no_bias=True, name="down")
    net = body + shortcut
    if clamped:
        net = sym.Activation(net, act_type="relu")
    return net + shortcut if shared else net


def served(symbol: Any, params: dict, feed: dict, precision: str = "bf16",
           merged: bool = True) -> tuple[np.ndarray, list]:
    """The plan's output (run twice, the same both times) and its shortcut steps;
    ``merged``: whether the product adding a shortcut may take it in."""
    merge = gemm_amx_shortcut.merge
    if not merged:
        gemm_amx_shortcut.merge = lambda *args: None
    try:
        model = engine.load_model(symbol, params, optimize=True, precision=precision)
        first = np.asarray(next(iter(model.infer(feed).values()))).copy()
        second = np.asarray(next(iter(model.infer(feed).values())))
        plan = model.plan_for(feed)
    finally:
        gemm_amx_shortcut.merge = merge
    np.testing.assert_array_equal(first, second)
    shortcuts = [jobs.source(step.call) for step in plan.steps
                 if isinstance(jobs.source(step.call), gemm_amx_shortcut.ShortcutStep)]
    return first, shortcuts


def never_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hand-offs bound from now on never taken: every writer writes its float32 array."""
    monkeypatch.setattr(bf16_handoff.PairedHandoff, "note",
                        lambda handoff: setattr(handoff, "taken", False))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("taken", [True, False])
@pytest.mark.parametrize("stride,mid", [(1, 64), (2, 64), (2, 256)])
def test_a_downsampling_blocks_shortcut_runs_inside_the_product_adding_it(
        monkeypatch: pytest.MonkeyPatch, threads: int, taken: bool, stride: int,
        mid: int) -> None:
    """The shortcut's step lays its words (copied out of the pre-activation's where those
    were laid, else paired) and the last product runs over both K: the outputs are the
    unmerged plan's to float32 rounding, at one thread and at two, with the hand-offs taken
    or not. Where the 3×3 is too deep to hand its output over (``mid`` 256), the product
    pairs its own half into the merged words, never cut into parts that would each pair
    that half alone."""
    symbol = downsampling(stride, 128, mid, 256)
    params = nets.random_params(symbol, (1, 128, 8, 8), seed=6)
    feed = {"data": np.random.default_rng(2).standard_normal((1, 128, 8, 8)).astype(
        np.float32)}
    if not taken:
        never_taken(monkeypatch)
    with steps_on(threads):
        got, shortcuts = served(symbol, params, feed)
        assert len(shortcuts) == 1 and shortcuts[0].merged
        assert shortcuts[0].handoff is not None and shortcuts[0].handoff.laid is taken
        unmerged, kept = served(symbol, params, feed, merged=False)
        assert len(kept) == 1 and not kept[0].merged
    assert np.abs(got - unmerged).max() <= 1e-5 * np.abs(unmerged).max()
    want, _ = served(symbol, params, feed, "fp32")
    assert np.abs(got - want).max() <= 0.03 * np.abs(want).max()


@pytest.mark.parametrize("stride", [1, 2])
def test_a_merged_product_clamps_after_the_sum(stride: int) -> None:
    """A ReLU after the block's sum is the merged product's clamp, applied to the sum of
    both halves, and its sum is still written on every run."""
    symbol = downsampling(stride, 64, 32, 128, clamped=True)
    params = nets.random_params(symbol, (1, 64, 8, 8), seed=7)
    feed = {"data": np.random.default_rng(3).standard_normal((1, 64, 8, 8)).astype(
        np.float32)}
    got, shortcuts = served(symbol, params, feed)
    assert len(shortcuts) == 1 and shortcuts[0].merged
    assert got.min() == 0 and got.max() > 0
    unmerged, _ = served(symbol, params, feed, merged=False)
    assert np.abs(got - unmerged).max() <= 1e-5 * np.abs(unmerged).max()
    want, _ = served(symbol, params, feed, "fp32")
    assert np.abs(got - want).max() <= 0.03 * np.abs(want).max()


def test_a_shortcut_read_twice_is_not_offered() -> None:
    """A shortcut whose output something else reads too writes it: no step offered."""
    symbol = downsampling(2, 64, 32, 128, shared=True)
    params = nets.random_params(symbol, (1, 64, 8, 8), seed=6)
    feed = {"data": np.random.default_rng(2).standard_normal((1, 64, 8, 8)).astype(
        np.float32)}
    got, shortcuts = served(symbol, params, feed)
    assert shortcuts == []
    want, _ = served(symbol, params, feed, "fp32")
    assert np.abs(got - want).max() <= 0.03 * np.abs(want).max()


@pytest.mark.parametrize("threads", [1, 2])
def test_resnet50_v2_merges_its_four_downsampling_shortcuts(monkeypatch: pytest.MonkeyPatch,
                                                            threads: int) -> None:
    """ResNet-50 v2 (64 × 64) in bf16: each stage's first block runs its shortcut inside
    its last 1×1 product (4), which writes its float32 sum on every run and, over twice
    the K, is not asked for the next pre-activation's words (the others still are: 4); the
    outputs those of the unmerged plan to float32 rounding and near fp32's."""
    symbol = nets.resnet50_v2(classes=10)
    params = nets.random_params(symbol, (1, 3, 64, 64), seed=5)
    feed = {"data": np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(
        np.float32)}
    with steps_on(threads):
        granted = watch_asks(monkeypatch)
        got, shortcuts = served(symbol, params, feed)
        assert len(shortcuts) == 4 and all(shortcut.merged for shortcut in shortcuts)
        assert [shortcut.stride for shortcut in shortcuts] == [(1, 1), *[(2, 2)] * 3]
        requests = [request for request in granted if request is not None]
        assert len(requests) == 4 and all(request.written for request in requests)
        assert [request.sum_read for request in requests] == [True, False, False, False]
        unmerged, _ = served(symbol, params, feed, merged=False)
    assert np.abs(got - unmerged).max() <= 1e-3 * np.abs(unmerged).max()
    want, _ = served(symbol, params, feed, "fp32")
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()
    assert got.argmax() == want.argmax()


def test_words_for_places_the_first_readers_words_where_it_asks() -> None:
    """A reader may say where the words go (rows of its merged buffer): the first such
    place is the hand-off's, and a later reader asking for another gets none."""
    workspace = Workspace(np, 0, precision="bf16")
    handoff = bf16_handoff.PairedHandoff(2, (32, 64), (64, 0), (1, 64, 8, 8))
    merged = np.zeros((96, 64), np.float32)
    assert bf16_handoff.words_for(handoff, (32, 64), workspace, into=merged[:32]) is not None
    assert handoff.words.ctypes.data == merged.ctypes.data and handoff.layout == "words"
    assert bf16_handoff.words_for(handoff, (32, 64), workspace, into=merged[32:64]) is None
    assert bf16_handoff.words_for(handoff, (32, 64), workspace) is handoff.words
    assert bf16_handoff.words_for(bf16_handoff.PairedHandoff(1, (32, 64), (64, 1)), (32, 64),
                                  workspace, into=merged[:16]) is None
