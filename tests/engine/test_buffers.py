"""`engine.runtime.buffers.fill_rows`: a short batch fills the first rows and zeroes the rest."""

from __future__ import annotations

import numpy as np

from engine.runtime.buffers import fill_rows


def test_a_short_batch_fills_the_first_rows_and_zeroes_the_rest() -> None:
    buffer = np.full((4, 3), 7.0, np.float32)  # what the previous, larger batch left
    fill_rows(buffer, np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(buffer, [[1, 1, 1], [1, 1, 1], [0, 0, 0], [0, 0, 0]])


def test_a_full_batch_and_a_scalar_are_copied_whole() -> None:
    buffer = np.zeros((2, 2), np.float64)
    fill_rows(buffer, np.arange(4.0).reshape(2, 2))
    np.testing.assert_array_equal(buffer, [[0, 1], [2, 3]])
    scalar = np.zeros((), np.float32)
    fill_rows(scalar, np.float32(5))
    assert scalar == 5


def test_the_copy_function_is_used_for_the_rows() -> None:
    calls = []
    buffer = np.zeros((3, 2), np.float32)

    def copy(target: np.ndarray, source: np.ndarray) -> None:
        calls.append(target.shape)
        np.copyto(target, source, casting="same_kind")

    fill_rows(buffer, np.ones((1, 2), np.float32), copy)
    assert calls == [(1, 2)] and buffer.sum() == 2
