"""Our bf16 GEMMs (AVX-512 BF16's `gemm_bf16_ir`, AMX's `gemm_amx_ir`) against float64 products
of the same bf16-rounded operands: the kernels must add exactly those products in float32."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from bench import nets
from engine.cpu import compiled, host_features, spin_pool
from engine.kernels import bf16, gemm_bind, gemm_kernel, gemm_preact, gemm_tile_handoff
from engine.kernels.conv_bind import _patch_view
from engine.kernels.gemm_bf16_ir import PairTileKernel
from engine.kernels.workspace import Workspace

RNG = np.random.default_rng(5)

needs_bf16 = pytest.mark.skipif(not gemm_kernel.available(gemm_kernel.BF16),
                                reason="this CPU lacks AVX-512 BF16")
needs_amx = pytest.mark.skipif(not gemm_kernel.available(gemm_kernel.AMX),
                               reason="this CPU lacks AMX-BF16 or Linux refused its tile state")


def random(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape, dtype=np.float32)


def expected(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The product of the bf16-rounded operands, in float64."""
    return bf16.rounded(a).astype(np.float64) @ bf16.rounded(b).astype(np.float64)


def assert_product(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    # Products of bf16 values are exact in float32; only the float32 sums round (K terms).
    np.testing.assert_allclose(c, expected(a, b), rtol=1e-5, atol=1e-5 * np.sqrt(a.shape[1]))


SHAPES = [(1, 1, 1), (1, 7, 33), (5, 2, 3), (12, 64, 32), (13, 65, 31), (33, 129, 65),
          (64, 576, 196), (1, 512, 100)]


@needs_bf16
@pytest.mark.parametrize(("rows", "depth", "columns"), SHAPES)
def test_the_avx512_bf16_kernel_adds_the_rounded_products(rows: int, depth: int,
                                                          columns: int) -> None:
    a, b = random(rows, depth), random(depth, columns)
    c = np.full((rows, columns), np.nan, np.float32)
    gemm_kernel.bind_packed_columns(bf16.pair_rows(a),
                                    gemm_kernel.pack_columns(bf16.pair_columns(b)), c,
                                    kernel=gemm_kernel.BF16)()
    assert_product(c, a, b)
    c[...] = np.nan
    panels = np.zeros(bf16.paired_shape(b.shape, False, gemm_kernel.tile().columns), np.float32)
    bf16._pair_in_numpy(b, panels, False)
    gemm_kernel.bind_both_packed(gemm_kernel.pack(bf16.pair_rows(a)), panels, c,
                                 kernel=gemm_kernel.BF16)()
    assert_product(c, a, b)


@needs_amx
@pytest.mark.parametrize(("rows", "depth", "columns"), SHAPES)
@pytest.mark.parametrize("columns_outside", [True, False])
@pytest.mark.parametrize("packed", [False, True])
def test_the_amx_kernel_adds_the_rounded_products(rows: int, depth: int, columns: int,
                                                  columns_outside: bool, packed: bool) -> None:
    a, b = random(rows, depth), random(depth, columns)
    c = np.full((rows, columns), np.nan, np.float32)
    words = bf16.amx_weight_rows(a)
    if packed:
        words = bf16.amx_pack_rows(words)
    gemm_kernel.bind_tiles(words, bf16.amx_weight_columns(b), c, columns_outside, packed)()
    assert_product(c, a, b)


@needs_amx
@pytest.mark.parametrize(("rows", "depth", "columns", "count", "step"),
                         [(64, 96, 112, 5, 28), (20, 32, 17, 3, 0), (33, 160, 40, 4, 80)])
def test_a_batch_of_amx_products_reads_its_rows_a_step_apart(rows: int, depth: int,
                                                            columns: int, count: int,
                                                            step: int) -> None:
    """Product i reads B's K rows from row i · step (the products may share rows) and writes
    C moved i rows of a larger output on: each is the rounded operands' product, and the
    output's rows outside every C keep their values."""
    a = random(rows, depth)
    values = random(2 * (count - 1) * step + depth, columns)  # K values, two a word row
    b = bf16.amx_weight_columns(values)
    out = np.full((rows, count + 1, columns), 7.0, np.float32)
    tiles = bf16.amx_pack_rows(bf16.amx_weight_rows(a))
    gemm_kernel.bind_tiles_batch(tiles, b, out[:, 0, :], count, step, columns * 4)()
    for i in range(count):
        assert_product(out[:, i, :], a, values[2 * i * step:2 * i * step + depth])
    assert (out[:, count, :] == 7.0).all()


@needs_amx
def test_a_batch_of_amx_products_past_its_rows_is_refused() -> None:
    tiles = bf16.amx_pack_rows(bf16.amx_weight_rows(random(32, 32)))
    b = np.zeros((40, 32), np.float32)
    out = np.zeros((32, 4, 32), np.float32)
    with pytest.raises(ValueError, match="hold every product's rows"):
        gemm_kernel.bind_tiles_batch(tiles, b, out[:, 0, :], 4, 10, 128)  # 30 + 16 > 40


def test_amx_packing_lays_each_tile_out_whole() -> None:
    words = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    tiles = bf16.amx_pack_rows(words).reshape(2, 2, 2, 16, 16)  # blocks, K steps, halves
    np.testing.assert_array_equal(tiles[1, 0, 1], words[48:64, 0:16])
    np.testing.assert_array_equal(tiles[0, 1, 0], words[0:16, 16:32])


@needs_amx
def test_the_amx_epilogue_adds_biases_and_clamps_within_its_rows() -> None:
    a, b = random(40, 100), random(100, 50)
    bias_rows, bias_columns = random(40), random(50)
    # C is a window of a larger array: the kernel must write only its own rows and columns.
    whole = np.full((42, 60), 7.0, np.float32)
    c = whole[1:41, 3:53]
    gemm_kernel.bind_tiles(bf16.amx_weight_rows(a), bf16.amx_weight_columns(b), c) \
        .with_epilogue(bias_rows, bias_columns, low=-1.0, high=2.0)()
    want = np.clip(expected(a, b) + bias_rows[:, None] + bias_columns[None, :], -1.0, 2.0)
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-4)
    outside = np.ones(whole.shape, bool)
    outside[1:41, 3:53] = False
    assert (whole[outside] == 7.0).all()


