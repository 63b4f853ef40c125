"""The direct bf16 convolution on AMX and on AVX-512 BF16's register tiles
(`engine.kernels.conv_amx`): against a float64 convolution of the bf16-rounded operands, its
epilogue, where a plan takes it, and a whole ResNet-18 against the im2col form."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import engine
from bench import nets
from engine.cpu import spin_pool
from engine.kernels import bf16, conv_amx, conv_bind, gemm_bind, gemm_kernel
from engine.kernels.workspace import Workspace

needs_direct = pytest.mark.skipif(not conv_amx.available(),
                                  reason="this CPU or kernel lacks AMX-BF16")
needs_tiles = pytest.mark.skipif(not conv_amx.bf16_tiles_available(),
                                 reason="this CPU lacks AVX-512 BF16")
SHAPES = [
    (1, 64, (56, 56), 64, (3, 3), (1, 1), (1, 1)),  # ResNet's first stage
    (2, 5, (7, 9), 33, (3, 3), (1, 1), (1, 1)),  # odd C, rows past a tile, two images
    (1, 3, (1, 20), 40, (3, 3), (1, 0), (1, 1)),  # one row, W not a multiple of 16
    (1, 7, (5, 5), 16, (3, 3), (0, 0), (1, 1)),  # no padding
    (3, 66, (7, 7), 96, (3, 3), (1, 1), (1, 1)),  # C past one step of K, three images
    (1, 8, (11, 13), 20, (3, 3), (2, 2), (2, 2)),  # dilated
    (2, 6, (9, 10), 32, (2, 3), (0, 1), (1, 1)),  # a non-square kernel
]
RNG = np.random.default_rng(17)


def reference(data: np.ndarray, weight: np.ndarray, pad: tuple[int, int],
              dilate: tuple[int, int], stride: tuple[int, int] = (1, 1)) -> np.ndarray:
    """The convolution in float64, tap by tap (at stride 1, then every stride-th pixel)."""
    filters, _, kernel_h, kernel_w = weight.shape
    padded = np.pad(data.astype(np.float64), ((0, 0), (0, 0), (pad[0],) * 2, (pad[1],) * 2))
    height = padded.shape[2] - dilate[0] * (kernel_h - 1)
    width = padded.shape[3] - dilate[1] * (kernel_w - 1)
    out = np.zeros((data.shape[0], filters, height, width))
    for row in range(kernel_h):
        for column in range(kernel_w):
            window = padded[:, :, row * dilate[0]:row * dilate[0] + height,
                            column * dilate[1]:column * dilate[1] + width]
            out += np.einsum("fc,nchw->nfhw", weight[:, :, row, column], window)
    return out[:, :, ::stride[0], ::stride[1]]


def constant(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False  # as a plan hands out its weights
    return array


def operands(batch: int, channels: int, size: tuple[int, int], filters: int,
             kernel: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    data = RNG.standard_normal((batch, channels, *size)).astype(np.float32)
    weight = RNG.standard_normal((filters, channels, *kernel)).astype(np.float32)
    return data, constant(weight)


def bf16_workspace() -> Workspace:
    return Workspace(np, 0, precision="bf16")


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def assert_armed_runs_store(out: np.ndarray, alone: np.ndarray, run: Callable[[], object]) -> None:
    """Three runs of ``run`` armed over two threads, ``out`` cleared to NaN before each: each
    leaves ``out`` equal to ``alone`` (what one thread stored), byte for byte."""
    with spin_pool.armed(2):
        for _ in range(3):
            out[...] = np.nan
            run()
            np.testing.assert_array_equal(out, alone)


@needs_direct
@pytest.mark.parametrize(("batch", "channels", "size", "filters", "kernel", "pad", "dilate"),
                         SHAPES)
@pytest.mark.parametrize("stride", [(1, 1), (2, 2)])
def test_direct_convolution_matches_the_rounded_reference(
        batch: int, channels: int, size: tuple[int, int], filters: int,
        kernel: tuple[int, int], pad: tuple[int, int], dilate: tuple[int, int],
        stride: tuple[int, int]) -> None:
    """At stride 2 the input is paired into four phase planes (`conv_amx._Grid`)."""
    data, weight = operands(batch, channels, size, filters, kernel)
    want = reference(bf16.rounded(data), bf16.rounded(weight), pad, dilate, stride)
    out = np.full(want.shape, np.nan, np.float32)  # every pixel must be written
    geometry = (kernel, stride, dilate, pad)
    call = conv_amx.bind(data, weight, out, geometry, bf16_workspace())
    call()
    # Both operands are exactly bf16, so only float32 accumulation differs.
    assert relative_error(out, want) < 1e-5
    data[...] = RNG.standard_normal(data.shape)  # a second run pairs the new input
    call()
    want = reference(bf16.rounded(data), bf16.rounded(weight), pad, dilate, stride)
    assert relative_error(out, want) < 1e-5


@needs_tiles
@pytest.mark.parametrize(("batch", "channels", "size", "filters", "kernel", "pad", "dilate"),
                         SHAPES)
@pytest.mark.parametrize("stride", [(1, 1), (2, 2)])
def test_avx512_bf16_tiles_match_the_rounded_reference(
        batch: int, channels: int, size: tuple[int, int], filters: int,
        kernel: tuple[int, int], pad: tuple[int, int], dilate: tuple[int, int],
        stride: tuple[int, int]) -> None:
    """The AVX-512 BF16 form (`conv_bf16_ir`: tiles of 8 filters, filters past a whole
    block, grid columns past a row's width dropped) over the same grid: the rounded
    operands' convolution with a bias, a residual and a clamp, on one thread, armed over
    two, and again for a new input."""
    data, weight = operands(batch, channels, size, filters, kernel)
    summed = reference(bf16.rounded(data), bf16.rounded(weight), pad, dilate, stride)
    bias = constant(RNG.standard_normal(filters).astype(np.float32))
    other = RNG.standard_normal(summed.shape).astype(np.float32)
    out = np.full(summed.shape, np.nan, np.float32)  # every pixel must be written
    call = conv_amx.bind(data, weight, out, (kernel, stride, dilate, pad), bf16_workspace(),
                         isa=gemm_kernel.BF16)
    call = call.with_epilogue(bias_rows=bias, low=-1.0, high=2.5).with_residual(out, other)
    call()
    want = np.clip(summed + bias[None, :, None, None] + other, -1.0, 2.5)
    # Both operands are exactly bf16, so only float32 accumulation differs.
    assert relative_error(out, want) < 1e-5
    assert_armed_runs_store(out, out.copy(), call)
    data[...] = RNG.standard_normal(data.shape)  # a second run pairs the new input
    call()
    summed = reference(bf16.rounded(data), bf16.rounded(weight), pad, dilate, stride)
    want = np.clip(summed + bias[None, :, None, None] + other, -1.0, 2.5)
    assert relative_error(out, want) < 1e-5


@needs_tiles
@pytest.mark.parametrize(("batch", "channels", "size", "filters", "kernel", "pad", "dilate",
                          "stride"), [
    (1, 128, (14, 14), 70, (3, 3), (1, 1), (1, 1), (1, 1)),  # filters past a whole block
    (1, 256, (7, 7), 64, (3, 3), (1, 1), (1, 1), (1, 1)),  # 49 pixels: 3 tiles of 2 runs, 1 of 1
    (2, 130, (14, 28), 33, (3, 3), (1, 1), (1, 1), (2, 2)),  # phase planes, odd C, 2 images
    (1, 64, (14, 14), 40, (5, 5), (2, 2), (1, 1), (1, 1)),  # 25 taps
    (1, 128, (14, 14), 32, (3, 3), (2, 2), (2, 2), (1, 1)),  # dilated
])
def test_avx512_bf16_pixel_tiles_match_the_grid_columns_tiles(
        monkeypatch: pytest.MonkeyPatch, batch: int, channels: int, size: tuple[int, int],
        filters: int, kernel: tuple[int, int], pad: tuple[int, int], dilate: tuple[int, int],
        stride: tuple[int, int]) -> None:
    """The pixel tiles (`conv_bf16_pixels_ir`: filters in the lanes, runs of 7 pixels) over a
    K of `PIXELS_MIN_DEPTH` or more: the rounded operands' convolution with a bias, a
    residual and a clamp, on one thread and armed over two, again for a new input, and the
    grid-column tiles' sums bit for bit (each sums K in the same order)."""
    data, weight = operands(batch, channels, size, filters, kernel)
    summed = reference(bf16.rounded(data), bf16.rounded(weight), pad, dilate, stride)
    bias = constant(RNG.standard_normal(filters).astype(np.float32))
    other = RNG.standard_normal(summed.shape).astype(np.float32)
    geometry = (kernel, stride, dilate, pad)

    def bound(out: np.ndarray) -> Callable[[], object]:
        call = conv_amx.bind(data, weight, out, geometry, bf16_workspace(),
                             isa=gemm_kernel.BF16)
        return call.with_epilogue(bias_rows=bias, low=-1.0, high=2.5).with_residual(out, other)

    out = np.full(summed.shape, np.nan, np.float32)  # every pixel must be written
    assert conv_amx.by_pixels(data, out, geometry)
    call = bound(out)
    call()
    want = np.clip(summed + bias[None, :, None, None] + other, -1.0, 2.5)
    # float32 sums of K terms: their rounding is relative to the sums, not to the clamp
    assert np.abs(out - want).max() < 1e-5 * np.abs(summed).max()
    assert_armed_runs_store(out, out.copy(), call)
    monkeypatch.setattr(conv_amx, "PIXELS_MIN_DEPTH", 1 << 30)
    columns = np.full(summed.shape, np.nan, np.float32)
    bound(columns)()
    np.testing.assert_array_equal(out, columns)
    data[...] = RNG.standard_normal(data.shape)  # a second run pairs the new input
    call()
    summed = reference(bf16.rounded(data), bf16.rounded(weight), pad, dilate, stride)
    want = np.clip(summed + bias[None, :, None, None] + other, -1.0, 2.5)
    assert np.abs(out - want).max() < 1e-5 * np.abs(summed).max()


@pytest.mark.parametrize(("size", "kernel", "stride", "dilate", "pad"), [
    ((7, 7), (3, 3), (1, 1), (1, 1), (1, 1)),
    ((14, 28), (3, 3), (2, 2), (1, 1), (1, 1)),  # stride 2: no right border read
    ((11, 13), (3, 3), (1, 1), (2, 2), (2, 2)),  # dilated
    ((9, 10), (5, 2), (1, 1), (1, 1), (2, 0)),
    ((5, 5), (3, 3), (1, 1), (1, 1), (0, 0)),  # no padding: every tap reads inside
    ((2, 9), (5, 5), (1, 1), (1, 1), (2, 2)),  # taps reading no row inside
])
def test_tap_bounds_are_the_output_rows_and_columns_each_tap_reads_inside_the_input(
        size: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int],
        dilate: tuple[int, int], pad: tuple[int, int]) -> None:
    """`_Grid.tap_bounds`, per tap in `tap_offsets`' order: the first and last output row,
    then column, whose pixel the tap reads inside the input, as counted pixel by pixel (an
    empty range where none does)."""
    grid = conv_amx._Grid((1, 1, *size), kernel, stride, dilate, pad)
    bounds = grid.tap_bounds()
    assert bounds.shape == (kernel[0] * kernel[1], 4)
    for tap, (row_first, row_last, column_first, column_last) in enumerate(bounds):
        for axis, tap_along, first, last in ((0, tap // kernel[1], row_first, row_last),
                                             (1, tap % kernel[1], column_first, column_last)):
            read = np.arange(grid.output[axis]) * stride[axis] + tap_along * dilate[axis] \
                - pad[axis]
            inside = np.flatnonzero((read >= 0) & (read < size[axis]))
            if inside.size:
                assert (first, last) == (inside[0], inside[-1])
            else:
                assert first > last


@needs_tiles
@pytest.mark.parametrize(("channels", "size", "filters"), [
    (256, (7, 7), 64),  # a run a whole row: both ends left out at the side taps
    (128, (14, 14), 40),  # two runs a row
    (128, (28, 28), 32),  # four runs a row: a tile's inner ends read inside
])
def test_avx512_bf16_pixel_tiles_skip_the_taps_that_read_the_grid_border(
        monkeypatch: pytest.MonkeyPatch, channels: int, size: tuple[int, int],
        filters: int) -> None:
    """A pixel tile computes no tap of a pixel whose input lies in the padding: with the
    grid's border words NaN in place of zeros the output is the rounded operands'
    convolution still, where the grid-column tiles, which read the border, give NaN."""
    data, weight = operands(1, channels, size, filters, (3, 3))
    summed = reference(bf16.rounded(data), bf16.rounded(weight), (1, 1), (1, 1))
    geometry = ((3, 3), (1, 1), (1, 1), (1, 1))

    def bordered_with_nan() -> np.ndarray:
        out = np.full(summed.shape, np.nan, np.float32)
        call = conv_amx.bind(data, weight, out, geometry, bf16_workspace(),
                             isa=gemm_kernel.BF16)
        call.product.operands[1][...] = np.nan  # the grid: the pairing fills its inside
        call()
        return out

    assert np.abs(bordered_with_nan() - summed).max() < 1e-5 * np.abs(summed).max()
    grid_columns_only(monkeypatch)
    assert np.isnan(bordered_with_nan()).any()


def grid_columns_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every direct product on the AVX-512 BF16 tile bound from now on runs the tiles of
    grid columns, with or without a residual."""
    monkeypatch.setattr(conv_amx, "PIXELS_MIN_DEPTH", 1 << 30)
    monkeypatch.setattr(conv_amx, "PIXELS_ALONE_MIN_DEPTH", 1 << 30)


@needs_tiles
def test_avx512_bf16_pixel_tiles_that_pay_only_alone_give_way_to_grid_columns_for_a_residual(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A product of one image whose K lies from `PIXELS_ALONE_MIN_DEPTH` up to
    `PIXELS_MIN_DEPTH` binds the pixel tiles (of two images, the tiles of grid columns), and
    given a residual moves to the tiles of grid columns, keeping its bias and clamp: each the
    rounded operands' convolution, bit for bit the grid columns' tiles' answer (both sum K in
    the same order)."""
    data, weight = operands(1, 64, (14, 14), 24, (3, 3))  # K 576
    geometry = ((3, 3), (1, 1), (1, 1), (1, 1))
    summed = reference(bf16.rounded(data), bf16.rounded(weight), (1, 1), (1, 1))
    bias = constant(RNG.standard_normal(24).astype(np.float32))
    other = RNG.standard_normal(summed.shape).astype(np.float32)
    functions = conv_amx._compiled_bf16()
    assert not conv_amx.by_pixels(data, summed, geometry)
    assert conv_amx.by_pixels(data, summed, geometry, residual=False)
    assert not conv_amx.by_pixels(np.concatenate([data] * 2), np.concatenate([summed] * 2),
                                  geometry, residual=False)

    def bound(out: np.ndarray) -> Callable[[], object]:
        return conv_amx.bind(data, weight, out, geometry, bf16_workspace(),
                             isa=gemm_kernel.BF16).with_epilogue(bias_rows=bias, low=-1.0,
                                                                 high=2.5)

    out = np.full(summed.shape, np.nan, np.float32)
    alone = bound(out)
    assert alone.product.functions["part"] == functions["pixels_part"]
    alone()
    want = np.clip(summed + bias[None, :, None, None], -1.0, 2.5)
    assert np.abs(out - want).max() < 1e-5 * np.abs(summed).max()
    alone_answer = out.copy()
    added = alone.with_residual(out, other)
    assert added.product.functions["part"] == functions["part"]
    added()
    want = np.clip(summed + bias[None, :, None, None] + other, -1.0, 2.5)
    assert np.abs(out - want).max() < 1e-5 * np.abs(summed).max()
    grid_columns_only(monkeypatch)
    columns = np.full(summed.shape, np.nan, np.float32)
    on_columns = bound(columns)
    assert on_columns.product.functions["part"] == functions["part"]
    on_columns()
    np.testing.assert_array_equal(alone_answer, columns)
    on_columns.with_residual(columns, other)()
    np.testing.assert_array_equal(out, columns)


@needs_tiles
@pytest.mark.parametrize(("batch", "channels", "size", "stride", "direct"), [
    (1, 64, (56, 56), (1, 1), True),  # 3264 grid columns computed against 3136
    (1, 64, (56, 56), (2, 2), True),  # 832 against 784
    (1, 128, (28, 28), (1, 1), True),  # 864 against 784
    (1, 512, (7, 7), (1, 1), True),  # 64 against 64 (49 pixels in whole vectors)
    (8, 512, (7, 7), (1, 1), True),  # 8 × 64 against 400, but by pixels: none dropped
    (8, 64, (7, 7), (1, 1), False),  # the same past `BF16_MAX_COLUMNS_RATIO`, K too short
    # for pixels
    (1, 16, (2, 2), (1, 1), False),  # 32 against 16
])
def test_a_plan_on_avx512_bf16_takes_the_tiles_where_few_grid_columns_are_dropped(
        monkeypatch: pytest.MonkeyPatch, batch: int, channels: int, size: tuple[int, int],
        stride: tuple[int, int], direct: bool) -> None:
    """Without AMX, a bf16 plan's 3×3 convolution runs on the register tiles where the grid
    columns they compute stay within `BF16_MAX_COLUMNS_RATIO` of those the im2col form's
    product computes, else as im2col's patch words; both give the rounded operands'
    convolution."""
    monkeypatch.setattr(gemm_kernel, "available",
                        lambda kernel=None: kernel != gemm_kernel.AMX)
    data, weight = operands(batch, channels, size, 32, (3, 3))
    geometry = ((3, 3), stride, (1, 1), (1, 1))
    want = reference(bf16.rounded(data), bf16.rounded(weight), (1, 1), (1, 1), stride)
    out = np.full(want.shape, np.nan, np.float32)
    # the plan's scratch the im2col form takes over several images
    scratch = conv_bind.scratch_bytes(data.shape, 32, want.shape[2:], geometry, 4)
    calls = conv_bind.bind(np, data, weight, None, out, geometry,
                           Workspace(np, scratch, precision="bf16"))
    assert isinstance(getattr(calls[0], "product", None), conv_amx.DirectProduct) == direct
    for call in calls:
        call()
    assert relative_error(out, want) < 1e-5
    # an fp32 plan's convolution stays float32 whatever the host offers
    assert not conv_amx.applies(data, weight, out, geometry, Workspace(np, 0))


@needs_tiles
@pytest.mark.parametrize(("channels", "size", "stride", "direct"), [
    (2048, (7, 7), (1, 1), True),  # ResNet-50 v2's 2048 → 512 at 7²: 49 of 64 lanes
    (1024, (14, 14), (2, 2), True),  # its downsampling shortcut into 7²
    (512, (7, 7), (1, 1), False),  # fewer channels than `POINTWISE_MIN_DEPTH`
    (1024, (14, 14), (1, 1), False),  # 196 positions fill 196 of 208 lanes: the GEMM's
])
def test_a_plan_on_avx512_bf16_runs_narrow_1x1_layers_on_the_pixel_tiles(
        monkeypatch: pytest.MonkeyPatch, channels: int, size: tuple[int, int],
        stride: tuple[int, int], direct: bool) -> None:
    """Without AMX, a bf16 plan's 1×1 convolution of one image over enough channels, whose
    positions would leave the GEMM's vectors emptier than `gemm_bind.MIN_LANE_USE`, runs as
    a direct product of one tap on the pixel tiles (`conv_amx.narrow_pointwise`); with a
    bias, a residual and a clamp, on one thread and armed over two, it stores what the GEMM
    stores, bit for bit (each sums the channel pairs in the same order)."""
    monkeypatch.setattr(gemm_kernel, "available",
                        lambda kernel=None: kernel != gemm_kernel.AMX)
    data, weight = operands(1, channels, size, 96, (1, 1))
    geometry = ((1, 1), stride, (1, 1), (0, 0))
    summed = reference(bf16.rounded(data), bf16.rounded(weight), (0, 0), (1, 1), stride)
    bias = constant(RNG.standard_normal(96).astype(np.float32))
    other = RNG.standard_normal(summed.shape).astype(np.float32)

    def bound(out: np.ndarray) -> list[Callable[[], object]]:
        scratch = conv_bind.scratch_bytes(data.shape, 96, out.shape[2:], geometry, 4)
        calls = conv_bind.bind(np, data, weight, bias, out, geometry,
                               Workspace(np, scratch, precision="bf16"))
        return [call.with_epilogue(low=-1.0, high=2.5)
                for call in gemm_bind.with_residual(calls, out, other)]

    out = np.full(summed.shape, np.nan, np.float32)  # every pixel must be written
    calls = bound(out)
    assert isinstance(getattr(calls[0], "product", None), conv_amx.DirectProduct) == direct
    for call in calls:
        call()
    want = np.clip(summed + bias[None, :, None, None] + other, -1.0, 2.5)
    assert np.abs(out - want).max() < 1e-5 * np.abs(summed).max()
    assert_armed_runs_store(out, out.copy(), lambda: [call() for call in calls])
    monkeypatch.setattr(conv_amx, "POINTWISE_MIN_DEPTH", 1 << 30)
    product = np.full(summed.shape, np.nan, np.float32)
    gemm_calls = bound(product)
    assert not isinstance(getattr(gemm_calls[0], "product", None), conv_amx.DirectProduct)
    for call in gemm_calls:
        call()
    np.testing.assert_array_equal(out, product)


@pytest.mark.parametrize("isa", [
    pytest.param(gemm_kernel.AMX, marks=needs_direct),
    pytest.param(gemm_kernel.BF16, marks=needs_tiles),
])
@pytest.mark.parametrize(("channels", "size", "pad"), [
    (64, (56, 56), (1, 1)),  # ResNet's stride-2 3×3 over 56²: runs of whole vectors, a tail
    (5, (9, 10), (0, 1)),  # odd C, odd rows, one column of padding
    (6, (6, 20), (1, 0)),  # no column padding: the even columns are the second phase
])
def test_a_stride_2_input_pairs_both_column_phases_in_one_read(
        monkeypatch: pytest.MonkeyPatch, isa: int, channels: int, size: tuple[int, int],
        pad: tuple[int, int]) -> None:
    """At stride 2 over an even width each row phase's two column phases are paired from
    one read of the input's rows (`bf16.patch_pairing`'s ``twin``): two passes where there
    were four, whose words give the output the four's give, bit for bit, on one thread and
    armed over two (AMX's product, and the AVX-512 BF16 tile's)."""
    data, weight = operands(1, channels, size, 32, (3, 3))
    geometry = ((3, 3), (2, 2), (1, 1), pad)
    want = reference(bf16.rounded(data), bf16.rounded(weight), pad, (1, 1), (2, 2))
    outputs = []
    for passes in (2, 4):
        if passes == 4:
            monkeypatch.setattr(conv_amx, "_twinned",
                                lambda runs: [(view, into, None) for view, into in runs])
        out = np.full(want.shape, np.nan, np.float32)
        call = conv_amx.bind(data, weight, out, geometry, bf16_workspace(), isa=isa)
        assert len(call.args[0].args[0]) == passes  # `_each` over the pairing passes
        call()
        outputs.append(out.copy())
        assert_armed_runs_store(out, outputs[-1], call)
    np.testing.assert_array_equal(outputs[0], outputs[1])
    assert relative_error(outputs[0], want) < 1e-5


@needs_direct
@pytest.mark.parametrize(("channels", "filters"), [
    (3, 72),  # 9 steps of K for 32 rows: several rows stored after each step
    (100, 40),  # 36 steps: some steps store none; the last block's 8 rows
    (170, 40),  # 54 steps, past `INTERLEAVED_STEPS`: each tile stored after its own sums
])
def test_each_tiles_epilogue_runs_within_the_next_tiles_steps(channels: int,
                                                               filters: int) -> None:
    """A tile's bias, residual and clamp are applied while the next tile sums (the last
    tile's after its part's loop, a row block's last before the next block's first sums;
    over a long K right after its own): every pixel of every tile stored once, on one thread
    and over parts on two, whatever K's steps per tile."""
    data, weight = operands(2, channels, (13, 21), filters, (3, 3))
    bias = constant(RNG.standard_normal(filters).astype(np.float32))
    other = RNG.standard_normal((2, filters, 13, 21)).astype(np.float32)
    out = np.full(other.shape, np.nan, np.float32)
    call = conv_amx.bind(data, weight, out, ((3, 3), (1, 1), (1, 1), (1, 1)),
                         bf16_workspace())
    call = call.with_epilogue(bias_rows=bias, low=0.0).with_residual(out, other)
    call()
    summed = reference(bf16.rounded(data), bf16.rounded(weight), (1, 1), (1, 1))
    want = np.maximum(summed + bias[None, :, None, None] + other, 0.0)
    assert relative_error(out, want) < 1e-5
    assert_armed_runs_store(out, out.copy(), call)


@needs_direct
def test_a_bound_convolution_adds_its_bias_and_clamps_in_the_epilogue() -> None:
    data, weight = operands(2, 24, (14, 14), 48, (3, 3))
    bias = constant(RNG.standard_normal(48).astype(np.float32))
    out = np.empty((2, 48, 14, 14), np.float32)
    geometry = ((3, 3), (1, 1), (1, 1), (1, 1))
    calls = conv_bind.bind(np, data, weight, bias, out, geometry, bf16_workspace())
    assert len(calls) == 1 and isinstance(calls[0].product, conv_amx.DirectProduct)
    clamped = gemm_bind.clamped(calls, 0.0, 6.0)
    assert clamped is not None
    clamped[0]()
    want = reference(bf16.rounded(data), bf16.rounded(weight), (1, 1), (1, 1))
    want = np.clip(want + bias.reshape(1, -1, 1, 1), 0.0, 6.0)
    assert out.min() == 0.0 and out.max() == 6.0
    assert relative_error(out, want) < 1e-5


@needs_direct
def test_images_are_bound_in_chunks_of_a_grid_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Five images whose grid is 9 KB each (16 words × 12 × 12 words), in chunks of two:
    three calls sharing one grid, the last of one image, each storing its own images."""
    monkeypatch.setattr(conv_amx, "CHUNK_GRID_BYTES", 2 * 16 * 12 * 12 * 4)
    data, weight = operands(5, 20, (10, 10), 40, (3, 3))
    bias = constant(RNG.standard_normal(40).astype(np.float32))
    out = np.full((5, 40, 10, 10), np.nan, np.float32)
    geometry = ((3, 3), (1, 1), (1, 1), (1, 1))
    calls = conv_bind.bind(np, data, weight, bias, out, geometry, bf16_workspace())
    assert [len(call.product.operands[2]) for call in calls] == [2, 2, 1]
    for call in calls:
        call()
    want = reference(bf16.rounded(data), bf16.rounded(weight), (1, 1), (1, 1))
    assert relative_error(out, want + bias.reshape(1, -1, 1, 1)) < 1e-5


@needs_direct
@pytest.mark.parametrize(("batch", "size", "stride", "chunks"), [
    (1, (14, 14), (1, 1), 1), (5, (10, 9), (1, 1), 3), (2, (11, 13), (2, 2), 2)])
def test_a_residual_is_added_where_each_pixel_is_stored(
        monkeypatch: pytest.MonkeyPatch, batch: int, size: tuple[int, int],
        stride: tuple[int, int], chunks: int) -> None:
    """Each kept grid column's residual is read at its pixel, through the lanes the
    epilogue packs; five images bind in chunks (each call reads its own images' part),
    and grid columns past a row's width leave the residual unread and the output
    unwritten there."""
    monkeypatch.setattr(conv_amx, "CHUNK_GRID_BYTES", 2 * 16 * 12 * 11 * 4)
    data, weight = operands(batch, 20, size, 40, (3, 3))
    bias = constant(RNG.standard_normal(40).astype(np.float32))
    geometry = ((3, 3), stride, (1, 1), (1, 1))
    want = reference(bf16.rounded(data), bf16.rounded(weight), (1, 1), (1, 1), stride)
    out = np.full(want.shape, np.nan, np.float32)
    other = RNG.standard_normal(want.shape).astype(np.float32)
    calls = conv_bind.bind(np, data, weight, bias, out, geometry, bf16_workspace())
    assert len(calls) == chunks
    fused = gemm_bind.clamped(gemm_bind.with_residual(calls, out, other), 0.0, np.inf)
    for call in fused:
        call()
    want = np.maximum(want + bias.reshape(1, -1, 1, 1) + other, 0.0)
    assert relative_error(out, want) < 1e-5
    assert (out == 0.0).any()  # the clamp came after the residual


@needs_direct
def test_armed_parts_add_the_residual_as_one_thread_does() -> None:
    data, weight = operands(2, 40, (12, 12), 64, (3, 3))
    geometry = ((3, 3), (1, 1), (1, 1), (1, 1))
    other = RNG.standard_normal((2, 64, 12, 12)).astype(np.float32)
    alone, out = np.empty_like(other), np.empty_like(other)
    for target in (alone, out):
        calls = conv_amx.bind_chunks(data, weight, target, geometry, bf16_workspace())
        fused = gemm_bind.with_residual(calls, target, other)
        if target is alone:
            for call in fused:
                call()
    assert_armed_runs_store(out, alone, lambda: [call() for call in fused])


@needs_direct
def test_a_residual_only_where_every_call_writes_inside_the_output() -> None:
    data, weight = operands(2, 20, (6, 6), 16, (3, 3))
    out = np.empty((2, 16, 6, 6), np.float32)
    calls = conv_bind.bind(np, data, weight, None, out, ((3, 3), (1, 1), (1, 1), (1, 1)),
                           bf16_workspace())
    other = np.zeros_like(out)
    assert gemm_bind.with_residual(calls, out[:1], other[:1]) is None  # image 1 outside
    assert gemm_bind.with_residual([*calls, lambda: None], out, other) is None
    with pytest.raises(ValueError, match="float32, C-contiguous"):
        gemm_bind.with_residual(calls, out, other.astype(np.float64))


@needs_direct
def test_armed_parts_on_the_pool_store_the_same_bytes() -> None:
    """Armed over two threads, the pairing and the tiles run in parts on the pool's workers
    (each part's first tile prefetching its weights): the same bytes as on one thread."""
    data, weight = operands(2, 70, (16, 16), 80, (3, 3))
    geometry = ((3, 3), (2, 2), (1, 1), (1, 1))
    alone = np.empty((2, 80, 8, 8), np.float32)
    conv_amx.bind(data, weight, alone, geometry, bf16_workspace())()
    out = np.empty_like(alone)
    call = conv_amx.bind(data, weight, out, geometry, bf16_workspace())
    assert_armed_runs_store(out, alone, call)


@needs_direct
def test_the_epilogue_refuses_a_bias_per_column_or_too_short() -> None:
    data, weight = operands(1, 8, (6, 6), 16, (3, 3))
    out = np.empty((1, 16, 6, 6), np.float32)
    call = conv_amx.bind(data, weight, out, ((3, 3), (1, 1), (1, 1), (1, 1)),
                         bf16_workspace())
    with pytest.raises(ValueError, match="a bias per filter, not per column"):
        call.product.with_epilogue(bias_columns=np.zeros(36, np.float32))
    with pytest.raises(ValueError, match="hold 16 values"):
        call.product.with_epilogue(bias_rows=np.zeros(8, np.float32))


@needs_direct
def test_a_mismatched_output_is_refused_with_its_shapes() -> None:
    data, weight = operands(1, 8, (6, 6), 16, (3, 3))
    out = np.empty((1, 16, 6, 6), np.float32)
    with pytest.raises(ValueError, match=r"output \(1, 16, 6, 6\) does not match input"):
        conv_amx.bind(data, weight, out, ((3, 3), (1, 1), (1, 1), (0, 0)),
                      bf16_workspace())


@needs_direct
def test_bf16_plans_take_convolutions_of_several_taps_over_enough_channels() -> None:
    data, weight = operands(1, 16, (8, 8), 32, (3, 3))
    out = np.empty((1, 32, 8, 8), np.float32)
    padded = ((3, 3), (1, 1), (1, 1), (1, 1))
    assert conv_amx.applies(data, weight, out, padded, bf16_workspace())
    strided = np.empty((1, 32, 4, 4), np.float32)
    assert conv_amx.applies(data, weight, strided, ((3, 3), (2, 2), (1, 1), (1, 1)),
                            bf16_workspace())
    assert not conv_amx.applies(data, weight, out, padded, Workspace(np, 0))
    writable = np.array(weight)
    assert not conv_amx.applies(data, writable, out, padded, bf16_workspace())
    point = constant(np.ones((32, 16, 1, 1), np.float32))
    assert not conv_amx.applies(data, point, out, ((1, 1), (1, 1), (1, 1), (0, 0)),
                                bf16_workspace())
    # 3 channels: each tap's 3 padded to 32 would multiply im2col's K nine times over.
    few, few_weight = operands(1, 3, (8, 8), 32, (3, 3))
    assert not conv_amx.applies(few, few_weight, out, padded, bf16_workspace())
    assert conv_amx.pays(8, 9) and not conv_amx.pays(4, 9) and not conv_amx.pays(3, 49)


def direct_nodes(model: engine.Model, feed: dict[str, np.ndarray]) -> int:
    """How many of the plan's nodes run the direct convolution."""
    return len({id(step.node) for step in model.plan_for(feed).steps
                if isinstance(step.call, bf16.PairedProduct)
                and isinstance(step.call.product, conv_amx.DirectProduct)})


@needs_direct
def test_resnet18_direct_agrees_with_the_im2col_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole bf16 ResNet-18 (112×112, so that it runs in seconds) with its sixteen 3×3
    layers direct against the same plan with all of them on im2col: the same top-1 class,
    logits within bf16's error of each other (both round the same operands; they sum in
    another order)."""
    symbol = nets.resnet18_v1()
    params = nets.random_params(symbol, (1, 3, 112, 112), seed=5)
    feed = {"data": RNG.standard_normal((4, 3, 112, 112)).astype(np.float32)}
    direct = engine.load_model(symbol, params, precision="bf16")
    got = direct.infer(feed)["output_output"]
    assert direct_nodes(direct, feed) == 16
    monkeypatch.setattr(conv_amx, "applies", lambda *_: False)
    im2col = engine.load_model(symbol, params, precision="bf16")
    want = im2col.infer(feed)["output_output"]
    assert direct_nodes(im2col, feed) == 0
    assert relative_error(got, want) < 1e-2
    np.testing.assert_array_equal(np.argmax(got, axis=1), np.argmax(want, axis=1))


def bf16_add_passes(model: engine.Model, feed: dict[str, np.ndarray]) -> int:
    """How many of the plan's steps add a residual in a pass of their own."""
    from engine.kernels import epilogue
    from tests.engine.runtime.helpers import step_funcs

    return sum(func is epilogue.bias_add_clamp
               or getattr(func, "__name__", "").startswith("elemwise_add")
               for func in step_funcs(model.plan_for(feed)))


@needs_direct
@pytest.mark.parametrize("net", ["resnet18_v1", "resnet50_v2"])
def test_residuals_added_in_the_products_keep_the_network_result(
        monkeypatch: pytest.MonkeyPatch, net: str) -> None:
    """Whole bf16 networks (112×112, two images) with every residual block's add inside its
    last product's epilogue, against the same plans adding them in passes of their own:
    the same sums in the same order, so the logits agree to float32 rounding."""
    symbol = getattr(nets, net)()
    params = nets.random_params(symbol, (1, 3, 112, 112), seed=3)
    feed = {"data": RNG.standard_normal((2, 3, 112, 112)).astype(np.float32)}
    fused = engine.load_model(symbol, params, precision="bf16")
    got = fused.infer(feed)["output_output"]
    assert bf16_add_passes(fused, feed) == 0
    monkeypatch.setattr(gemm_bind, "with_residual", lambda *_: None)
    apart = engine.load_model(symbol, params, precision="bf16")
    want = apart.infer(feed)["output_output"]
    assert bf16_add_passes(apart, feed) == (8 if net == "resnet18_v1" else 16)
    assert relative_error(got, want) < 1e-5
    np.testing.assert_array_equal(np.argmax(got, axis=1), np.argmax(want, axis=1))
