"""The bf16 hand-off on a host with the AVX-512 BF16 tile and no AMX (`bf16_handoff`'s
``bf16_tile``): a depthwise layer or a pre-activation BatchNorm at batch 1 writes the pairs
its 1×1 readers' products on that tile read in place, as AMX would read them, the outputs
the plan's pairing the float32 planes, bit for bit; a 1×1 product on a register tile writes
its depthwise reader's bf16 planes (`gemm_tile_handoff`), the outputs the plan's rounding
the float32 output into them in NumPy, bit for bit; a direct 3×3 convolution on the tile
writes its 3×3 reader's grid or its 1×1 reader's words (`conv_amx`), bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from bench import nets
from engine import sym
from engine.kernels import (
    bf16,
    bf16_handoff,
    conv_amx,
    depthwise_vector,
    gemm_bind,
    gemm_kernel,
    gemm_preact,
    gemm_tile_handoff,
)
from engine.kernels.workspace import Reader, Workspace
from tests.engine.kernels.test_bf16_handoff import (
    assert_expand_lays_planes,
    assert_laid_bit_for_bit,
    assert_mobilenet_v2_lays_planes,
    assert_one_handoff,
    assert_stem_and_projection_write_words,
    assert_words_of_output,
    block,
    chain,
    image,
    never_taken,
    preactivation,
    preactivation_requests,
    served,
)

pytestmark = pytest.mark.skipif(
    not gemm_kernel.available(gemm_kernel.BF16) or depthwise_vector._task(1) is None,
    reason="needs the AVX-512 BF16 tile and the vector depthwise kernel")


@pytest.fixture(autouse=True)
def without_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host as one with the AVX-512 BF16 tile alone (an AMX host has it too)."""
    monkeypatch.setattr(gemm_kernel, "available", lambda kernel=None: kernel != gemm_kernel.AMX)


def test_mobilenet_v2_hands_its_depthwise_outputs_to_the_tile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """MobileNet v2 (96 × 96) in bf16: every depthwise layer offers its projection the
    pairs it reads; those over more than `BF16_TRANSPOSED_COLUMNS` pixels take them, laid on
    every run (at 3² the projections run transposed, reading the float32 planes), and the
    outputs are the same plan's whose readers pair the float32 planes, bit for bit, and
    near fp32's."""
    symbol = nets.mobilenet_v2()
    params = nets.random_params(symbol, (1, 3, 96, 96))
    feed = {"data": image(96)}
    handoffs: list = []
    got = served(symbol, params, feed, "bf16", handoffs)
    offered = [handoff for handoff in handoffs if handoff is not None]
    assert len(offered) == 17
    for handoff in offered:
        wide = handoff.source[2] * handoff.source[3] > gemm_bind.BF16_TRANSPOSED_COLUMNS
        assert handoff.taken is wide and handoff.laid is wide
    assert sum(handoff.laid for handoff in offered) == 13
    never_taken(monkeypatch)
    np.testing.assert_array_equal(got, served(symbol, params, feed, "bf16", []))
    want = served(symbol, params, feed, "fp32")
    assert np.abs(got - want).max() <= 0.1 * np.abs(want).max()


@pytest.mark.parametrize("readers,taken", [("one", True), ("two", True), ("pooled", False)])
@pytest.mark.parametrize("stride", [1, 2])
def test_the_depthwise_layer_hands_the_tile_its_pairs(readers: str, taken: bool,
                                                      stride: int) -> None:
    """Every 1×1 reader takes the words, and the layer lays them; a pooling reader takes
    none, and the layer writes its float32 planes: the outputs are those of the plan with
    no hand-off, bit for bit, either way."""
    symbol = block(sym.var("data"), readers, stride)
    params = nets.random_params(symbol, (1, 24, 14, 14), seed=4)
    feed = {"data": np.random.default_rng(2).standard_normal((1, 24, 14, 14)).astype(
        np.float32)}
    handoffs: list = []
    got = served(symbol, params, feed, "bf16", handoffs)
    offered = [handoff for handoff in handoffs if handoff is not None]
    assert len(offered) == 1 and offered[0].taken is taken and offered[0].laid is taken
    np.testing.assert_array_equal(got, served(symbol, params, feed, "bf16"))


def test_only_a_writer_offering_the_tile_its_output_offers() -> None:
    """Without AMX, a writer that does not offer its output there (an AMX 1×1 product's)
    offers nothing; one that does offers its words as AMX lays them, and its grids and
    planes where it writes them."""
    workspace = Workspace(np, 0, precision="bf16")
    array = np.zeros((1, 40, 7, 7), np.float32)
    workspace.note_readers(array, (Reader("Convolution", None, 0),))
    assert bf16_handoff.offer(workspace, array, grids=True) is None
    handoff = bf16_handoff.offer(workspace, array, grids=True, planes=True, bf16_tile=True)
    assert handoff.shape == (bf16.amx_depth(40), bf16.amx_rows(49))
    assert handoff.grids and handoff.planes and handoff.columns