@needs_amx
@pytest.mark.parametrize(("rows", "columns"), [(64, 64), (40, 50), (3, 17)])
def test_the_amx_epilogue_adds_a_residual_before_its_clamp(rows: int, columns: int) -> None:
    a, b, bias = random(rows, 70), random(70, columns), random(rows)
    out = np.full((2, rows, columns), 7.0, np.float32)
    other = random(2, rows, columns)
    gemm_kernel.bind_tiles(bf16.amx_weight_rows(a), bf16.amx_weight_columns(b), out[0]) \
        .with_epilogue(bias_rows=bias).with_residual(out, other).with_epilogue(low=0.0)()
    want = np.maximum(expected(a, b) + bias[:, None] + other[0], 0.0)
    np.testing.assert_allclose(out[0], want, rtol=1e-5, atol=1e-4)
    assert (out[1] == 7.0).all()


@needs_amx
def test_amx_operands_must_be_padded() -> None:
    a, b = random(20, 30), random(30, 20)
    with pytest.raises(ValueError, match="padded to whole tiles"):
        gemm_kernel.bind_tiles(bf16.pair_rows(a), bf16.pair_columns(b),
                               np.zeros((20, 20), np.float32))


def test_the_bf16_kernels_are_there_exactly_where_the_host_has_the_instructions() -> None:
    assert gemm_kernel.available(gemm_kernel.BF16) == (
        gemm_kernel.available() and host_features.bf16_dot_product())
    if gemm_kernel.available(gemm_kernel.AMX):
        assert host_features.amx_permitted()


