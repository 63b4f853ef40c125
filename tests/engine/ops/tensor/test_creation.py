"""Casts, filled arrays with partial shapes, shape_array and size_array."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ShapeError
from engine.graph.infer import infer_shapes
from engine.graph.ir import Entry, Graph, make_node
from engine.ops import get_op
from engine.runtime.interpreter import evaluate
from tests.engine.ops.helpers import infer, run

RNG = np.random.default_rng(11)
F32 = np.dtype(np.float32)


def normal(*shape: int) -> np.ndarray:
    return RNG.normal(size=shape).astype(np.float32)


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


def test_shape_and_size_arrays() -> None:
    data = normal(2, 3, 4)
    (shape,) = run("shape_array", {}, data)
    (size,) = run("size_array", {}, data)
    assert shape.dtype == size.dtype == np.int64
    assert shape.tolist() == [2, 3, 4] and size.tolist() == [24]
    assert infer("shape_array", {}, [(0, 3)])[1] == [(2,)]
