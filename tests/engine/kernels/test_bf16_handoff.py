"""The bf16 hand-off (`engine.kernels.bf16_handoff`): in a bf16 plan on AMX, a depthwise layer
at batch 1 writes the bf16 pairs its 1×1 readers' products take, no pairing pass between,
where every reader takes them, and the float32 planes otherwise; the outputs are the plan's
without a hand-off, bit for bit."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import engine
from bench import nets
from engine import sym
from engine.cpu import parallel
from engine.kernels import (
    bf16,
    bf16_handoff,
    depthwise_vector,
    gemm_amx_handoff,
    gemm_bind,
    gemm_kernel,
    gemm_preact,
    gemm_tile_handoff,
)
from engine.kernels.workspace import Reader, Workspace

pytestmark = pytest.mark.skipif(
    not gemm_kernel.available(gemm_kernel.AMX) or depthwise_vector._task(1) is None,
    reason="needs AMX and the vector depthwise kernel")


def block(data: Any, readers: str, stride: int) -> Any:
    """An expand 1×1, a depthwise 3×3 with relu6, and its readers: ``one`` 1×1 projection,
    ``two`` of them summed, or a projection and a pooling (which cannot take the pairs)."""
    expand = sym.clip(sym.Convolution(data, num_filter=64, kernel=(1, 1), name="expand"),
                      a_min=0.0, a_max=6.0)
    depthwise = sym.clip(sym.Convolution(expand, num_filter=64, num_group=64, kernel=(3, 3),
                                         stride=(stride, stride), pad=(1, 1), name="dw"),
                         a_min=0.0, a_max=6.0)
    project = sym.Convolution(depthwise, num_filter=32, kernel=(1, 1), name="project")
    if readers == "one":
        return project
    if readers == "two":
        return project + sym.Convolution(depthwise, num_filter=32, kernel=(1, 1), name="side")
    pooled = sym.Pooling(depthwise, kernel=(1, 1), global_pool=True, pool_type="avg")
    return sym.broadcast_add(project, sym.Convolution(pooled, num_filter=32, kernel=(1, 1),
                                                      name="side"))


def image(side: int) -> np.ndarray:
    """One random 3-channel ``side``² image, the same every call."""
    return np.random.default_rng(0).standard_normal((1, 3, side, side)).astype(np.float32)


@contextmanager
def steps_on(threads: int) -> Iterator[None]:
    """Plans bound inside run their steps on ``threads`` threads."""
    before = parallel.threads()
    parallel.set_threads(threads)
    try:
        yield
    finally:
        parallel.set_threads(before)


def served(symbol: Any, params: dict, feed: dict, precision: str,
           handoffs: list | None = None, halves: bool = False) -> np.ndarray:
    """The plan's output, twice run; ``handoffs`` collects what the writers offered (None:
    no writer offers one); ``halves``: whether a 1×1 product may offer its output in bf16
    (on AMX, `gemm_amx_handoff`; on a register tile, `gemm_tile_handoff`: as planes, its
    depthwise reader's sums are then over rounded values, not the float32 plan's bit for
    bit; as a grid, bit for bit)."""
    offer, lay_bf16, lay_tile = (bf16_handoff.offer, gemm_amx_handoff.lay_bf16,
                                   gemm_tile_handoff.lay_bf16)

    def watched(workspace: Any, array: Any, grids: Any = False, columns: bool = True,
                planes: bool = False, planes_in_place: bool = False,
                bf16_tile: bool = False) -> Any:
        if handoffs is None:
            return None
        handoff = offer(workspace, array, grids, columns, planes, planes_in_place, bf16_tile)
        handoffs.append(handoff)
        return handoff

    bf16_handoff.offer = watched
    if not halves:
        gemm_amx_handoff.lay_bf16 = lambda calls, out, workspace: calls
        gemm_tile_handoff.lay_bf16 = lambda calls, out, workspace: calls
    try:
        model = engine.load_model(symbol, params, optimize=True, precision=precision)
        first = np.asarray(next(iter(model.infer(feed).values()))).copy()
        second = np.asarray(next(iter(model.infer(feed).values())))
    finally:
        bf16_handoff.offer, gemm_amx_handoff.lay_bf16 = offer, lay_bf16
        gemm_tile_handoff.lay_bf16 = lay_tile
    np.testing.assert_array_equal(first, second)
    return first


def never_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hand-offs bound from now on never taken, as if a reader had not taken them."""
    monkeypatch.setattr(bf16_handoff.PairedHandoff, "note",
                        lambda handoff: setattr(handoff, "taken", False))


def assert_one_handoff(symbol: Any, params: dict, feed: dict, taken: bool,
                       laid: bool | None = None) -> None:
    """The bf16 plan's first writer offers a hand-off, taken or not as ``taken`` says and
    laid as ``laid`` does (as taken where not given), no later one laid (a direct 3×3
    convolution read by a sum offers one too), and answers bit for bit what the same plan
    answers pairing its float32 arrays, near fp32."""
    handoffs: list = []
    got = served(symbol, params, feed, "bf16", handoffs)
    offered = [handoff for handoff in handoffs if handoff is not None]
    assert offered
    assert offered[0].taken is taken and offered[0].laid is (taken if laid is None else laid)
    assert not any(handoff.laid for handoff in offered[1:])
    np.testing.assert_array_equal(got, served(symbol, params, feed, "bf16"))
    want = served(symbol, params, feed, "fp32")
    assert np.abs(got - want).max() <= 0.03 * np.abs(want).max()


