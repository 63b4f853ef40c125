"""Misc ops: indexing, casts, creation with partial shapes, products, embeddings, sequences."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.errors import ShapeError
from engine.graph.infer import infer_shapes
from engine.graph.ir import Entry, Graph, make_node
from engine.ops import get_op
from engine.runtime.interpreter import evaluate

RNG = np.random.default_rng(11)
F32 = np.dtype(np.float32)


def infer(op_name: str, raw: dict[str, Any], shapes: list) -> tuple[list, list]:
    op = get_op(op_name)
    return op.infer_shape(op.parse_attrs(raw), shapes)


def run(op_name: str, raw: dict[str, Any], *inputs: np.ndarray) -> tuple[np.ndarray, ...]:
    op = get_op(op_name)
    return op.compute(np, op.parse_attrs(raw), list(inputs))


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


def test_cast_truncates_and_amp_cast_keeps_integers() -> None:
    data = np.array([-1.7, -0.5, 0.5, 2.9, 300.2], np.float32)
    (out,) = run("cast", {"dtype": "int32"}, data)
    np.testing.assert_array_equal(out, [-1, 0, 0, 2, 300])
    (out,) = run("Cast", {"dtype": "uint8"}, data)
    np.testing.assert_array_equal(out, [255, 0, 0, 2, 44])  # wraps like a C cast
    (out,) = run("amp_cast", {"dtype": "float16"}, data)
    assert out.dtype == np.float16
    (out,) = run("amp_cast", {"dtype": "float16"}, np.arange(3, dtype=np.int32))
    assert out.dtype == np.int32
    op = get_op("Cast")
    assert op.infer_dtype(op.parse_attrs({"dtype": "float16"}), [F32])[1] == [np.float16]


def test_zeros_with_partial_shape_from_attrs() -> None:
    op = get_op("_zeros")
    attrs = op.parse_attrs({"__layout__": "LNC", "dtype": "float32", "shape": "(1, 0, 32)"})
    assert op.input_names(attrs) == ()
    assert op.infer_shape(attrs, []) == ([], [(1, 0, 32)])
    assert op.infer_dtype(attrs, []) == ([], [F32])
    with pytest.raises(ShapeError, match="unknown"):
        op.compute(np, attrs, [])
    target = np.full((1, 5, 32), 7.0, np.float32)
    (out,) = op.compute(np, attrs, [], out=target)
    assert out is target and not target.any()
    assert infer("_zeros", {}, [])[1] == [None]
    assert infer("_npi_zeros", {"shape": "()"}, [])[1] == [()]


def test_zeros_shape_is_filled_by_graph_inference() -> None:
    nodes = (
        make_node("null", "data"),
        make_node("_zeros", "state", {"shape": "(1, 0, 32)", "__layout__": "LNC"}),
        make_node("Concat", "joined", {"num_args": "2", "dim": "0"}, (Entry(0), Entry(1))),
    )
    graph = Graph(nodes, (Entry(2),))
    shapes = infer_shapes(graph, {"data": (2, 5, 32)})
    assert shapes[1] == [(1, 5, 32)]
    assert shapes[2] == [(3, 5, 32)]
    data = normal(2, 5, 32)
    (out,) = evaluate(graph, {"data": data}, np, shapes)
    np.testing.assert_array_equal(out, np.concatenate([data, np.zeros((1, 5, 32))]))


def test_full_and_like_ops() -> None:
    (out,) = run("_full", {"shape": "(2, 3)", "value": "2.5", "dtype": "float64"})
    np.testing.assert_array_equal(out, np.full((2, 3), 2.5))
    assert out.dtype == np.float64
    (out,) = run("_npi_ones", {"shape": "(2,)"})
    assert out.dtype == np.float32 and out.tolist() == [1.0, 1.0]
    data = np.arange(6, dtype=np.int32).reshape(2, 3)
    (out,) = run("_npi_full_like", {"fill_value": "4", "ctx": "cpu(0)"}, data)
    assert out.dtype == np.int32 and (out == 4).all()
    op = get_op("_npi_full_like")
    attrs = op.parse_attrs({"fill_value": "0", "dtype": "float16"})
    assert op.infer_dtype(attrs, [F32])[1] == [np.float16]
    (out,) = run("zeros_like", {}, data)
    assert out.dtype == np.int32 and not out.any()


@pytest.mark.parametrize(("lhs", "rhs", "ta", "tb"), [
    ((2, 3, 4), (4, 5), False, False),
    ((2, 3, 4), (4, 5, 6), False, False),
    ((4, 2, 3), (4, 5), True, False),
    ((2, 3, 4), (5, 6, 4), False, True),
    ((4,), (4, 5), False, False),
    ((3, 4), (4,), False, False),
])
def test_dot_nd_semantics(lhs: tuple, rhs: tuple, ta: bool, tb: bool) -> None:
    a, b = normal(*lhs), normal(*rhs)
    raw = {"transpose_a": str(ta), "transpose_b": str(tb)}
    (out,) = run("dot", raw, a, b)
    left = np.moveaxis(a, 0, -1) if ta else a        # contracted axis last
    right = np.moveaxis(b, -1, 0) if tb else b       # contracted axis first
    expected = np.tensordot(left, right, axes=([-1], [0]))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert infer("dot", raw, [lhs, rhs])[1] == [expected.shape]


def test_dot_partial_and_mismatch() -> None:
    assert infer("dot", {}, [(0, 4), (4, 5)])[1] == [(0, 5)]
    assert infer("dot", {}, [None, (4, 5)])[1] == [None]
    with pytest.raises(ShapeError, match="do not contract"):
        infer("dot", {"transpose_b": "True"}, [(3, 4), (4, 5)])


def test_batch_dot_matmul_np_dot() -> None:
    a, b = normal(2, 4, 3), normal(2, 4, 5)
    (out,) = run("batch_dot", {"transpose_a": "True"}, a, b)
    np.testing.assert_allclose(out, np.matmul(a.transpose(0, 2, 1), b), rtol=1e-5, atol=1e-5)
    assert infer("batch_dot", {"transpose_a": "True"}, [a.shape, b.shape])[1] == [(2, 3, 5)]
    c, d = normal(3, 1, 2, 4), normal(5, 4, 6)
    (out,) = run("_npi_matmul", {}, c, d)
    assert infer("_npi_matmul", {}, [c.shape, d.shape])[1] == [out.shape] == [(3, 5, 2, 6)]
    assert infer("_npi_matmul", {}, [(4,), (2, 4, 6)])[1] == [(2, 6)]
    e, f = normal(2, 3, 4), normal(5, 4, 6)
    (out,) = run("_np_dot", {}, e, f)
    assert infer("_np_dot", {}, [e.shape, f.shape])[1] == [out.shape] == [(2, 3, 5, 6)]


def test_add_n_writes_into_out() -> None:
    arrays = [normal(2, 3) for _ in range(4)]
    op = get_op("ElementWiseSum")
    attrs = op.parse_attrs({"num_args": "4"})
    assert op.input_names(attrs) == ("arg0", "arg1", "arg2", "arg3")
    target = np.empty((2, 3), np.float32)
    op.compute(np, attrs, arrays, out=target)
    np.testing.assert_allclose(target, sum(arrays), rtol=1e-6)
    assert not np.shares_memory(op.compute(np, attrs, arrays)[0], arrays[0])


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


def test_sequence_last_both_axes() -> None:
    data = normal(5, 3, 2)  # (time, batch, feature)
    lengths = np.array([5.0, 1.0, 3.0], np.float32)
    raw = {"use_sequence_length": "True"}
    (out,) = run("SequenceLast", raw, data, lengths)
    np.testing.assert_array_equal(out, data[[4, 0, 2], [0, 1, 2]])
    (out,) = run("SequenceLast", {**raw, "axis": "1"}, data.transpose(1, 0, 2), lengths)
    np.testing.assert_array_equal(out, data[[4, 0, 2], [0, 1, 2]])
    assert infer("SequenceLast", {**raw, "axis": "1"}, [(3, 5, 2), None]) == (
        [(3, 5, 2), (3,)], [(3, 2)])
    assert get_op("SequenceLast").input_names(get_op("SequenceLast").parse_attrs({})) == (
        "data",)


def test_sequence_mask_and_reverse_match_a_loop() -> None:
    data = normal(4, 3, 2)
    lengths = np.array([2.0, 4.0, 1.0], np.float32)
    raw = {"use_sequence_length": "True", "value": "-9"}
    masked = data.copy()
    reversed_ = data.copy()
    for b, length in enumerate(lengths.astype(int)):
        masked[length:, b] = -9
        reversed_[:length, b] = data[:length, b][::-1]
    (out,) = run("SequenceMask", raw, data, lengths)
    np.testing.assert_array_equal(out, masked)
    (out,) = run("SequenceMask", {**raw, "axis": "1"}, data.transpose(1, 0, 2), lengths)
    np.testing.assert_array_equal(out, masked.transpose(1, 0, 2))
    (out,) = run("SequenceReverse", {"use_sequence_length": "True"}, data, lengths)
    np.testing.assert_array_equal(out, reversed_)
    (out,) = run("SequenceReverse", {}, data)
    np.testing.assert_array_equal(out, data[::-1])


def test_shape_and_size_arrays() -> None:
    data = normal(2, 3, 4)
    (shape,) = run("shape_array", {}, data)
    (size,) = run("size_array", {}, data)
    assert shape.dtype == size.dtype == np.int64
    assert shape.tolist() == [2, 3, 4] and size.tolist() == [24]
    assert infer("shape_array", {}, [(0, 3)])[1] == [(2,)]