@needs_bf16
@pytest.mark.parametrize(("filters", "channels", "size", "outside"), [
    (64, 64, (56, 56), True),  # the weight's pairs smaller than the patches': column panels
    (512, 512, (7, 7), False),  # the patches' smaller: the weight's row blocks outside
    (13, 5, (9, 11), True),  # an odd K (45), a short row block, a last narrow panel
])
def test_a_3x3_product_on_avx512_bf16_pairs_the_patches_straight_from_the_input(
        filters: int, channels: int, size: tuple[int, int], outside: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without AMX (or with it refused), a bf16 plan's 3×3 product pairs its patches from the
    padded input into word rows (no im2col copy) that the AVX-512 BF16 tile reads where they
    lie, re-reading the smaller operand; the sums are those of the rounded operands."""
    monkeypatch.setattr(gemm_bind, "AMX_MIN_ROWS", 1 << 30)
    padded = random(1, channels, size[0] + 2, size[1] + 2)
    view = _patch_view(np, padded, (3, 3), (1, 1), (1, 1), size)
    weight = random(filters, channels * 9)
    weight.flags.writeable = False  # a plan constant
    out = np.full((filters, size[0] * size[1]), np.nan, np.float32)
    call = gemm_bind.bf16_patch_product(weight, view, 3, out,
                                        Workspace(np, 0, precision="bf16"))
    assert isinstance(call, bf16.PairedProduct)
    assert call.product.columns_outside is outside
    call()
    patches = np.ascontiguousarray(view).reshape(channels * 9, -1)
    assert_product(out, weight, patches)


@needs_bf16
@pytest.mark.parametrize(("rows", "depth", "columns", "weight_streams"), [
    (200, 96, 49, True),  # a 1×1 layer at 7²: its weight outweighs its activation
    (24, 144, 300, False),  # a projection at 56² (fewer columns here): the activation does
    (13, 65, 14, True),  # odd K and rows: the pad word and the edge tiles
    (256, 64, 3136, True),  # an output past the cache from small activations: row blocks
    (128, 256, 3136, False),  # activations as large as the output: column panels
])
def test_a_bf16_weight_product_reads_the_larger_operand_once(
        monkeypatch: pytest.MonkeyPatch, rows: int, depth: int, columns: int,
        weight_streams: bool) -> None:
    """On the AVX-512 BF16 tile, a weight whose pairs outweigh the activation's is read
    once, row blocks outside, the activation paired into word rows the blocks re-read from
    cache, as it is where the output would stream to memory (`gemm_bind.rows_outside`); a
    smaller one meets the activation's column panels, each read once: either way the
    rounded operands' product, with a residual."""
    monkeypatch.setattr(gemm_kernel, "available", lambda kernel=None: kernel != gemm_kernel.AMX)
    weight, data, residual = random(rows, depth), random(depth, columns), random(rows, columns)
    weight.flags.writeable = False  # a plan constant
    out = np.full((rows, columns), np.nan, np.float32)
    call = gemm_bind.weight_product(np, weight, data, out, Workspace(np, 0, precision="bf16"))
    field = gemm_kernel.CONTEXT_FIELDS
    assert int(call.product.context[field["columns_outside"]]) == (not weight_streams)
    (call,) = gemm_bind.with_residual([call], out, residual)
    call()
    np.testing.assert_allclose(out, expected(weight, data) + residual, rtol=1e-5,
                               atol=1e-5 * np.sqrt(depth))


@needs_bf16
@pytest.mark.parametrize("columns", [1, 5, gemm_bind.BF16_TRANSPOSED_COLUMNS])
@pytest.mark.parametrize("armed", [False, True])
def test_a_bf16_product_of_few_columns_runs_transposed(monkeypatch, columns: int,
                                                       armed: bool) -> None:
    """On the AVX-512 BF16 tile, a weight's product over a few columns (a classifier as a
    1×1 convolution at batch 1) runs as its transpose into scratch, copied back
    (`gemm_bind.Transposed`): the rounded operands' product with the filters' bias, a
    residual and the clamp, on one thread and armed on two; past
    `BF16_TRANSPOSED_COLUMNS` columns it runs as it is."""
    monkeypatch.setattr(gemm_kernel, "available", lambda kernel=None: kernel != gemm_kernel.AMX)
    rows, depth = 80, 200
    weight, data = random(rows, depth), random(depth, columns)
    weight.flags.writeable = False  # a plan constant
    bias, residual = random(rows), random(rows, columns)
    out = np.full((rows, columns), np.nan, np.float32)
    workspace = Workspace(np, 0, precision="bf16")
    call = gemm_bind.weight_product(np, weight, data, out, workspace)
    assert isinstance(call, gemm_bind.Transposed)
    (call,) = gemm_bind.with_residual(gemm_bind.with_bias([call], bias_rows=bias), out, residual)
    (call,) = gemm_bind.clamped([call], -1.0, 1.5)
    if armed:
        with spin_pool.armed(2):
            call()
    else:
        call()
    want = np.clip(expected(weight, data) + bias[:, None] + residual, -1.0, 1.5)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.sqrt(depth))
    wide = np.zeros((rows, gemm_bind.BF16_TRANSPOSED_COLUMNS + 1), np.float32)
    plain = gemm_bind.weight_product(np, weight, random(depth, wide.shape[1]), wide, workspace)
    assert not isinstance(plain, gemm_bind.Transposed)


@needs_amx
@pytest.mark.parametrize(("rows", "depth", "columns", "outside"), [
    (256, 64, 3136, False),  # an output past the cache from small activations: row blocks
    (128, 256, 3136, True),  # activations as large as the output: re-read once, columns
    (64, 64, 3136, True),  # an output that stays in cache: columns
])
def test_a_weight_product_walks_a_large_output_by_row_blocks(rows: int, depth: int,
                                                              columns: int,
                                                              outside: bool) -> None:
    """A bf16 plan's 1×1 product on AMX whose output would stream to memory writes it row
    block by row block (32 rows end to end), unless the activations it would then re-read
    per block are as large; the sums are the same either way."""
    weight, data = random(rows, depth), random(depth, columns)
    weight.flags.writeable = False  # a plan constant
    out = np.full((rows, columns), np.nan, np.float32)
    call = gemm_bind.weight_product(np, weight, data, out, Workspace(np, 0, precision="bf16"))
    assert call.product.columns_outside is outside
    call()
    assert_product(out, weight, data)


