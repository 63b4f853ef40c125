"""bf16 operands (`engine.kernels.bf16`): rounding, the pair layouts, and the compiled pairing
passes against the NumPy definitions."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cpu import compiled
from engine.kernels import bf16, gemm_preact
from engine.kernels.conv_bind import _patch_view

RNG = np.random.default_rng(11)


def bits(values: list[float]) -> np.ndarray:
    return np.array(values, np.float32).view(np.uint32)


def test_rounding_keeps_the_nearest_bf16_with_ties_to_even() -> None:
    # 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even one (1); 1 + 3·2^-8
    # lies halfway between 1 + 2^-7 and 1 + 2^-6: to the even one (1 + 2^-6).
    values = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -2.5, 0.0],
                      np.float32)
    assert bf16.rounded(values).tolist() == [1.0, 1.0, 1 + 2**-6, 1 + 2**-7, -2.5, 0.0]


def test_rounding_keeps_infinities_and_nans() -> None:
    values = np.array([np.inf, -np.inf, np.nan], np.float32)
    # A NaN whose payload lies only in the low half (rounding would carry it into an inf).
    low_nan = np.array([0x7F800001], np.uint32).view(np.float32)
    out = bf16.rounded(np.concatenate([values, low_nan]))
    assert out[0] == np.inf and out[1] == -np.inf
    assert np.isnan(out[2]) and np.isnan(out[3])


def test_rounding_error_is_within_half_a_bf16_ulp() -> None:
    values = RNG.standard_normal(10_000).astype(np.float32) * 100
    relative = np.abs(bf16.rounded(values) - values) / np.abs(values)
    assert relative.max() <= 2**-8


def test_pair_rows_puts_neighbours_along_k_in_one_word() -> None:
    matrix = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    words = bf16.pair_rows(matrix).view(np.uint32)
    assert words.shape == (2, 2)
    halves = [[(int(w) & 0xFFFF, int(w) >> 16) for w in row] for row in words]
    as_bf16 = {value: int(bf16.round_to_bf16(np.float32(value))) for value in range(7)}
    assert halves == [[(as_bf16[1], as_bf16[2]), (as_bf16[3], 0)],
                      [(as_bf16[4], as_bf16[5]), (as_bf16[6], 0)]]


def test_pair_columns_puts_neighbours_down_k_in_one_word() -> None:
    matrix = np.array([[1, 2], [3, 4], [5, 6]], np.float32)
    words = bf16.pair_columns(matrix).view(np.uint32)
    low = bf16.widen(words & 0xFFFF)
    high = bf16.widen(words >> 16)
    assert low.tolist() == [[1, 2], [5, 6]] and high.tolist() == [[3, 4], [0, 0]]


needs_numba = pytest.mark.skipif(not compiled.available(), reason="numba is not installed")


@needs_numba
@pytest.mark.parametrize("shape", [(6, 40), (7, 33), (1, 5), (64, 130)])
@pytest.mark.parametrize(("along_rows", "panel"), [(True, None), (False, None), (False, 32)])
def test_the_compiled_pairing_writes_the_numpy_words(shape: tuple[int, int], along_rows: bool,
                                                     panel: int | None) -> None:
    source = RNG.standard_normal(shape).astype(np.float32)
    source[0, 0] = np.nan
    for view in (source, np.asfortranarray(source), source[:, ::-1][:, ::-1]):
        target = np.zeros(bf16.paired_shape(shape, along_rows, panel), np.float32)
        expected = np.zeros_like(target)
        call = bf16.pairing(view, target, along_rows)
        assert call.func is not bf16._pair_in_numpy, "the pairing ran in NumPy, not as a job"
        call()
        bf16._pair_in_numpy(view, expected, along_rows)
        np.testing.assert_array_equal(target.view(np.uint32), expected.view(np.uint32))


needs_pair_ir = pytest.mark.skipif(bf16._pair_task() is None,
                                   reason="llvmlite cannot compile the pairing pass here")


@needs_pair_ir
@pytest.mark.parametrize("shape", [(6, 64), (7, 33), (1, 5), (64, 130), (576, 49)])
def test_panel_pairing_writes_the_numpy_words_panel_by_panel(shape: tuple[int, int]) -> None:
    """The AVX-512 BF16 kernel's activation panels from the vector pass: whole panels as one
    job, a narrower last panel as another (its padding columns left zero), any strides, an
    odd K's last word half zero, NaN kept."""
    source = RNG.standard_normal(shape).astype(np.float32) * 100
    source[0, 0] = np.nan
    source[-1, -1] = np.inf
    for view in (source, np.asfortranarray(source), source[:, ::-1][:, ::-1]):
        target = np.zeros(bf16.paired_shape(shape, False, 32), np.float32)
        expected = np.zeros_like(target)
        call = bf16.panel_pairing(view, target)
        assert call is not None
        call()
        bf16._pair_in_numpy(view, expected, False)
        np.testing.assert_array_equal(target.view(np.uint32), expected.view(np.uint32))
        assert bf16.pairing(view, target, False).func is call.func  # what products use


