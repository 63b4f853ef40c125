"""slice with None and steps, slice_axis, slice_like."""

from __future__ import annotations

import numpy as np

from tests.engine.ops.helpers import infer, run

RNG = np.random.default_rng(7)


def test_slice_with_none_and_steps() -> None:
    data = RNG.normal(size=(5, 6, 7)).astype(np.float32)
    raw = {"begin": "(None, -4, 1)", "end": "(None, None, -1)", "step": "(-1, 2, None)"}
    (out,) = run("slice", raw, data)
    np.testing.assert_array_equal(out, data[::-1, -4::2, 1:-1])
    assert infer("slice", raw, [(5, 6, 7)])[1] == [out.shape]
    assert infer("slice", raw, [(0, 6, 7)])[1] == [(0, 2, 5)]
    (out,) = run("slice_axis", {"axis": "-1", "begin": "-3", "end": "None"}, data)
    np.testing.assert_array_equal(out, data[..., -3:])


def test_slice_like() -> None:
    data = RNG.normal(size=(4, 5, 6)).astype(np.float32)
    like = np.zeros((2, 3), np.float32)
    (out,) = run("slice_like", {}, data, like)
    np.testing.assert_array_equal(out, data[:2, :3])
    (out,) = run("slice_like", {"axes": "(1,)"}, data, like)
    np.testing.assert_array_equal(out, data[:, :3])
