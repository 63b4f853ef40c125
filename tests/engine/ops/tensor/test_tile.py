"""Tiling, broadcasting, padding and reversing."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ShapeError
from tests.engine.ops.helpers import infer, run

RNG = np.random.default_rng(7)


def test_tile_repeat_broadcast() -> None:
    data = RNG.normal(size=(2, 1, 3)).astype(np.float32)
    (out,) = run("tile", {"reps": "(2, 1, 1, 2)"}, data)
    np.testing.assert_array_equal(out, np.tile(data, (2, 1, 1, 2)))
    assert infer("tile", {"reps": "(2, 1, 1, 2)"}, [data.shape])[1] == [out.shape]
    (out,) = run("broadcast_to", {"shape": "(0, 4, 0)"}, data)
    np.testing.assert_array_equal(out, np.broadcast_to(data, (2, 4, 3)))
    (out,) = run("broadcast_axes", {"axis": "(1,)", "size": "(5,)"}, data)
    assert out.shape == (2, 5, 3)
    like = np.zeros((7, 9, 3), np.float32)
    (out,) = run("broadcast_like", {"lhs_axes": "(1,)", "rhs_axes": "(0,)"}, data, like)
    np.testing.assert_array_equal(out, np.broadcast_to(data, (2, 7, 3)))
    with pytest.raises(ShapeError, match="cannot broadcast"):
        infer("broadcast_to", {"shape": "(3, 4, 3)"}, [data.shape])


def test_pad_and_reverse() -> None:
    data = RNG.normal(size=(1, 2, 3, 4)).astype(np.float32)
    raw = {"mode": "reflect", "pad_width": "(0, 0, 0, 0, 1, 2, 2, 1)"}
    (out,) = run("Pad", raw, data)
    np.testing.assert_array_equal(out, np.pad(data, ((0, 0), (0, 0), (1, 2), (2, 1)), "reflect"))
    assert infer("Pad", raw, [(0, 2, 3, 4)])[1] == [(0, 2, 6, 7)]
    (out,) = run("flip", {"axis": "(1, 3)"}, data)
    np.testing.assert_array_equal(out, data[:, ::-1, :, ::-1])