def test_the_tiles_product_reads_the_handed_words_where_they_lie() -> None:
    """A 1×1 product on the tile taking a hand-off reads the handed words (paired there on
    a run its writer left the float32 array) and gives the rounded operands' product."""
    workspace = Workspace(np, 0, precision="bf16")
    rng = np.random.default_rng(3)
    right = rng.standard_normal((1, 45, 9, 9)).astype(np.float32)
    workspace.note_readers(right, (Reader("Convolution", None, 0),))
    handoff = bf16_handoff.offer(workspace, right, bf16_tile=True)
    weight = rng.standard_normal((24, 45)).astype(np.float32)
    weight.flags.writeable = False
    out = np.full((24, 81), np.nan, np.float32)
    call = gemm_bind.weight_product(np, weight, right.reshape(45, 81), out, workspace, handoff)
    assert handoff.taken and handoff.layout == "words"
    handoff.laid = False  # the writer left the float32 array: the reader pairs it
    call()
    want = bf16.rounded(weight).astype(np.float64) @ bf16.rounded(right.reshape(45, 81))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert handoff.words[:23, :81].any()


@pytest.mark.parametrize("threads", [1, 2])
def test_resnet50_v2_hands_its_preactivations_to_the_tile(monkeypatch: pytest.MonkeyPatch,
                                                          threads: int) -> None:
    """ResNet-50 v2 (64 × 64) in bf16: a block's pre-activation BatchNorm hands its 1×1
    readers their pairs where all of them take (14 blocks: a downsampling block's strided
    shortcut copies its pixels' words out of them; not at 2², whose products run
    transposed); the outputs those of the plan pairing the float32 arrays, bit for bit, at
    one thread and at two."""
    offered = assert_laid_bit_for_bit(monkeypatch, nets.resnet50_v2(classes=10), 64, threads,
                                      near_fp32=False)
    assert [handoff.source for handoff in offered if handoff.laid] == [
        (1, 64, 16, 16), *[(1, 256, 16, 16)] * 3, *[(1, 512, 8, 8)] * 4,
        *[(1, 1024, 4, 4)] * 6]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("side", [128, 136])
def test_resnet50_v2_last_blocks_write_the_next_preactivations_words_on_the_tile(
        monkeypatch: pytest.MonkeyPatch, threads: int, side: int) -> None:
    """ResNet-50 v2 in bf16 on the tile: the last block of stages 1 and 2, whose sum only
    the next pre-activation BatchNorm reads, writes that BatchNorm's words alone from its
    residual product's epilogue (`gemm_preact.TILE_WORDS_ALONE`), the BatchNorm's step
    running no pass; no block whose sum the next block's shortcut reads too is asked, nor
    one whose output is too small to offer its words (stage 3's, under
    `gemm_tile_handoff.MIN_OUTPUT_BYTES`). At 128² the products' columns fill whole tiles, at
    136² (34² and 17² pixels) their last tile is an edge. The outputs are those of the same
    plan with the BatchNorm passes writing the words, bit for bit, at one thread and at
    two."""
    requests = preactivation_requests(monkeypatch, side, threads)
    assert len(requests) == 2 and not any(request.sum_read for request in requests)
    assert all(request.written and request.out_handoff.laid for request in requests)


@pytest.mark.parametrize("readers,taken,laid", [
    ("depthwise", True, True), ("pooled", False, False), ("residual", True, False),
    ("sigmoid", False, False)])
def test_a_tile_product_hands_its_depthwise_reader_bf16_planes(
        monkeypatch: pytest.MonkeyPatch, readers: str, taken: bool, laid: bool) -> None:
    """A 1×1 product on the AVX-512 BF16 tile (K 48, 48 filters at 29 × 35: edge tiles both
    ways) writes its output as bf16 planes where its depthwise reader alone reads it and no
    residual is added, as AMX's does (`assert_expand_lays_planes`)."""
    assert_expand_lays_planes(monkeypatch, gemm_tile_handoff, readers, taken, laid)


