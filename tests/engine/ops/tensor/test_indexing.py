"""Indexing ops: take, pick, one_hot, where, Embedding."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ShapeError
from engine.ops import get_op
from tests.engine.ops.helpers import infer, run

RNG = np.random.default_rng(11)
F32 = np.dtype(np.float32)


def normal(*shape: int) -> np.ndarray:
    return RNG.normal(size=shape).astype(np.float32)


def test_take_clip_and_wrap() -> None:
    data = normal(4, 3)
    indices = np.array([[-2.0, 1.0], [3.0, 9.0]], np.float32)
    (out,) = run("take", {}, data, indices)
    np.testing.assert_array_equal(out, data[[[0, 1], [3, 3]]])
    (out,) = run("take", {"axis": "1", "mode": "wrap"}, data, indices)
    np.testing.assert_array_equal(out, data[:, [[1, 1], [0, 0]]])
    (out,) = run("take", {"mode": "raise"}, data, indices)  # treated as clip
    assert out.shape == (2, 2, 3)
    assert infer("take", {"axis": "1"}, [(4, 3), (5,)])[1] == [(4, 5)]
    op = get_op("take")
    assert op.infer_dtype(op.parse_attrs({}), [F32, np.dtype(np.int32)]) == (
        [F32, np.dtype(np.int32)], [F32])


def test_pick() -> None:
    data = normal(3, 4)
    index = np.array([0.0, 3.0, 7.0], np.float32)
    (out,) = run("pick", {}, data, index)
    np.testing.assert_array_equal(out, data[np.arange(3), [0, 3, 3]])
    (out,) = run("pick", {"axis": "0", "keepdims": "True", "mode": "wrap"}, data,
                 np.array([1.0, 4.0, 2.0, -1.0], np.float32))
    np.testing.assert_array_equal(out, data[[1, 1, 2, 2], np.arange(4)][None, :])
    assert infer("pick", {"axis": "1"}, [(3, 4), None]) == ([(3, 4), (3,)], [(3,)])


def test_one_hot_out_of_range_is_all_off() -> None:
    (out,) = run("one_hot", {"depth": "3", "on_value": "5", "off_value": "-1", "dtype": "int32"},
                 np.array([0.0, 2.0, 3.0, -1.0], np.float32))
    np.testing.assert_array_equal(out, [[5, -1, -1], [-1, -1, 5], [-1] * 3, [-1] * 3])
    assert out.dtype == np.int32


def test_where_row_condition_and_shapes() -> None:
    x, y = normal(3, 2), normal(3, 2)
    (out,) = run("where", {}, np.array([1.0, 0.0, 2.0], np.float32), x, y)
    np.testing.assert_array_equal(out, np.stack([x[0], y[1], x[2]]))
    assert infer("where", {}, [(3,), None, (3, 2)]) == ([(3,), (3, 2), (3, 2)], [(3, 2)])
    assert infer("where", {}, [(3, 2), None, None])[1] == [(3, 2)]
    with pytest.raises(ShapeError, match="1-D"):
        infer("where", {}, [(4,), (3, 2), (3, 2)])


def test_embedding_clamps_and_infers_weight() -> None:
    op = get_op("Embedding")
    attrs = op.parse_attrs({"input_dim": "5", "output_dim": "3", "dtype": "float32",
                            "sparse_grad": "False"})
    assert op.infer_shape(attrs, [(2, 4), None]) == ([(2, 4), (5, 3)], [(2, 4, 3)])
    assert op.infer_dtype(attrs, [np.dtype(np.int32), None]) == (
        [np.dtype(np.int32), F32], [F32])
    weight = normal(5, 3)
    for indices in (np.array([[0, 7], [-3, 4]], np.int32),
                    np.array([[0.0, 7.0], [-3.0, 4.0]], np.float32)):
        (out,) = op.compute(np, attrs, [indices, weight])
        np.testing.assert_array_equal(out, weight[[[0, 4], [0, 4]]])
