"""`engine.kernels.parity_split`: an image copied into rows split by column parity."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cpu import compiled
from engine.kernels import parity_split

RNG = np.random.default_rng(29)


def expected(image: np.ndarray, rows: int, half: int, pad_y: int, pad_x: int) -> np.ndarray:
    """The split buffer built from the padded image column by column."""
    channels, height, width = image.shape
    split = np.zeros((channels, rows, 2, half), np.float32)
    for column in range(width):
        padded = column + pad_x
        split[:, pad_y:pad_y + height, padded % 2, padded // 2] = image[:, :, column]
    return split


@pytest.mark.parametrize("width", [1, 2, 7, 224, 225])
@pytest.mark.parametrize("pad", [(0, 0), (1, 1), (3, 3), (2, 1)])
@pytest.mark.parametrize("numba", [True, False], ids=["compiled", "numpy"])
def test_columns_land_in_their_parity_half(width: int, pad: tuple, numba: bool,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    if numba and not compiled.available():
        pytest.skip("numba is not installed")
    if not numba:
        monkeypatch.setattr(compiled, "available", lambda: False)
    pad_y, pad_x = pad
    image = RNG.standard_normal((3, 5, width)).astype(np.float32)
    image[1, 2, 0] = np.nan
    rows, half = 5 + 2 * pad_y + 1, (width + 2 * pad_x + 1) // 2 + 1
    split = np.zeros((3, rows, 2, half), np.float32)
    calls = parity_split.copy(image, split, pad_y, pad_x)
    assert len(calls) == (1 if numba else min(2, width))
    for _ in range(2):  # again over the same buffer: the border stays zero
        for call in calls:
            call()
        np.testing.assert_array_equal(split, expected(image, rows, half, pad_y, pad_x))
        image[...] = RNG.standard_normal(image.shape)


def test_the_compiled_copy_leaves_blas_alone() -> None:
    if not compiled.available():
        pytest.skip("numba is not installed")
    from engine.cpu import spin_pool

    image = np.zeros((1, 4, 4), np.float32)
    (call,) = parity_split.copy(image, np.zeros((1, 6, 2, 3), np.float32), 1, 1)
    assert spin_pool.quiet_for_blas(call)


@pytest.mark.parametrize("parts", [1, 2, 5])
def test_the_compiled_copy_runs_as_a_job_of_row_runs(parts: int) -> None:
    """In a plan the copy is a job (`SplitCopy.as_job`) whose parts are runs of the image's
    rows, channel after channel: each part writes its own rows; together, the whole copy."""
    if not compiled.available():
        pytest.skip("numba is not installed")
    import ctypes

    pad_y, pad_x = 3, 3
    image = RNG.standard_normal((3, 7, 11)).astype(np.float32)
    rows, half = 7 + 2 * pad_y + 1, (11 + 2 * pad_x + 1) // 2 + 1
    split = np.zeros((3, rows, 2, half), np.float32)
    (call,) = parity_split.copy(image, split, pad_y, pad_x)
    job = call.as_job(None)
    assert job is not None
    task = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(job.args[-3])
    want = expected(image, rows, half, pad_y, pad_x)
    done = np.zeros(3 * 7, bool)
    for part in range(parts):
        task(job.args[-2], part, parts)
        first, last = part * 21 // parts, (part + 1) * 21 // parts
        done[first:last] = True
        for index in range(21):
            channel, row = divmod(index, 7)
            got = split[channel, pad_y + row]
            np.testing.assert_array_equal(got, want[channel, pad_y + row] if done[index]
                                          else np.zeros_like(got))
    np.testing.assert_array_equal(split, want)