@pytest.mark.parametrize("readers,taken", [("one", True), ("two", True), ("pooled", False)])
@pytest.mark.parametrize("stride", [1, 2])
def test_the_depthwise_layer_hands_its_readers_their_pairs(readers: str, taken: bool,
                                                           stride: int) -> None:
    data = sym.var("data")
    symbol = block(data, readers, stride)
    params = nets.random_params(symbol, (1, 24, 14, 14), seed=4)
    feed = {"data": np.random.default_rng(2).standard_normal((1, 24, 14, 14)).astype(
        np.float32)}
    assert_one_handoff(symbol, params, feed, taken)


def test_a_batch_of_two_is_offered_none() -> None:
    symbol = block(sym.var("data"), "one", 1)
    params = nets.random_params(symbol, (2, 24, 14, 14), seed=4)
    feed = {"data": np.random.default_rng(2).standard_normal((2, 24, 14, 14)).astype(
        np.float32)}
    handoffs: list = []
    served(symbol, params, feed, "bf16", handoffs)
    assert handoffs and all(handoff is None for handoff in handoffs)


def test_writers_share_a_buffer_only_once_its_last_readers_are_bound() -> None:
    """Steps bind in the order they run: a writer reserves the words of a hand-off whose
    readers all took theirs (they run before it), never those of one still waiting for a
    reader, nor words of another shape or K."""
    workspace = Workspace(np, 0, precision="bf16")
    arrays = [np.zeros((1, 40, 7, 7), np.float32) for _ in range(3)]
    arrays += [np.zeros((1, 40, 14, 14), np.float32), np.zeros((1, 39, 7, 7), np.float32)]
    for array in arrays:
        workspace.note_readers(array, (Reader("Convolution", None, 0),))
    first, second = (bf16_handoff.offer(workspace, array) for array in arrays[:2])
    assert (first.slot, second.slot) == ((40, 0), (40, 1))  # the first's reader is unbound
    words = bf16_handoff.words_for(first, first.shape, workspace)
    assert bf16_handoff.words_for(first, (first.shape[0], 32), workspace) is None
    bf16_handoff.take(first, lambda: None)
    third, larger, fewer = (bf16_handoff.offer(workspace, array) for array in arrays[2:])
    assert third.slot == larger.slot == (40, 0) and larger.shape != third.shape
    # 39 channels: the same words' shape, but the high halves past K must stay zero
    assert fewer.shape == third.shape and fewer.slot == (39, 0)
    assert bf16_handoff.words_for(third, third.shape, workspace) is words
    for other in (second, fewer):
        assert bf16_handoff.words_for(other, other.shape, workspace) is not words


def test_a_plan_output_or_an_fp32_plan_is_offered_none() -> None:
    array = np.zeros((1, 40, 7, 7), np.float32)
    fp32 = Workspace(np, 0)
    fp32.note_readers(array, (Reader("Convolution", None, 0),))
    assert bf16_handoff.offer(fp32, array) is None
    workspace = Workspace(np, 0, precision="bf16")
    workspace.note_readers(array, (Reader("Convolution", None, 0), Reader(None, None, 0)))
    assert bf16_handoff.offer(workspace, array) is None


def test_mobilenet_v2_hands_its_depthwise_outputs_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """MobileNet v2 (96 × 96) in bf16: every depthwise layer hands its readers their pairs
    (the first one's, K 32 and 16 filters, goes to AMX for them), the outputs those of the
    same plan whose readers pair the float32 planes, bit for bit, and near fp32's."""
    symbol = nets.mobilenet_v2()
    params = nets.random_params(symbol, (1, 3, 96, 96))
    feed = {"data": image(96)}
    handoffs: list = []
    got = served(symbol, params, feed, "bf16", handoffs)
    offered = [handoff for handoff in handoffs if handoff is not None]
    assert len(offered) == 17 and all(handoff.laid for handoff in offered)
    # the same products, each pairing the float32 planes as if a reader had not taken them
    never_taken(monkeypatch)
    np.testing.assert_array_equal(got, served(symbol, params, feed, "bf16", []))
    want = served(symbol, params, feed, "fp32")
    assert np.abs(got - want).max() <= 0.1 * np.abs(want).max()


def test_a_handed_over_activation_takes_amx_from_k_32() -> None:
    """With its activation's pairs handed over, a thin product pays on AMX from K 32 (its
    pairing pass is what kept it float32)."""
    workspace = Workspace(np, 0, precision="bf16")
    assert gemm_bind.bf16_kernel(workspace, 16, 32) is None
    assert gemm_bind.bf16_kernel(workspace, 16, 32, paired=True) == gemm_kernel.AMX
    assert gemm_bind.bf16_kernel(workspace, 16, 16, paired=True) is None