@needs_amx
@pytest.mark.parametrize(("rows", "depth", "columns"), [
    (64, 64, 3136),  # K of 2 steps: the pending tile's rows in two shares
    (13, 65, 31),  # one edge tile, alone in its part
    (70, 33, 97),  # edge rows and columns after whole tiles
    (40, 1600, 70),  # K past INTERLEAVED_STEPS: each tile stored after its own sums
])
@pytest.mark.parametrize("columns_outside", [True, False])
def test_each_amx_tile_is_stored_between_the_next_ones_steps_on_one_or_two_threads(
        rows: int, depth: int, columns: int, columns_outside: bool) -> None:
    """A part holds each tile's sums until the next tile's steps of K store them (the last
    tile's after its loop): every tile, whole or edge, gets its own biases, residual and
    clamp, on one thread and split into parts over two."""
    a, b = random(rows, depth), random(depth, columns)
    bias_rows, bias_columns = random(rows), random(columns)
    out = np.full((2, rows, columns), 7.0, np.float32)
    other = random(2, rows, columns)
    product = gemm_kernel.bind_tiles(
        bf16.amx_weight_rows(a), bf16.amx_weight_columns(b), out[0], columns_outside) \
        .with_epilogue(bias_rows, bias_columns).with_residual(out, other) \
        .with_epilogue(low=-0.5, high=3.0)
    product()
    want = np.clip(expected(a, b) + bias_rows[:, None] + bias_columns[None, :] + other[0],
                   -0.5, 3.0)
    np.testing.assert_allclose(out[0], want, rtol=1e-5, atol=1e-5 * np.sqrt(depth))
    assert (out[1] == 7.0).all()
    alone = out[0].copy()
    with spin_pool.armed(2):
        for _ in range(3):
            out[0] = np.nan
            product()
            np.testing.assert_array_equal(out[0], alone)


@needs_amx
def test_an_amx_part_runs_its_tiles_through_the_interleaved_tile() -> None:
    """The part's tiles are `define_interleaved_tile`'s, whose K loop stores the tile before
    (the whole-tile functions only over a long K), the last one's stored after the loop."""
    from engine.kernels.gemm_amx_ir import AmxTileKernel

    tiles = AmxTileKernel(gemm_kernel.AMX_TILE)
    tiles.define_part("part", tiles.define_full("tile_full"), tiles.define_edge("tile_edge"),
                      gemm_kernel.CONTEXT_FIELDS)
    part = tiles.module.get_global("part")
    called = {instruction.callee.name for block in part.blocks
              for instruction in block.instructions if hasattr(instruction, "callee")}
    assert "part_tile" in called and "part_rows_epilogue" in called
    interleaved = tiles.module.get_global("part_tile")
    assert any(getattr(instruction, "callee", None) is tiles.module.get_global(
        "part_rows_epilogue") for block in interleaved.blocks
        for instruction in block.instructions)


@needs_bf16
@pytest.mark.parametrize(("network", "side"), [("mobilenet_v2", 112), ("resnet50_v2", 72)])
def test_networks_give_the_same_bits_with_their_edge_columns_summed_a_column_to_a_vector(
        monkeypatch: pytest.MonkeyPatch, network: str, side: int) -> None:
    """MobileNet v2 at 112² (its 1×1 layers at 14² and 7²: 196 and 49 pixels) and ResNet-50
    v2 at 72² (18² and 9²: 324 and 81) in bf16 on the AVX-512 BF16 tile, whose edge tiles'
    last columns then run a column to a vector through the epilogues those networks bind
    (bf16 halves for a depthwise reader, words for a 1×1 reader, a residual): the outputs
    are those of the kernels summing every column in whole vectors (`side_columns` 0), bit
    for bit."""
    monkeypatch.setattr(gemm_kernel, "available", lambda kernel=None: kernel != gemm_kernel.AMX)
    symbol = getattr(nets, network)(classes=10)
    params = nets.random_params(symbol, (1, 3, side, side))
    feed = {"data": np.random.default_rng(3).standard_normal((1, 3, side, side),
                                                             dtype=np.float32)}

    def output() -> np.ndarray:
        model = engine.load_model(symbol, params, optimize=True, precision="bf16")
        return np.asarray(next(iter(model.infer(feed).values()))).copy()

    assert PairTileKernel.side_columns > 0
    with_sides = output()
    # The modules holding the tile's functions (the products', the bf16 halves' and the
    # pre-activation words') made again with none summed a column to a vector.
    with compiled.remade(gemm_kernel._state, gemm_tile_handoff._state, gemm_preact._state):
        kept, PairTileKernel.side_columns = PairTileKernel.side_columns, 0
        try:
            whole_vectors = output()
        finally:
            PairTileKernel.side_columns = kept
    assert np.array_equal(with_sides.view(np.uint32), whole_vectors.view(np.uint32))
