"""The direct bf16 convolution over a channels-last grid (`engine.kernels.conv_amx_lines` and
`conv_amx.bind(..., lines=True)`): its grid and weights laid out as the AMX tiles read them,
against a float64 convolution of the bf16-rounded operands, and where `conv_amx` picks it."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from bench import nets
from engine.cpu import spin_pool
from engine.kernels import bf16, conv_amx, conv_amx_lines, gemm_bind
from engine.kernels.workspace import empty_aligned
from tests.engine.kernels.test_conv_amx import (
    assert_armed_runs_store,
    bf16_workspace,
    constant,
    operands,
    reference,
    relative_error,
)

needs_direct = pytest.mark.skipif(not conv_amx.available(),
                                  reason="this CPU or kernel lacks AMX-BF16")
RNG = np.random.default_rng(23)


def bind_lines(data: np.ndarray, weight: np.ndarray, out: np.ndarray, kernel: tuple[int, int],
               pad: tuple[int, int], dilate: tuple[int, int] = (1, 1)) -> bf16.PairedProduct:
    return conv_amx.bind(data, weight, out, (kernel, (1, 1), dilate, pad), bf16_workspace(),
                         lines=True)


@needs_direct
@pytest.mark.parametrize(("batch", "channels", "size", "filters", "kernel", "pad", "dilate"), [
    (1, 128, (28, 28), 128, (3, 3), (1, 1), (1, 1)),  # ResNet-18's second stage
    (3, 5, (7, 9), 33, (3, 3), (1, 1), (1, 1)),  # odd C, F past a row block, three images
    (1, 3, (1, 20), 40, (3, 3), (1, 0), (1, 1)),  # one row, W not a multiple of 16
    (1, 7, (5, 5), 16, (3, 3), (0, 0), (1, 1)),  # no padding
    (3, 66, (7, 7), 96, (3, 3), (1, 1), (1, 1)),  # C past one step of K: three channel lines
    (1, 8, (11, 13), 20, (3, 3), (2, 2), (2, 2)),  # dilated
    (2, 6, (9, 10), 32, (2, 3), (0, 1), (1, 1)),  # a non-square kernel
])
def test_the_channels_last_product_matches_the_rounded_reference(
        batch: int, channels: int, size: tuple[int, int], filters: int,
        kernel: tuple[int, int], pad: tuple[int, int], dilate: tuple[int, int]) -> None:
    """Each tile's pixels × filters sums come out transposed into NCHW, every pixel written;
    a second run lays the new input into the grid."""
    data, weight = operands(batch, channels, size, filters, kernel)
    want = reference(bf16.rounded(data), bf16.rounded(weight), pad, dilate)
    out = np.full(want.shape, np.nan, np.float32)
    call = bind_lines(data, weight, out, kernel, pad, dilate)
    call()
    # Both operands are exactly bf16, so only float32 accumulation differs.
    assert relative_error(out, want) < 1e-5
    data[...] = RNG.standard_normal(data.shape)
    call()
    want = reference(bf16.rounded(data), bf16.rounded(weight), pad, dilate)
    assert relative_error(out, want) < 1e-5


@needs_direct
@pytest.mark.parametrize(("batch", "channels", "size", "filters"), [
    (1, 20, (13, 21), 40),  # 9 steps: the epilogue between the next tile's steps
    (3, 100, (6, 7), 72),  # 36 steps, three images
    (1, 170, (5, 9), 40),  # 54 steps: each tile stored after its own sums
])
@pytest.mark.parametrize("residual", [False, True])
def test_the_bias_residual_and_clamp_apply_as_in_the_grid_of_pairs(
        batch: int, channels: int, size: tuple[int, int], filters: int,
        residual: bool) -> None:
    """The epilogue reads the transposed sums as it reads the grid of pairs' (bias, then
    the residual, then the clamp): the same bytes as `conv_amx`'s own product, whose sums
    are in the same order, on one thread and over parts on two."""
    data, weight = operands(batch, channels, size, filters, (3, 3))
    bias = constant(RNG.standard_normal(filters).astype(np.float32))
    other = RNG.standard_normal((batch, filters, *size)).astype(np.float32)
    outs = []
    for lines in (False, True):
        out = np.full(other.shape, np.nan, np.float32)
        call = conv_amx.bind(data, weight, out, ((3, 3), (1, 1), (1, 1), (1, 1)),
                             bf16_workspace(), lines=lines)
        call = call.with_epilogue(bias_rows=bias, low=0.0)
        if residual:
            call = call.with_residual(out, other)
        call()
        outs.append((out, call))
    (pairs, _), (out, call) = outs
    summed = reference(bf16.rounded(data), bf16.rounded(weight), (1, 1), (1, 1))
    want = np.maximum(summed + bias[None, :, None, None] + (other if residual else 0.0), 0.0)
    assert relative_error(out, want) < 1e-5
    assert (out == 0.0).any()  # the clamp took
    np.testing.assert_array_equal(out, pairs)
    assert_armed_runs_store(out, out.copy(), call)


@needs_direct
def test_the_grid_holds_each_pixels_rounded_channels_in_a_bordered_grid() -> None:
    """Pixel (y, x) of image n at grid pixel n·image + (y + pad)·Wp + x + pad, its channels
    as bf16 one after another and zeros past them; the border zero."""
    batch, channels, height, width = 2, 37, 5, 19
    data = RNG.standard_normal((batch, channels, height, width)).astype(np.float32)
    grid_height, grid_width = height + 2, width + 2
    image = grid_height * grid_width
    words = 32  # 37 channels padded to 64: two lines a pixel
    cells = empty_aligned(np, (batch * image, words), np.float32)
    cells[...] = 0.0
    table = conv_amx_lines.pixel_table(data.shape, grid_width, (1, 1))
    conv_amx_lines.grid_pass(conv_amx._compiled_lines()["lines_grid"], data, cells, table,
                             image)()
    halves = cells.view(np.uint16).reshape(batch, grid_height, grid_width, 2 * words)
    want = np.zeros_like(halves)
    want[:, 1:-1, 1:-1, :channels] = bf16.round_to_bf16(data.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(halves, want)


def test_the_grid_pass_refuses_a_grid_too_narrow_too_short_or_unaligned() -> None:
    data = np.zeros((1, 40, 4, 4), np.float32)
    table = conv_amx_lines.pixel_table(data.shape, 6, (1, 1))
    with pytest.raises(ValueError, match="cannot hold 40 channels"):
        conv_amx_lines.grid_pass(0, data, empty_aligned(np, (36, 16), np.float32), table, 36)
    with pytest.raises(ValueError, match="too small for 1 images of 36"):
        conv_amx_lines.grid_pass(0, data, empty_aligned(np, (20, 32), np.float32), table, 36)
    shifted = empty_aligned(np, 37 * 32 + 4, np.float32)[4:].reshape(37, 32)
    with pytest.raises(ValueError, match="from a 64-byte boundary"):
        conv_amx_lines.grid_pass(0, data, shifted, table, 36)


def test_the_weights_are_tiles_of_channel_pairs_by_filters() -> None:
    """Per block of 32 filters and step of K: two tiles, word (p, f) holding channels 2p and
    2p + 1 of filter f (the tile's first or second 16) at the step's tap, bf16 low then
    high."""
    filters, channels = 40, 20
    weight = RNG.standard_normal((filters, channels, 3, 3)).astype(np.float32)
    words = 16
    tiles = conv_amx_lines.weight_tiles(weight, words)
    assert tiles.shape == (64, 9 * words)
    halves = tiles.view(np.uint16).reshape(2, 9, 2, 16, 16, 2)  # block, step, tile, p, f, half
    rounded = np.zeros((64, channels + 12, 3, 3), np.uint16)
    rounded[:filters, :channels] = bf16.round_to_bf16(weight)
    for block, step, tile, pair, filter_, half in [(0, 0, 0, 0, 0, 0), (0, 4, 1, 3, 5, 1),
                                                    (1, 8, 0, 9, 7, 0), (1, 2, 0, 15, 3, 1)]:
        row, column = divmod(step, 3)
        f = 32 * block + 16 * tile + filter_
        want = rounded[f, 2 * pair + half, row, column]
        assert halves[block, step, tile, pair, filter_, half] == want


@needs_direct
def test_a_strided_convolution_is_refused_over_a_channels_last_grid() -> None:
    data, weight = operands(1, 8, (6, 6), 16, (3, 3))
    out = np.empty((1, 16, 3, 3), np.float32)
    with pytest.raises(ValueError, match=r"channels-last grid has stride 1; got \(2, 2\)"):
        conv_amx.bind(data, weight, out, ((3, 3), (2, 2), (1, 1), (1, 1)), bf16_workspace(),
                      lines=True)


class Offer:
    """A writer's hand-off as `conv_amx.reads_lines` sees it."""

    def __init__(self, readers: int, grids: bool) -> None:
        self.readers, self.grids, self.layout = readers, grids, None


@needs_direct
@pytest.mark.parametrize(("shape", "stride", "offer", "reads"), [
    ((1, 128, 28, 28), (1, 1), None, True),
    ((8, 512, 7, 7), (1, 1), None, True),
    ((1, 64, 56, 56), (1, 1), None, False),  # under `LINES_MIN_CHANNELS`
    ((1, 128, 28, 28), (2, 2), None, False),  # phase planes: the grid of pairs
    ((1, 128, 28, 28), (1, 1), Offer(1, True), False),  # its one reader: laid, no pass
    ((1, 128, 28, 28), (1, 1), Offer(2, True), True),  # another reader: never laid
    ((1, 128, 28, 28), (1, 1), Offer(1, False), True),  # a writer of no such grid
])
def test_a_direct_convolution_of_stride_1_over_enough_channels_reads_lines(
        shape: tuple[int, ...], stride: tuple[int, int], offer: Offer | None,
        reads: bool) -> None:
    geometry = ((3, 3), stride, (1, 1), (1, 1))
    assert conv_amx.reads_lines(shape, geometry, offer) is reads


@needs_direct
def test_bound_in_chunks_the_channels_last_product_takes_a_layers_epilogue() -> None:
    """`bind_chunks` picks the channels-last grid for a layer of 128 channels (`reads_lines`)
    and each chunk adds its images' residual."""
    data, weight = operands(3, 128, (6, 6), 32, (3, 3))
    bias = constant(RNG.standard_normal(32).astype(np.float32))
    other = RNG.standard_normal((3, 32, 6, 6)).astype(np.float32)
    out = np.full(other.shape, np.nan, np.float32)
    calls = conv_amx.bind_chunks(data, weight, out, ((3, 3), (1, 1), (1, 1), (1, 1)),
                                 bf16_workspace())
    assert all(call.product.functions is conv_amx._compiled_lines() for call in calls)
    fused = gemm_bind.clamped(gemm_bind.with_residual(
        [call.with_epilogue(bias_rows=bias) for call in calls], out, other), 0.0, np.inf)
    with spin_pool.armed(2):
        for call in fused:
            call()
    summed = reference(bf16.rounded(data), bf16.rounded(weight), (1, 1), (1, 1))
    want = np.maximum(summed + bias[None, :, None, None] + other, 0.0)
    assert relative_error(out, want) < 1e-5



def lines_nodes(model: engine.Model, feed: dict[str, np.ndarray]) -> int:
    """How many of the plan's nodes run the channels-last product."""
    lines = conv_amx._compiled_lines()
    return len({id(step.node) for step in model.plan_for(feed).steps
                if isinstance(step.call, bf16.PairedProduct)
                and isinstance(step.call.product, conv_amx.DirectProduct)
                and step.call.product.functions is lines})


@needs_direct
@pytest.mark.parametrize(("batch", "lines"), [
    (2, 9),  # every 3×3 of stride 1 over 128 channels or more
    (1, 8),  # but stage 2's second block's second: its writer lays its grid of pairs
])
def test_resnet18_over_channels_last_grids_agrees_with_the_grids_of_pairs(
        monkeypatch: pytest.MonkeyPatch, batch: int, lines: int) -> None:
    """A whole bf16 ResNet-18 (112×112) with its 3×3 layers of stride 1 over 128 channels or
    more on channels-last grids, against the same plan with none: the same top-1 class,
    logits within bf16's error (the same rounded operands, summed in another order)."""
    symbol = nets.resnet18_v1()
    params = nets.random_params(symbol, (1, 3, 112, 112), seed=5)
    feed = {"data": RNG.standard_normal((batch, 3, 112, 112)).astype(np.float32)}
    model = engine.load_model(symbol, params, precision="bf16")
    got = model.infer(feed)["output_output"]
    assert lines_nodes(model, feed) == lines
    monkeypatch.setattr(conv_amx, "LINES_MIN_CHANNELS", 1 << 30)
    pairs = engine.load_model(symbol, params, precision="bf16")
    want = pairs.infer(feed)["output_output"]
    assert lines_nodes(pairs, feed) == 0
    assert relative_error(got, want) < 1e-2
    np.testing.assert_array_equal(np.argmax(got, axis=1), np.argmax(want, axis=1))