def preactivation(data: Any, readers: str) -> Any:
    """ResNet v2's pre-activation: a sum (so that nothing folds the BatchNorm away), BatchNorm
    and ReLU, read by ``two`` 1×1 convolutions (a bottleneck's first and its shortcut), by
    a 1×1 and a 3×3 (``grid``: the 3×3 reads a zero-bordered grid, not the pairs), or by 3×3s
    only (``3x3`` one, ``3x3 s2`` one of stride 2, ``3x3 twice`` two alike, ``3x3 mixed`` one
    of stride 1 and one of stride 2: their grids differ), or by a 1×1 whose 3×3 has stride 2
    and a 1×1 shortcut of stride 2 (``strided``: a downsampling bottleneck, the shortcut
    copying every other word of every other row of the pairs)."""
    net = sym.Activation(sym.BatchNorm(data + 1, fix_gamma=False, eps=2e-5, name="bn"),
                         act_type="relu")
    if readers.startswith("3x3"):
        strides = {"3x3": [1], "3x3 s2": [2], "3x3 twice": [1, 1], "3x3 mixed": [1, 2]}[readers]
        convolutions = [sym.Convolution(net, num_filter=32, kernel=(3, 3), pad=(1, 1),
                                        stride=(stride, stride), no_bias=True, name=f"conv{i}")
                        for i, stride in enumerate(strides)]
        if len(convolutions) == 1:
            return convolutions[0]
        if strides[0] != strides[1]:
            return convolutions[0] + sym.UpSampling(convolutions[1], scale=2,
                                                    sample_type="nearest")
        return convolutions[0] + convolutions[1]
    first = sym.Convolution(net, num_filter=32, kernel=(1, 1), no_bias=True, name="conv1")
    if readers == "strided":
        first = sym.Convolution(sym.Activation(first, act_type="relu"), num_filter=32,
                                kernel=(3, 3), pad=(1, 1), stride=(2, 2), no_bias=True,
                                name="conv2")
        return first + sym.Convolution(net, num_filter=32, kernel=(1, 1), stride=(2, 2),
                                       no_bias=True, name="shortcut")
    other = sym.Convolution(net, num_filter=32, kernel=(3, 3) if readers == "grid" else (1, 1),
                            pad=(1, 1) if readers == "grid" else (0, 0), no_bias=True,
                            name="shortcut")
    return first + other


@pytest.mark.parametrize("readers,taken,channels", [
    ("two", True, 64), ("grid", False, 64), ("3x3", True, 64), ("3x3 s2", True, 64),
    ("3x3 twice", True, 64), ("3x3 mixed", False, 64), ("strided", True, 64),
    ("strided", True, 63)])
def test_a_preactivation_batchnorm_hands_its_readers_their_pairs(readers: str, taken: bool,
                                                                 channels: int) -> None:
    """The pairs, or a direct 3×3 convolution's grid where its readers are such alike (the
    border left zero: the outputs those of the plan without a hand-off, bit for bit); a
    strided shortcut copies its words out of the pairs (an odd channel count: the last
    word's high half zero)."""
    symbol = preactivation(sym.var("data"), readers)
    size = (16, 18) if readers == "3x3 mixed" else (15, 17)
    params = nets.random_params(symbol, (1, channels, *size), seed=6)
    params["bn_moving_mean"] = np.random.default_rng(3).standard_normal(channels).astype(
        np.float32)
    feed = {"data": np.random.default_rng(2).standard_normal((1, channels, *size)).astype(
        np.float32)}
    assert_one_handoff(symbol, params, feed, taken)


@pytest.mark.parametrize("threads", [1, 2])
def test_resnet50_v2_hands_its_preactivations_over(monkeypatch: pytest.MonkeyPatch,
                                                   threads: int) -> None:
    """ResNet-50 v2 (64 × 64) in bf16: the pre-activation of every block hands its 1×1
    readers their pairs (all 16: a downsampling block's strided shortcut copies every other
    word of every other row), each block's first 1×1 product its 3×3's grid where that
    is of stride 1 over rows of 8 pixels or more (6: stages 1 and 2 but for stage 2's first
    block), and each block's 3×3 over a short K its last 1×1 product's words (7 more: stages
    1 and 2); the outputs those of the same plan pairing the float32 arrays, bit for bit, at
    one thread and at two, and near fp32's."""
    offered = assert_laid_bit_for_bit(monkeypatch, nets.resnet50_v2(classes=10), 64, threads,
                                      halves=True)
    assert sum(handoff.laid and handoff.layout == "words" for handoff in offered) == 16 + 7
    assert [handoff.source for handoff in offered if handoff.laid
            and handoff.layout not in ("words", "planes")] == [
        *[(1, 64, 16, 16)] * 3, *[(1, 128, 8, 8)] * 3]


