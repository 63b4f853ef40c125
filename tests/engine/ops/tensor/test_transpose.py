"""Transposes and the depth/space rearrangements."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ShapeError
from engine.ops import get_op
from tests.engine.ops.helpers import infer, run

RNG = np.random.default_rng(7)


def test_transpose_writes_into_out() -> None:
    data = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    op = get_op("transpose")
    attrs = op.parse_attrs({"axes": "(1, 2, 0)"})
    target = np.empty((3, 4, 2), np.float32)
    (out,) = op.compute(np, attrs, [data], out=target)
    assert out is target
    np.testing.assert_array_equal(target, data.transpose(1, 2, 0))
    with pytest.raises(ShapeError, match="permutation"):
        infer("transpose", {"axes": "(0, 0, 1)"}, [(2, 3, 4)])


def test_depth_to_space_and_back() -> None:
    deep = RNG.normal(size=(2, 8, 3, 5)).astype(np.float32)
    (spread,) = run("depth_to_space", {"block_size": "2"}, deep)
    assert spread.shape == (2, 2, 6, 10)
    # Output pixel (h*2+i, w*2+j) of channel c comes from input channel (i*2+j)*2+c.
    np.testing.assert_array_equal(spread[:, 1, 2 * 1 + 1, 2 * 3 + 0], deep[:, (1 * 2 + 0) * 2 + 1,
                                                                             1, 3])
    (back,) = run("space_to_depth", {"block_size": "2"}, spread)
    np.testing.assert_array_equal(back, deep)