@needs_pair_ir
def test_panel_pairing_flushes_denormals_to_zero_as_the_conversion_does() -> None:
    """``vcvtneps2bf16`` reads denormal floats as zero of their sign, as the compute threads'
    float32 arithmetic does (FTZ/DAZ): the words hold zeros where NumPy's rounding keeps
    bf16 denormals."""
    source = np.array([[1e-39, -3e-40, 2.0]] * 2, np.float32)
    target = np.zeros(bf16.paired_shape(source.shape, False, 32), np.float32)
    bf16.panel_pairing(source, target)()
    words = target.view(np.uint32)[0, 0, :3]
    assert words.tolist() == [0, 0x80008000, int(bf16.round_to_bf16(np.float32(2.0))) * 0x10001]


@needs_pair_ir
def test_panel_pairing_refuses_a_target_of_another_shape() -> None:
    source = RNG.standard_normal((8, 40)).astype(np.float32)
    assert bf16.panel_pairing(source, np.zeros((1, 4, 32), np.float32)) is None
    assert bf16.panel_pairing(source, np.zeros((2, 5, 32), np.float32)) is None


@needs_pair_ir
@pytest.mark.parametrize("channels", [3, 4])
@pytest.mark.parametrize("stride", [1, 2, 3])  # adjacent floats, every other one, a gather
@pytest.mark.parametrize("width", [11, 42, 43])  # runs of one partial vector, or two
def test_patch_pairing_reads_the_im2col_view_straight(channels: int, stride: int,
                                                      width: int) -> None:
    padded = RNG.standard_normal((1, channels, 9, width)).astype(np.float32)
    padded[0, 1, 2, 3] = np.nan
    size = ((9 - 3) // stride + 1, (width - 3) // stride + 1)
    assert_pairs_the_im2col_matrix(_patch_view(np, padded, (3, 3), (stride, stride), (1, 1),
                                               size))


def assert_pairs_the_im2col_matrix(view: np.ndarray) -> None:
    """`bf16.patch_pairing` of an im2col view (its first 3 axes along K) writes the words of
    the view's matrix paired down its columns, bit for bit, and nothing past them."""
    depth, columns = int(np.prod(view.shape[:3])), int(np.prod(view.shape[3:]))
    target = np.zeros((bf16.amx_depth(depth), bf16.amx_rows(columns)), np.float32)
    call = bf16.patch_pairing(view, 3, target)
    assert call is not None
    call()
    expected = bf16.pair_columns(np.ascontiguousarray(view).reshape(depth, columns))
    # (vcvtneps2bf16 quiets a NaN as round_to_bf16 does: the words match bit for bit)
    words = target.view(np.uint32)
    np.testing.assert_array_equal(words[:expected.shape[0], :columns],
                                  expected.view(np.uint32))
    assert not words[expected.shape[0]:].any() and not words[:, columns:].any()


@needs_pair_ir
@pytest.mark.parametrize("width", [229, 233])  # 112 columns: whole vectors; 114: and a tail
def test_a_stride_2_stems_taps_side_by_side_pair_as_their_floats_lie(width: int) -> None:
    """ResNet's 7×7 stride-2 stem over 3 channels: a word pairing taps (kx, kx + 1) of one
    kernel row reads its 32 floats side by side, the others every other float of each tap's;
    every word as the im2col matrix's pairs, bit for bit."""
    padded = RNG.standard_normal((1, 3, 9, width)).astype(np.float32)
    padded[0, 2, 4, 101] = np.nan
    size = (2, (width - 7) // 2 + 1)
    assert_pairs_the_im2col_matrix(_patch_view(np, padded, (7, 7), (2, 2), (1, 1), size))


@needs_pair_ir
@pytest.mark.parametrize("stride", [1, 2, 3])  # adjacent words, every other one, a gather
@pytest.mark.parametrize("width", [11, 42, 43])  # runs of one partial vector, or two
def test_word_copying_copies_the_strided_words_bit_for_bit(stride: int, width: int) -> None:
    """Every ``stride``-th word of every ``stride``-th row of paired planes (a strided 1×1
    convolution's share of a hand-off), any bits (NaN patterns too) moved unchanged, the
    runs end to end and the target's other cells left zero."""
    bits = RNG.integers(0, 1 << 32, (5, 9 * width), dtype=np.uint64).astype(np.uint32)
    words = bits.view(np.float32)
    view = words.reshape(5, 9, width)[:, ::stride, ::stride]
    columns = view.shape[1] * view.shape[2]
    target = np.zeros((8, bf16.amx_rows(columns)), np.float32)
    call = bf16.word_copying(view, target)
    assert call is not None
    call()
    copied = target.view(np.uint32)
    np.testing.assert_array_equal(copied[:5, :columns],
                                  bits.reshape(5, 9, width)[:, ::stride, ::stride].reshape(5, -1))
    assert not copied[5:].any() and not copied[:, columns:].any()


@needs_pair_ir
def test_word_copying_refuses_a_target_too_small() -> None:
    view = np.zeros((4, 3, 10), np.float32)
    with pytest.raises(ValueError, match="too small"):
        bf16.word_copying(view, np.zeros((4, 29), np.float32))


@needs_pair_ir
def test_patch_pairing_refuses_a_target_too_small() -> None:
    view = RNG.standard_normal((4, 10)).astype(np.float32)
    with pytest.raises(ValueError, match="too small"):
        bf16.patch_pairing(view, 1, np.zeros((1, 10), np.float32))


@needs_pair_ir
@pytest.mark.parametrize("channels", [6, 7])  # an odd K: the last word's high half zero
@pytest.mark.parametrize("width", [16, 32, 5, 49])  # whole vectors, or a tail after them
@pytest.mark.parametrize("fix_gamma", [False, True])
def test_patch_pairing_with_a_batchnorm_writes_the_pairs_of_its_clamped_output(
        channels: int, width: int, fix_gamma: bool) -> None:
    """With a BatchNorm's scale and shift (`gemm_preact.scale_shift`) and a clamp, the
    words are the NumPy pass's output paired, bit for bit, a NaN kept; nothing is written
    past the run's end."""
    data = RNG.standard_normal((channels, width)).astype(np.float32) * 3
    data[1, -1] = np.nan
    gamma, beta, mean = (RNG.uniform(-1, 1, channels).astype(np.float32) for _ in range(3))
    var = RNG.uniform(0.5, 2, channels).astype(np.float32)
    scale, shift = gemm_preact.scale_shift(gamma, beta, mean, var, np.float32(1e-3),
                                                fix_gamma)
    target = np.zeros((bf16.amx_depth(channels), bf16.amx_rows(width)), np.float32)
    call = bf16.patch_pairing(data, 1, target,
                              batchnorm=(scale, shift, np.float32(0), np.float32(6)))
    call()
    inverse = np.float32(1) / np.sqrt(var + np.float32(1e-3))
    applied = (inverse if fix_gamma else gamma * inverse)[:, None]
    want = np.clip(data * applied + (beta[:, None] - mean[:, None] * applied), 0, 6)
    want[1, -1] = np.nan  # np.clip keeps it too; the pass's compares keep it
    expected = bf16.pair_columns(want)
    words = target.view(np.uint32)
    np.testing.assert_array_equal(words[:expected.shape[0], :width], expected.view(np.uint32))
    assert not words[:, width:].any()


@needs_pair_ir
def test_patch_pairing_writes_runs_where_into_says() -> None:
    """Channel pairs of two 3×5 images into a grid bordered by one word each side (7 words
    a row, 5 rows an image): each run, a row of an image, starts where ``into`` puts it, and
    the border is left as it was (zero)."""
    data = RNG.standard_normal((2, 3, 3, 5)).astype(np.float32)
    grid = np.zeros((2, 2 * 5 * 7), np.float32)
    into = np.array([image * 35 + (row + 1) * 7 + 1 for image in range(2)
                     for row in range(3)], np.int64)
    call = bf16.patch_pairing(data.transpose(1, 0, 2, 3), 1, grid, into)
    assert call is not None
    call()
    bordered = np.zeros((3, 2, 5, 7), np.float32)
    bordered[:, :, 1:4, 1:6] = data.transpose(1, 0, 2, 3)
    expected = bf16.pair_columns(bordered.reshape(3, -1))
    np.testing.assert_array_equal(grid.view(np.uint32), expected.view(np.uint32))


@needs_pair_ir
def test_patch_pairing_refuses_offsets_past_the_target() -> None:
    view = RNG.standard_normal((4, 2, 10)).astype(np.float32)
    with pytest.raises(ValueError, match="too small"):
        bf16.patch_pairing(view, 1, np.zeros((2, 25), np.float32), np.array([0, 16]))
    with pytest.raises(ValueError, match="one target offset per run"):
        bf16.patch_pairing(view, 1, np.zeros((2, 40), np.float32), np.array([0]))


@needs_pair_ir
def test_patch_pairing_reads_k_where_its_offsets_say() -> None:
    """K's rows in a given order (reversed, of a 5 × 12 matrix), not the view's strides:
    the words pair rows 4 and 3, then 2 and 1, then 0 with a zero."""
    source = RNG.standard_normal((5, 12)).astype(np.float32)
    columns = np.lib.stride_tricks.as_strided(source, shape=(5, 12), strides=(0, 4))
    target = np.zeros((3, 12), np.float32)
    call = bf16.patch_pairing(columns, 1, target, k_offsets=np.arange(4, -1, -1) * 12)
    assert call is not None
    call()
    expected = bf16.pair_columns(source[::-1])
    np.testing.assert_array_equal(target.view(np.uint32), expected.view(np.uint32))
    with pytest.raises(ValueError, match="one non-negative offset per K index"):
        bf16.patch_pairing(columns, 1, target, k_offsets=np.arange(4) * 12)