def chain(data: Any, second: str, filters: int = 64) -> Any:
    """A 3×3 convolution of ``filters`` and ReLU read by a ``3x3`` convolution (its grid as
    wide as the first's: taken and written), a ``5x5`` (a wider grid), one of ``stride 2``
    (phase planes), a ``1x1`` (its product's words, taken and written), or a 3×3 after the
    first convolution adds its input (``residual``: taken, but the product with a residual
    writes the float32 array)."""
    first = sym.Convolution(data, num_filter=filters, kernel=(3, 3), pad=(1, 1), name="first")
    if second == "residual":
        first = first + data
    net = sym.Activation(first, act_type="relu")
    kernel, stride = {"5x5": (5, 1), "stride 2": (3, 2), "1x1": (1, 1)}.get(second, (3, 1))
    return sym.Convolution(net, num_filter=32, kernel=(kernel, kernel),
                           stride=(stride, stride), pad=(kernel // 2, kernel // 2),
                           name="second")


@pytest.mark.parametrize("second,taken,laid", [
    ("3x3", True, True), ("5x5", False, False), ("stride 2", False, False),
    ("1x1", True, True), ("residual", True, False)])
def test_a_direct_convolution_writes_the_next_ones_grid(second: str, taken: bool,
                                                        laid: bool) -> None:
    """A direct 3×3 convolution's product writes its reader's grid where the reader's grid
    rows are as wide as its own (pairs of filters into words, the dropped columns left on
    the border as zeros), or a 1×1 reader's words (the kept columns packed where the
    output's pixels lie, 19 a row of a 21-word grid row): the output that of the plan
    without the hand-off, bit for bit."""
    symbol = chain(sym.var("data"), second)
    params = nets.random_params(symbol, (1, 64, 13, 19), seed=7)
    feed = {"data": np.random.default_rng(5).standard_normal((1, 64, 13, 19)).astype(
        np.float32)}
    assert_one_handoff(symbol, params, feed, taken, laid)


def test_a_convolution_whose_bias_is_added_after_its_product_writes_no_grid(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the products cannot take the bias (a pass adds it to the float32 output after
    them), the writer's readers pair that output: the grid would lack the bias."""
    from engine.kernels import conv_bind

    monkeypatch.setattr(conv_bind.gemm_bind, "takes_bias", lambda calls, bias: False)
    symbol = chain(sym.var("data"), "3x3")
    params = nets.random_params(symbol, (1, 64, 13, 19), seed=7)
    params["first_bias"] = np.random.default_rng(1).standard_normal(64).astype(np.float32)
    feed = {"data": np.random.default_rng(5).standard_normal((1, 64, 13, 19)).astype(
        np.float32)}
    assert_one_handoff(symbol, params, feed, taken=True, laid=False)


@pytest.mark.parametrize("threads", [1, 2])
def test_resnet18_v1_hands_its_first_convolutions_grids_over(
        monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """ResNet-18 v1 (64 × 64) in bf16: each block's first 3×3 of stride 1 and up to 128
    channels writes its second 3×3's grid (3 of 8: a strided first one's grid is phase planes
    of another width; over a longer K writing the grid did not pay), the outputs those of the
    same plan pairing the float32 arrays, bit for bit, and near fp32's."""
    offered = assert_laid_bit_for_bit(monkeypatch, nets.resnet18_v1(classes=10), 64, threads,
                                      halves=True)
    assert sum(handoff.laid for handoff in offered) == 3  # its 1×1 products: none


def assert_laid_bit_for_bit(monkeypatch: pytest.MonkeyPatch, symbol: Any, side: int,
                            threads: int, halves: bool = False,
                            near_fp32: bool = True) -> list[bf16_handoff.PairedHandoff]:
    """The hand-offs ``symbol``'s bf16 plan (random weights, a ``side``² image, its steps on
    ``threads`` threads) offers, each laid where taken; its answers those of the same plan
    pairing its float32 arrays (with ``halves``: its 1×1 products' halves still laid), bit
    for bit, and (``near_fp32``) near fp32's with the same top class."""
    params = nets.random_params(symbol, (1, 3, side, side), seed=5)
    feed = {"data": image(side)}
    with steps_on(threads):
        handoffs: list = []
        got = served(symbol, params, feed, "bf16", handoffs, halves=halves)
        offered = [handoff for handoff in handoffs if handoff is not None]
        assert all(handoff.laid == handoff.taken for handoff in offered)
        never_taken(monkeypatch)
        np.testing.assert_array_equal(got, served(symbol, params, feed, "bf16", [],
                                                  halves=halves))
        if near_fp32:
            want = served(symbol, params, feed, "fp32")
            assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()
            assert got.argmax() == want.argmax()
    return offered


def rounding_in_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each 1×1 product laying bf16 planes made to run its float32 product and round that
    output in NumPy (`bf16.round_to_bf16`) into the planes instead: what its epilogue must
    write, bit for bit."""
    def job(product: Any, planes: np.ndarray) -> Any:
        address = int(product.plain.context[gemm_amx_handoff._FIELD["c"]])
        out = np.ctypeslib.as_array((ctypes.c_float * planes.size).from_address(address))

        def run() -> None:
            product.plain()
            planes[...] = bf16.round_to_bf16(out.reshape(planes.shape))

        return run

    monkeypatch.setattr(gemm_amx_handoff.HandingProduct, "_halves_job", job)


def expand_block(data: Any, readers: str) -> Any:
    """An expand 1×1 with relu6 read by a depthwise 3×3 of stride 2 (``depthwise``), by it
    and a pooling (``pooled``: not taken), or after adding its input (``residual``: taken,
    but the product adding a residual writes float32) or with a sigmoid (``sigmoid``: a step
    after the product, which withdraws its hand-off); a projection after."""
    expand = sym.Convolution(data, num_filter=48, kernel=(1, 1), name="expand")
    if readers == "residual":
        expand = expand + data
    expand = (sym.Activation(expand, act_type="sigmoid") if readers == "sigmoid"
              else sym.clip(expand, a_min=0.0, a_max=6.0))
    depthwise = sym.clip(sym.Convolution(expand, num_filter=48, num_group=48, kernel=(3, 3),
                                         stride=(2, 2), pad=(1, 1), name="dw"),
                         a_min=0.0, a_max=6.0)
    project = sym.Convolution(depthwise, num_filter=32, kernel=(1, 1), name="project")
    if readers == "pooled":
        pooled = sym.Pooling(expand, kernel=(3, 3), stride=(2, 2), pad=(1, 1),
                             pool_type="max")
        return project + sym.Convolution(pooled, num_filter=32, kernel=(1, 1), name="side")
    return project


@pytest.mark.parametrize("readers,taken,laid", [
    ("depthwise", True, True), ("pooled", False, False), ("residual", True, False),
    ("sigmoid", False, False)])
def test_a_1x1_product_hands_its_depthwise_reader_bf16_planes(
        monkeypatch: pytest.MonkeyPatch, readers: str, taken: bool, laid: bool) -> None:
    """An AMX 1×1 product (K 48, 48 filters at 29 × 35: edge tiles both ways) writes its
    output as bf16 planes where its depthwise reader alone reads it and no residual is
    added (`assert_expand_lays_planes`)."""
    assert_expand_lays_planes(monkeypatch, gemm_amx_handoff, readers, taken, laid)


def assert_expand_lays_planes(monkeypatch: pytest.MonkeyPatch, writer: Any, readers: str,
                              taken: bool, laid: bool) -> None:
    """`expand_block` with ``readers`` in bf16, its expand offering bf16 planes whatever
    their size (``writer``: the module whose products lay them): taken and laid as said,
    the depthwise layer their one taker, in the output's own memory; the output that of the
    plan rounding the float32 output in NumPy into the planes, bit for bit (where not laid,
    the plan's with no planes), and near fp32's."""
    monkeypatch.setattr(writer, "MIN_OUTPUT_BYTES", 0)  # 190 KB: offered too
    symbol = expand_block(sym.var("data"), readers)
    params = nets.random_params(symbol, (1, 48, 29, 35), seed=8)
    feed = {"data": np.random.default_rng(6).standard_normal((1, 48, 29, 35)).astype(
        np.float32)}
    handoffs: list = []
    got = served(symbol, params, feed, "bf16", handoffs, halves=True)
    planes = [handoff for handoff in handoffs if handoff is not None and handoff.planes]
    assert planes[0].taken is taken and planes[0].laid is laid  # the expand's: bound first
    assert not any(handoff.taken for handoff in planes[1:])  # read by a sum
    assert planes[0].layout == "planes" and planes[0].takers == 1  # the depthwise layer
    # an output under IN_PLACE_MAX_BYTES: its planes lie in its own float32 memory
    assert planes[0].array is not None and np.shares_memory(planes[0].words, planes[0].array)
    with monkeypatch.context() as patched:
        rounding_in_numpy(patched)
        np.testing.assert_array_equal(got, served(symbol, params, feed, "bf16", [],
                                                  halves=True))
    if not laid:
        np.testing.assert_array_equal(got, served(symbol, params, feed, "bf16", []))
    want = served(symbol, params, feed, "fp32")
    assert np.abs(got - want).max() <= 0.03 * np.abs(want).max()


@pytest.mark.parametrize("threads", [1, 2])
def test_mobilenet_v2_hands_its_expand_outputs_over_as_bf16_planes(
        monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """MobileNet v2 on AMX (`assert_mobilenet_v2_lays_planes`): beside the depthwise layers'
    pairs, the words of the stem and of the first projection (16 filters) for the expand
    after each."""
    assert_mobilenet_v2_lays_planes(monkeypatch, threads, words=17 + 2)


def assert_mobilenet_v2_lays_planes(monkeypatch: pytest.MonkeyPatch, threads: int,
                                    words: int) -> None:
    """MobileNet v2 (224 × 224) in bf16: each expand whose float32 output is 512 KB or more
    (32 and 96 × 112², 144 × 56² twice, 192 × 28² three times) writes its depthwise
    reader's bf16 planes, the 28² ones in their own float32 memory (under 1 MB), the
    smaller expands float32, and ``words`` writers their readers' words; the outputs those
    of the plan rounding in NumPy, bit for bit, at ``threads`` threads, and near fp32's."""
    symbol = nets.mobilenet_v2()
    params = nets.random_params(symbol, (1, 3, 224, 224))
    feed = {"data": image(224)}
    with steps_on(threads):
        handoffs: list = []
        got = served(symbol, params, feed, "bf16", handoffs, halves=True)
        laid = [handoff for handoff in handoffs if handoff is not None and handoff.laid]
        planes = [handoff for handoff in laid if handoff.layout == "planes"]
        assert [handoff.source for handoff in planes] == [
            (1, 32, 112, 112), (1, 96, 112, 112), (1, 144, 56, 56), (1, 144, 56, 56),
            (1, 192, 28, 28), (1, 192, 28, 28), (1, 192, 28, 28)]
        assert [handoff.array is not None and np.shares_memory(handoff.words, handoff.array)
                for handoff in planes] == [False] * 4 + [True] * 3
        assert len(laid) - len(planes) == words
        with monkeypatch.context() as patched:
            rounding_in_numpy(patched)
            np.testing.assert_array_equal(got, served(symbol, params, feed, "bf16", [],
                                                      halves=True))
        want = served(symbol, params, feed, "fp32")
    assert np.abs(got - want).max() <= 0.1 * np.abs(want).max()


def bottleneck(data: Any, second: str, filters: int) -> Any:
    """A 1×1 convolution and ReLU (a ResNet v2 bottleneck's first, its BatchNorm folded in)
    read by a ``3x3`` convolution of stride 1, a ``5x5`` (a wider border), one of ``stride
    2`` (phase planes: not taken), or a 3×3 after the 1×1 adds its input (``residual``:
    taken, but the product with a residual writes the float32 array) or after a sigmoid
    (``sigmoid``: a step its epilogue cannot take changes the float32 array after it, so the
    hand-off is withdrawn)."""
    first = sym.Convolution(data, num_filter=filters, kernel=(1, 1), name="first")
    if second == "residual":
        first = first + data
    net = sym.Activation(first, act_type="sigmoid" if second == "sigmoid" else "relu")
    kernel, stride = {"5x5": (5, 1), "stride 2": (3, 2), "1x1": (1, 1)}.get(second, (3, 1))
    return sym.Convolution(net, num_filter=32, kernel=(kernel, kernel),
                           stride=(stride, stride), pad=(kernel // 2, kernel // 2),
                           name="second")


@pytest.mark.parametrize("second,filters,taken,laid", [
    ("3x3", 64, True, True), ("3x3", 63, True, True), ("5x5", 64, True, True),
    ("stride 2", 64, False, False), ("residual", 64, True, False),
    ("sigmoid", 64, False, False)])
@pytest.mark.parametrize("size", [(13, 19), (11, 9)])
def test_a_1x1_product_writes_the_next_direct_convolutions_grid(
        second: str, filters: int, taken: bool, laid: bool, size: tuple[int, int]) -> None:
    """An AMX 1×1 product writes its direct reader's zero-bordered grid (pairs of filters
    into words, an odd filter count's last high half zero; each vector of 16 pixels stored
    on the two or three grid rows it spans; rows 19 and 9 pixels wide): the output that of
    the plan whose reader pairs the float32 output, bit for bit."""
    symbol = bottleneck(sym.var("data"), second, filters)
    params = nets.random_params(symbol, (1, filters if second == "residual" else 64, *size),
                                seed=9)
    params["first_bias"] = np.random.default_rng(4).standard_normal(filters).astype(np.float32)
    feed = {"data": np.random.default_rng(5).standard_normal(
        (1, filters if second == "residual" else 64, *size)).astype(np.float32)}
    handoffs: list = []
    got = served(symbol, params, feed, "bf16", handoffs, halves=True)
    offered = [handoff for handoff in handoffs if handoff is not None]
    assert offered[0].taken is taken and offered[0].laid is laid
    assert not any(handoff.laid for handoff in offered[1:])
    np.testing.assert_array_equal(got, served(symbol, params, feed, "bf16"))
    want = served(symbol, params, feed, "fp32")
    assert np.abs(got - want).max() <= 0.03 * np.abs(want).max()


def test_a_grid_under_eight_pixels_wide_is_not_taken() -> None:
    """A vector of 16 pixels over grid rows under 8 pixels wide would span four of them:
    the product leaves that grid to its reader's pairing."""
    symbol = bottleneck(sym.var("data"), "3x3", 64)
    params = nets.random_params(symbol, (1, 64, 9, 7), seed=9)
    feed = {"data": np.random.default_rng(5).standard_normal((1, 64, 9, 7)).astype(
        np.float32)}
    handoffs: list = []
    served(symbol, params, feed, "bf16", handoffs, halves=True)
    assert not any(handoff.taken for handoff in handoffs if handoff is not None)


def test_offers_grid_asks_what_grid_for_takes() -> None:
    handoff = bf16_handoff.PairedHandoff(1, (16, 32), (32, 0), (1, 32, 4, 4),
                                         grids=lambda grid: grid == "mine")
    assert bf16_handoff.offers_grid(handoff, "tag", "mine")
    assert not bf16_handoff.offers_grid(handoff, "tag", "another")
    handoff.layout = "words"
    assert not bf16_handoff.offers_grid(handoff, "tag", "mine")
    assert handoff.takers == 0 and handoff.words is None


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("side", [64, 56])
def test_resnet50_v2_residual_products_write_the_next_preactivations_words(
        monkeypatch: pytest.MonkeyPatch, threads: int, side: int) -> None:
    """ResNet-50 v2 in bf16: stage 1's residual 1×1 products after its first block (2)
    write the next block's pre-activation words from their epilogue, the BatchNorm's step
    running no pass; the last block of stages 1-3, whose sum only that BatchNorm reads,
    writes the words alone (stages 2-4's other products, over longer K, are not asked, nor
    is stage 1's first, whose shortcut runs inside it over twice the K: `gemm_amx_shortcut`).
    At 64² the products' columns fill whole tiles, at 56² (14², 7² and 4² pixels) their last
    tile is an edge.
    The outputs are those of the same plan with the BatchNorm passes writing the words,
    bit for bit, at one thread and at two."""
    requests = preactivation_requests(monkeypatch, side, threads)
    assert len(requests) == 4 and all(request.written for request in requests)
    assert [request.sum_read for request in requests] == [True, False, False, False]
    assert all(request.out_handoff.laid for request in requests)


def watch_asks(monkeypatch: pytest.MonkeyPatch) -> list:
    """`gemm_preact.ask` watched from now on: what it answers each BatchNorm's ask (None
    where it grants none), in the order they came."""
    ask, granted = gemm_preact.ask, []

    def watched(*args: Any) -> Any:
        request = ask(*args)
        granted.append(request)
        return request

    monkeypatch.setattr(gemm_preact, "ask", watched)
    return granted


def preactivation_requests(monkeypatch: pytest.MonkeyPatch, side: int,
                           threads: int) -> list[gemm_preact.PreactAsk]:
    """The pre-activation asks ResNet-50 v2's bf16 plan (a ``side``² image, its steps on
    ``threads`` threads) grants; its outputs those of the same plan with no ask granted (the
    BatchNorm passes writing the words), bit for bit."""
    symbol = nets.resnet50_v2(classes=10)
    params = nets.random_params(symbol, (1, 3, side, side), seed=5)
    feed = {"data": image(side)}
    with steps_on(threads):
        granted = watch_asks(monkeypatch)
        got = served(symbol, params, feed, "bf16", [], halves=True)
        requests = [request for request in granted if request is not None]
        monkeypatch.setattr(gemm_preact, "ask", lambda *args: None)
        np.testing.assert_array_equal(got, served(symbol, params, feed, "bf16", [],
                                                  halves=True))
    return requests


def test_the_ask_fits_only_a_short_k_of_one_image() -> None:
    """A product over a K past `gemm_preact.MAX_DEPTH` words (past
    `WORDS_ALONE_MAX_DEPTH` where it writes the words alone), of a batch, or whose rows the
    words do not halve, is not asked for the words."""
    context = np.zeros(len(gemm_kernel.CONTEXT_FIELDS), np.int64)
    for name, value in (("m", 1024), ("n", 16), ("k", 128), ("batch", 1)):
        context[gemm_kernel.CONTEXT_FIELDS[name]] = value
    handoff = bf16_handoff.PairedHandoff(1, (512, 32), (1024, 0))
    assert not gemm_preact._fits(context, handoff)
    assert gemm_preact._fits(context, handoff, sum_read=False)
    context[gemm_kernel.CONTEXT_FIELDS["k"]] = gemm_preact.WORDS_ALONE_MAX_DEPTH + 16
    assert not gemm_preact._fits(context, handoff, sum_read=False)
    context[gemm_kernel.CONTEXT_FIELDS["k"]] = gemm_preact.MAX_DEPTH
    assert gemm_preact._fits(context, handoff)
    context[gemm_kernel.CONTEXT_FIELDS["batch"]] = 2
    assert not gemm_preact._fits(context, handoff)
    context[gemm_kernel.CONTEXT_FIELDS["batch"]] = 1
    assert not gemm_preact._fits(context, bf16_handoff.PairedHandoff(1, (256, 32),
                                                                          (512, 0)))


@pytest.mark.parametrize("threads", [1, 2])
def test_mobilenet_v2_s_stem_writes_its_first_expand_s_words(
        monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """MobileNet v2 in bf16 on AMX: the stem's product (a batch of products, one per output
    row, K 27) and the first projection (16 filters: one tile of half its rows) store their
    expand's words (`assert_stem_and_projection_write_words`)."""
    assert_stem_and_projection_write_words(monkeypatch, threads, gemm_amx_handoff, 1)


def assert_stem_and_projection_write_words(monkeypatch: pytest.MonkeyPatch, threads: int,
                                           handing: Any, unoffered: int) -> None:
    """MobileNet v2 (96 × 96) in bf16: the stem stores the words its only reader, the first
    expand's product, takes, in place of its float32 output, and so does the first
    projection for the expand after it; those readers pair nothing, and the outputs are the
    same plan's whose products write float32 for their readers to pair (where ``unoffered``
    writers offer nothing), bit for bit, at ``threads`` threads. ``handing``: the module of
    the products' hand-offs (`gemm_amx_handoff`, `gemm_tile_handoff`)."""
    # No expand's planes (96 × 48², 884 KB, would be): their rounding, checked against
    # NumPy's above, moves this random network's output from fp32's by 0.12 of its largest
    # (0.08 with none or every expand's), past the bound below, which is about the words.
    monkeypatch.setattr(handing, "MIN_OUTPUT_BYTES", 1 << 20)
    symbol = nets.mobilenet_v2()
    params = nets.random_params(symbol, (1, 3, 96, 96))
    feed = {"data": image(96)}
    with steps_on(threads):
        handoffs: list = []
        got = served(symbol, params, feed, "bf16", handoffs, halves=True)
        stem = next(handoff for handoff in handoffs if handoff is not None)
        assert stem.source == (1, 32, 48, 48) and stem.layout == "words"
        assert stem.taken and stem.laid
        project = [handoff for handoff in handoffs
                   if handoff is not None and handoff.source == (1, 16, 48, 48)]
        assert len(project) == 1 and project[0].layout == "words" and project[0].laid
        with monkeypatch.context() as patched:
            patched.setattr(gemm_preact, "writes_words", lambda context, handoff: False)
            plain: list = []
            np.testing.assert_array_equal(got, served(symbol, params, feed, "bf16", plain,
                                                      halves=True))
            offered = [handoff for handoff in handoffs if handoff is not None]
            assert len([handoff for handoff in plain if handoff is not None]) == \
                len(offered) - unoffered
            assert not any(handoff.laid for handoff in plain
                           if handoff is not None and handoff.source == (1, 16, 48, 48))
        want = served(symbol, params, feed, "fp32")
    assert np.abs(got - want).max() <= 0.1 * np.abs(want).max()


def test_a_batch_of_row_products_writes_the_words_of_its_output() -> None:
    """The words job of a batch of AMX products each writing one row of every plane (the
    stem's, `gemm_kernel.bind_tiles_batch`): each output row's pixels land at their place in
    the words, each value the float32 epilogue's rounded to bf16, filters 2p and 2p+1 in
    word row p."""
    rng = np.random.default_rng(21)
    filters, depth, height, width = 64, 40, 5, 37
    weight = rng.standard_normal((filters, depth)).astype(np.float32)
    weight.flags.writeable = False
    tiles = bf16.amx_pack_rows(bf16.amx_weight_rows(weight))
    words_depth = bf16.amx_depth(depth)
    inputs = rng.standard_normal((height, depth, width)).astype(np.float32)
    pairs = np.zeros((height * words_depth, bf16.amx_rows(width)), np.float32)
    for row in range(height):
        pairs[row * words_depth:row * words_depth + depth // 2, :width] = \
            bf16.pair_columns(inputs[row])
    out = np.full((1, filters, height, width), np.nan, np.float32)
    product = gemm_kernel.bind_tiles_batch(tiles, pairs, out[0, :, 0, :], height, words_depth,
                                           width * 4)
    bias = rng.standard_normal(filters).astype(np.float32)
    product = product.with_epilogue(bias, None, 0.0, 6.0)
    assert gemm_amx_handoff._writes_by_rows(product, out)
    handoff = bf16_handoff.PairedHandoff(1, (filters // 2, bf16.amx_rows(height * width)),
                                         (filters, 0), out.shape)
    assert gemm_preact.writes_words(product.context, handoff)
    words = np.zeros(handoff.shape, np.float32)
    gemm_preact.words_job(product, words)()
    assert np.isnan(out).all()  # the words alone
    product()
    flat = out[0].reshape(filters, -1)
    want = np.zeros_like(words)
    want[:, :height * width] = bf16.pair_columns(flat)
    np.testing.assert_array_equal(words.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("batch", [1, 3])
def test_mobilenet_v2_in_bf16_near_the_reference_on_one_thread_and_two(batch: int) -> None:
    """The whole bf16 MobileNet v2 (224 × 224: the stem's words, the expands' planes, the
    depthwise layers' pairs) near the reference interpreter's float32, at one thread and at
    two."""
    from engine.cpu import spin_pool

    symbol = nets.mobilenet_v2()
    params = nets.random_params(symbol, (batch, 3, 224, 224), seed=9)
    feed = {"data": np.random.default_rng(2).standard_normal((batch, 3, 224, 224))
            .astype(np.float32)}
    want = next(iter(engine.load_model(symbol, params, optimize=False).infer(feed).values()))
    model = engine.load_model(symbol, params, optimize=True, precision="bf16")
    for threads in (1, 2):
        with spin_pool.armed(threads):
            got = next(iter(model.infer(feed).values()))
        assert np.abs(got - want).max() <= 0.1 * np.abs(want).max()


@pytest.mark.parametrize("filters", [16, 64])
def test_a_1x1_product_writes_the_words_of_its_output(filters: int) -> None:
    """The words job of one AMX product writing the whole of its output (a 1×1 layer read
    only by 1×1 products), 16 filters (a tile of half its rows) as well as whole tiles: each
    value the float32 epilogue's rounded to bf16, filters 2p and 2p+1 in word row p, the K
    pad past them left zero."""
    rng = np.random.default_rng(23)
    depth, pixels = 40, 7 * 9
    weight = rng.standard_normal((filters, depth)).astype(np.float32)
    weight.flags.writeable = False
    tiles = bf16.amx_pack_rows(bf16.amx_weight_rows(weight))
    pairs = np.zeros((bf16.amx_depth(depth), bf16.amx_rows(pixels)), np.float32)
    pairs[:depth // 2, :pixels] = bf16.pair_columns(
        rng.standard_normal((depth, pixels)).astype(np.float32))
    out = np.full((1, filters, 7, 9), np.nan, np.float32)
    product = gemm_kernel.bind_tiles(tiles, pairs, out.reshape(filters, pixels), packed=True)
    product = product.with_epilogue(rng.standard_normal(filters).astype(np.float32), None,
                                    0.0, 6.0)
    handoff = bf16_handoff.PairedHandoff(1, (bf16.amx_depth(filters), bf16.amx_rows(pixels)),
                                         (filters, 0), out.shape)
    assert gemm_preact.writes_words(product.context, handoff)
    assert_words_of_output(product, product, out)


def assert_words_of_output(product: Any, call: Any, out: np.ndarray) -> None:
    """``product``'s words job (its ``out``, (1, F, H, W), NaN before) stores only the
    words a reader takes, NaN left in ``out``; each the float32 value ``call`` (the
    product's whole call) then writes, rounded: filters 2p and 2p+1 in word row p, the
    pad past them zero."""
    filters, pixels = out.shape[1], out.shape[2] * out.shape[3]
    words = np.zeros((bf16.amx_depth(filters), bf16.amx_rows(pixels)), np.float32)
    gemm_preact.words_job(product, words)()
    assert np.isnan(out).all()  # the words alone
    call()
    want = np.zeros_like(words)
    want[:filters // 2, :pixels] = bf16.pair_columns(out.reshape(filters, pixels))
    np.testing.assert_array_equal(words.view(np.uint32), want.view(np.uint32))
