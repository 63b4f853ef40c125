"""The vector 3×3 stride-2 max pooling (`engine.kernels.max_pool_vector`) equals a NumPy
pooling cell for cell, NaN, ±inf, edges and the full convention's last windows included, on
one thread and split over the planes, and stands aside where it does not apply."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cpu import compiled, spin_pool
from engine.kernels import max_pool_vector, pool_kernel

RNG = np.random.default_rng(61)
WINDOW = (3, 3, 2, 2, 1, 1)

pytestmark = pytest.mark.skipif(max_pool_vector._task() is None,
                                reason="no AVX-512 or no LLVM JIT here")


def numpy_max_pool(data: np.ndarray, out_shape: tuple[int, int]) -> np.ndarray:
    """3×3 stride-2 pad-1 windows of ``data`` (P, H, W) by np.maximum, cells outside the
    input -inf (the padding, and past it where the full convention's windows reach)."""
    planes, height, width = data.shape
    out_height, out_width = out_shape
    padded = np.full((planes, 2 * out_height + 2, 2 * out_width + 2), -np.inf, data.dtype)
    padded[:, 1:height + 1, 1:width + 1] = data
    result = np.full((planes, out_height, out_width), -np.inf, data.dtype)
    for dy in range(3):
        for dx in range(3):
            result = np.maximum(result, padded[:, dy:dy + 2 * out_height:2,
                                               dx:dx + 2 * out_width:2])
    return result


def special(shape: tuple[int, ...]) -> np.ndarray:
    """Values drawn from finite ones, ±inf and NaN: windows with +inf beside -inf, and NaN
    beside either, on every edge; the last cell NaN whatever was drawn."""
    values = np.array([1.5, -2.0, 0.25, -0.0, np.inf, -np.inf, np.nan], np.float32)
    data = RNG.choice(values, size=shape, p=[0.3, 0.3, 0.2, 0.05, 0.05, 0.05, 0.05])
    data[(-1,) * len(shape)] = np.nan
    return data


def output_shape(height: int, width: int, full: bool) -> tuple[int, int]:
    """MXNet's output size: valid rounds (H + 2 - 3) / 2 down, full rounds it up."""
    return tuple((size - 1 + (1 if full else 0)) // 2 + 1 for size in (height, width))


# (planes, H, W): ResNet's plane, odd sizes, rows of one vector and of several with a part
# vector, a plane narrower than a vector's reads, a single cell.
SHAPES = [(4, 112, 112), (3, 11, 9), (2, 37, 70), (3, 8, 33), (1, 1, 1), (2, 3, 4), (1, 2, 64)]


@pytest.mark.parametrize("full", [False, True], ids=["valid", "full"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{p}x{h}x{w}" for p, h, w in SHAPES])
def test_vector_pooling_equals_numpy(shape: tuple[int, int, int], full: bool) -> None:
    data = special(shape)
    out_shape = output_shape(*shape[1:], full)
    assert max_pool_vector.applies(data, np.empty((shape[0], *out_shape), np.float32), WINDOW)
    want = numpy_max_pool(data, out_shape)
    got = np.full((shape[0], *out_shape), 7.0, np.float32)  # every cell must be written
    max_pool_vector.max_pool(data, got)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(want).any()


def test_infinities_without_nan_stay_infinite() -> None:
    # +inf beside -inf in every window: an unordered test taken per window would make NaN.
    data = np.where(RNG.random((2, 16, 40)) < 0.5, np.inf, -np.inf).astype(np.float32)
    data[:, ::2, ::2] = np.inf
    got = np.empty((2, 8, 20), np.float32)
    max_pool_vector.max_pool(data, got)
    np.testing.assert_array_equal(got, np.full_like(got, np.inf))


def test_every_nan_reaches_each_window_holding_it() -> None:
    for y, x in ((0, 0), (6, 0), (0, 17), (6, 17), (3, 8), (4, 16)):
        data = RNG.normal(size=(1, 7, 18)).astype(np.float32)
        data[0, y, x] = np.nan
        got = np.empty((1, 4, 9), np.float32)
        max_pool_vector.max_pool(data, got)
        rows = [oy for oy in range(4) if 2 * oy - 1 <= y <= 2 * oy + 1]
        columns = [ox for ox in range(9) if 2 * ox - 1 <= x <= 2 * ox + 1]
        expected = np.zeros((4, 9), bool)
        expected[np.ix_(rows, columns)] = True
        np.testing.assert_array_equal(np.isnan(got[0]), expected)


@pytest.mark.skipif(not compiled.available(), reason="numba not installed")
def test_vector_pooling_equals_the_numba_kernel() -> None:
    data = special((6, 30, 28))
    want = np.empty((6, 15, 14), np.float32)
    pool_kernel._compiled()["max pairs"](data, want, *WINDOW)
    got = np.empty_like(want)
    max_pool_vector.max_pool(data, got)
    np.testing.assert_array_equal(got, want)


def test_job_in_parts_equals_one_thread() -> None:
    if not spin_pool.available():
        pytest.skip("the spin pool's native code does not compile here")
    data = special((37, 30, 28))
    want = numpy_max_pool(data, (15, 14))
    got = np.full_like(want, 7.0)
    job = max_pool_vector.job(data, got)
    assert job.args[-1] > 1
    for threads in (2, 1):
        got[:] = 7.0
        with spin_pool.armed(threads):
            job()
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", ["float64", "window", "stride", "pad", "4-D", "too tall",
                                  "too wide", "not contiguous"])
def test_applies_only_to_its_pooling(case: str) -> None:
    data, out, window = np.zeros((2, 12, 12), np.float32), np.zeros((2, 6, 6), np.float32), WINDOW
    if case == "float64":
        data, out = data.astype(np.float64), out.astype(np.float64)
    elif case == "window":
        window = (2, 2, 2, 2, 1, 1)
    elif case == "stride":
        window = (3, 3, 1, 1, 1, 1)
    elif case == "pad":
        window = (3, 3, 2, 2, 0, 0)
    elif case == "4-D":
        data, out = data[None], out[None]
    elif case == "too tall":
        out = np.zeros((2, 8, 6), np.float32)
    elif case == "too wide":
        data = np.zeros((1, 2, 2 * max_pool_vector.MAX_OUT_WIDTH + 2), np.float32)
        out = np.zeros((1, 1, max_pool_vector.MAX_OUT_WIDTH + 1), np.float32)
    else:
        data = np.zeros((2, 12, 24), np.float32)[:, :, ::2]
    assert max_pool_vector.applies(np.zeros((2, 12, 12), np.float32), np.zeros(
        (2, 6, 6), np.float32), WINDOW)
    assert not max_pool_vector.applies(data, out, window)


@pytest.mark.parametrize("rows", [2, 4, 16])
@pytest.mark.parametrize("shape,full", [((4, 112, 112), False), ((3, 11, 9), False),
                                        ((2, 37, 70), True), ((2, 38, 33), True)])
def test_bands_of_rows_pool_as_the_whole_plane(shape: tuple[int, int, int], full: bool,
                                               rows: int) -> None:
    """Input rows held a band at a time, with the row above each band (`band_job`), give
    each band's output rows as pooling the whole plane does: NaN, ±inf and the last
    windows included."""
    data = special(shape)
    height = shape[1]
    out_shape = output_shape(*shape[1:], full)
    want = numpy_max_pool(data, out_shape)
    out = np.full((shape[0], *out_shape), 7.0, np.float32)
    held = np.full((shape[0], rows + 3, shape[2]), np.nan, np.float32)  # planes apart
    for top in range(0, height, rows):
        first, last = max(0, top - 1), min(top + rows, height)
        band = held[:, :last - first]
        band[...] = data[:, first:last]
        pooled = (top // 2, out_shape[0] if last == height else last // 2)
        max_pool_vector.band_job(band, first, height, out, pooled, 1)()
    np.testing.assert_array_equal(out, want)


def test_a_band_missing_rows_its_windows_read_is_refused() -> None:
    data = np.zeros((2, 8, 16), np.float32)
    out = np.empty((2, 4, 8), np.float32)
    with pytest.raises(ValueError, match=r"rows \[2, 6\)"):
        max_pool_vector.band_job(data[:, 2:6], 2, 8, out, (1, 3), 1)
