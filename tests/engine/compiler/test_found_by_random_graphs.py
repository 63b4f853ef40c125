"""Bugs the registry-wide random graphs found, each pinned by a tiny graph built by hand."""

from __future__ import annotations

import numpy as np
import pytest

from engine.compiler.fold_constants import fold_constants
from engine.compiler.fuse_elementwise import fuse_elementwise
from engine.errors import ExecutionError, ShapeError
from engine.graph.ir import Entry, Graph, make_node
from engine.ops import get_op
from engine.runtime.model import Model

DATA = np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(2, 3, 4)


def test_a_step_that_changes_dtype_is_not_fused() -> None:
    # The chain runs in place on its output's buffer: a bool buffer would turn cast(x) into
    # booleans before ``!= 1`` reads them.
    nodes = (make_node("null", "data"),
             make_node("amp_cast", "cast", {"dtype": "float32"}, (Entry(0),)),
             make_node("_npi_not_equal_scalar", "differs", {"scalar": "1"}, (Entry(1),)),
             make_node("_mul_scalar", "half", {"scalar": "0.5"}, (Entry(1),)),
             make_node("relu", "relu", {}, (Entry(3),)))
    graph = Graph(nodes, (Entry(2), Entry(4)))
    single = Graph(nodes[:3], (Entry(2),))
    assert [node.op for node in fuse_elementwise(single).nodes] == [
        "null", "amp_cast", "_npi_not_equal_scalar"]
    chain = Graph((*nodes[:2], make_node("_npi_less_scalar", "less", {"scalar": "1"},
                                         (Entry(1),))), (Entry(2),))
    assert [node.op for node in fuse_elementwise(chain).nodes] == [
        "null", "amp_cast", "_npi_less_scalar"]
    kept = Graph((*nodes[:2], make_node("_lesser_scalar", "less", {"scalar": "1"}, (Entry(1),))),
                 (Entry(2),))  # the legacy comparison keeps float32: it still fuses
    assert [node.op for node in fuse_elementwise(kept).nodes] == ["null", "_fused_elementwise"]
    expected = Model(graph, {}, optimize=False).infer({"data": DATA})
    outputs = Model(graph, {}, optimize=True).infer({"data": DATA})
    for name, value in expected.items():
        np.testing.assert_array_equal(outputs[name], value)
    assert outputs["differs_output"].sum() == DATA.size - 1  # only the last value is 1


def test_a_constant_node_whose_kernel_fails_stays_and_fails_at_run_time() -> None:
    nodes = (make_node("null", "data"), make_node("null", "weight"),
             make_node("log", "log", {}, (Entry(1),)),
             make_node("_npi_svd", "svd", {}, (Entry(2),)),
             make_node("broadcast_add", "add", {}, (Entry(0), Entry(3, 2))))
    weight = np.full((2, 3, 4), -1.0, np.float32)  # log gives NaN: the SVD cannot converge
    graph = Graph(nodes, (Entry(4),), constants={"weight": weight})
    with np.errstate(invalid="ignore"):
        folded = fold_constants(graph)
        assert [node.op for node in folded.nodes if not node.is_variable] == [
            "_npi_svd", "broadcast_add"]
        with pytest.raises(ExecutionError, match=r"node 'svd' \(_npi_svd\)"):
            Model(Graph(nodes, (Entry(4),)), {"weight": weight}).infer({"data": DATA})


def test_numpy_broadcasting_keeps_unknown_dimensions() -> None:
    op = get_op("_npi_copysign")
    attrs = op.parse_attrs({})
    assert op.infer_shape(attrs, [(2, 3, 4), (0, 3, 4)])[1] == [(2, 3, 4)]
    assert op.infer_shape(attrs, [(1, 3, 1), (0, 1, 4)])[1] == [(0, 3, 4)]
    with pytest.raises(ShapeError, match="do not broadcast"):
        op.infer_shape(attrs, [(2, 3, 4), (0, 5, 4)])
    nodes = (make_node("null", "data"), make_node("null", "weight"),
             make_node("_npi_copysign", "sign", {}, (Entry(1), Entry(0))))
    model = Model(Graph(nodes, (Entry(2),)), {"weight": np.ones((2, 3, 4), np.float32)})
    np.testing.assert_array_equal(model.infer({"data": DATA})["sign_output"],
                                  np.copysign(1.0, DATA))