@pytest.mark.parametrize("threads", [1, 2])
def test_mobilenet_v2_hands_its_expand_outputs_to_the_depthwise_layers(
        monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """MobileNet v2 on the AVX-512 BF16 tile (its expands on the tile from K 16,
    `gemm_bind.BF16_TILE_MIN_DEPTH`) lays its depthwise readers' planes as on AMX
    (`assert_mobilenet_v2_lays_planes`), each depthwise layer its projection's words, and
    the stem, the first projection, the last and each stage's last block (its residual
    added: 5) their 1×1 reader's words (8 more)."""
    assert_mobilenet_v2_lays_planes(monkeypatch, threads, words=17 + 8)


@pytest.mark.parametrize("filters", [16, 26])
def test_a_tile_product_writes_the_words_of_its_output(filters: int) -> None:
    """The words job of one product on the AVX-512 BF16 tile writing the whole of its output
    (a 1×1 layer read only by 1×1 products), whole tiles of 12 filters and an edge of 4 or
    2, 63 pixels (an edge of 31 columns): each value the float32 epilogue's rounded to bf16,
    filters 2p and 2p+1 in word row p, the K pad past them left zero, C untouched."""
    rng = np.random.default_rng(23)
    depth, pixels = 40, 7 * 9
    weight = rng.standard_normal((filters, depth)).astype(np.float32)
    weight.flags.writeable = False
    data = rng.standard_normal((depth, pixels)).astype(np.float32)
    out = np.full((1, filters, 7, 9), np.nan, np.float32)
    product = gemm_bind.weight_product(np, weight, data, out.reshape(filters, pixels),
                                       Workspace(np, 0, precision="bf16"))
    (product,) = gemm_bind.clamped(gemm_bind.with_bias(
        [product], bias_rows=rng.standard_normal(filters).astype(np.float32)), 0.0, 6.0)
    pair, plain = product.args
    assert int(plain.context[gemm_kernel.CONTEXT_FIELDS["kernel"]]) == gemm_kernel.BF16
    assert gemm_preact.stores_words(plain, out)
    pair()
    assert_words_of_output(plain, product, out)


@pytest.mark.parametrize("threads", [1, 2])
def test_mobilenet_v2_s_stem_and_first_projection_write_their_expands_words(
        monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """MobileNet v2 in bf16 on the tile: the stem's product (one over its im2col words, K
    27) and the first projection store their expand's words, as on AMX
    (`assert_stem_and_projection_write_words`); without the words, neither they nor the
    last block of stages 1-4 (their residual added) offer anything: their outputs are under
    `gemm_tile_handoff.MIN_OUTPUT_BYTES`."""
    assert_stem_and_projection_write_words(monkeypatch, threads, gemm_tile_handoff, 2 + 4)


@pytest.mark.parametrize("second,taken,laid", [
    ("3x3", True, True), ("5x5", False, False), ("stride 2", False, False),
    ("1x1", True, True), ("residual", True, False)])
@pytest.mark.parametrize("channels,shape", [
    (66, (12, 30)),  # tiles of grid columns (K 594), a last block of 2 filters
    (128, (14, 21)),  # pixel tiles (K 1152), rows of 3 runs
    (130, (7, 14))])  # pixel tiles, a last block of 2 filters
def test_a_direct_convolution_on_the_tile_writes_the_next_ones_grid(
        second: str, taken: bool, laid: bool, channels: int, shape: tuple[int, int]) -> None:
    """On the AVX-512 BF16 tile, a direct 3×3 convolution's product (of grid columns, or of
    pixels: `conv_amx.by_pixels`) writes its reader's grid where the reader's grid rows are
    as wide as its own, or a 1×1 reader's words, as AMX's does: the output that of the
    plan without the hand-off, bit for bit."""
    symbol = chain(sym.var("data"), second, channels)
    params = nets.random_params(symbol, (1, channels, *shape), seed=7)
    feed = {"data": np.random.default_rng(5).standard_normal((1, channels, *shape)).astype(
        np.float32)}
    assert conv_amx.by_pixels(feed["data"], np.empty((1, channels, *shape)),
                              ((3, 3), (1, 1), (1, 1), (1, 1))) is (channels >= 128)
    assert_one_handoff(symbol, params, feed, taken, laid)


@pytest.mark.parametrize("threads", [1, 2])
def test_resnet18_v1_on_the_tile_hands_its_first_convolutions_grids_over(
        monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """ResNet-18 v1 (112 × 112) in bf16 on the tile: each block's first 3×3 of stride 1
    writes its second 3×3's grid where both run direct products (4 of 8: at 28² tiles of
    grid columns, at 14² and 7² pixel tiles; a strided first one's grid is phase planes of
    another width, and at 4² the layers run as im2col products), the outputs those of the
    same plan pairing the float32 arrays, bit for bit, and near fp32's."""
    offered = assert_laid_bit_for_bit(monkeypatch, nets.resnet18_v1(classes=10), 112, threads)
    assert [handoff.source for handoff in offered if handoff.laid] == [
        *[(1, 64, 28, 28)] * 2, (1, 128, 14, 14), (1, 256, 7, 7)]


@pytest.mark.parametrize("readers,taken", [
    ("3x3", True), ("3x3 s2", True), ("3x3 twice", True), ("grid", False), ("strided", True)])
def test_a_preactivation_batchnorm_hands_the_tiles_direct_convolutions_their_grid(
        readers: str, taken: bool) -> None:
    """On the tile, a pre-activation BatchNorm read by direct 3×3 convolutions alike writes
    their grid (of stride 1, or phase planes at stride 2), as on AMX; read by a 1×1 and a
    3×3, the first reader's layout is not the other's, and it writes the float32 array;
    read by a 1×1 and a strided 1×1 shortcut, their words, the shortcut copying its
    pixels' out of them: the outputs those of the plan without a hand-off, bit for bit."""
    symbol = preactivation(sym.var("data"), readers)
    params = nets.random_params(symbol, (1, 64, 12, 30), seed=6)
    params["bn_moving_mean"] = np.random.default_rng(3).standard_normal(64).astype(np.float32)
    feed = {"data": np.random.default_rng(2).standard_normal((1, 64, 12, 30)).astype(
        np.float32)}
    assert_one_handoff(symbol, params, feed, taken)
