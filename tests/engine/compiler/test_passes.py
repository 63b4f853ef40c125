"""Each compiler pass: the structural change it promises, `verify`, and unchanged outputs."""

from __future__ import annotations

import numpy as np

from engine.compiler import optimize_graph
from engine.compiler.eliminate_dead_nodes import eliminate_dead_nodes
from engine.compiler.fold_batchnorm import fold_batchnorm
from engine.compiler.fold_constants import fold_constants
from engine.compiler.fuse_elementwise import fuse_elementwise
from engine.graph.ir import Entry, Graph, make_node, verify
from engine.runtime.interpreter import evaluate
from tests.engine.compiler.graphs import conv_bn_relu, mlp, variable


def run(graph: Graph, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return evaluate(graph, {**graph.constants, **feed}, np)


def ops(graph: Graph) -> list[str]:
    return [node.op for node in graph.nodes if not node.is_variable]


def test_fold_batchnorm_removes_batchnorm_and_keeps_outputs() -> None:
    graph, _ = conv_bn_relu()
    feed = {"data": np.random.default_rng(0).normal(size=(2, 2, 5, 5)).astype(np.float32)}
    folded = eliminate_dead_nodes(fold_batchnorm(graph))
    verify(folded)
    assert "BatchNorm" not in ops(folded)
    assert ops(folded) == ["Convolution", "relu", "FullyConnected"]
    np.testing.assert_allclose(run(folded, feed)[0], run(graph, feed)[0], rtol=1e-4, atol=1e-5)


def test_fold_batchnorm_skips_shared_producer() -> None:
    graph, _ = conv_bn_relu()
    # A second reader of the convolution output makes folding it into the BatchNorm illegal.
    extra = make_node("relu", "second_reader", {}, (Entry(3),))
    shared = graph.replace(nodes=(*graph.nodes, extra), heads=(Entry(12), Entry(13)))
    assert fold_batchnorm(shared) is shared


def test_fold_constants_evaluates_parameter_only_subgraph() -> None:
    nodes = (variable("data"), variable("w"),
             make_node("_mul_scalar", "scaled", {"scalar": "2"}, (Entry(1),)),
             make_node("elemwise_add", "add", {}, (Entry(0), Entry(2))))
    graph = Graph(nodes, (Entry(3),), constants={"w": np.ones((2, 3), np.float32)})
    folded = eliminate_dead_nodes(fold_constants(graph))
    verify(folded)
    assert ops(folded) == ["elemwise_add"]
    feed = {"data": np.arange(6, dtype=np.float32).reshape(2, 3)}
    np.testing.assert_allclose(run(folded, feed)[0], feed["data"] + 2)


def test_fold_constants_keeps_batch_shaped_zeros() -> None:
    nodes = (variable("data"), make_node("_zeros", "state", {"shape": "(0, 3)"}),
             make_node("elemwise_add", "add", {}, (Entry(0), Entry(1))))
    graph = Graph(nodes, (Entry(2),))
    assert fold_constants(graph) is graph


def test_eliminate_dead_nodes_drops_unreachable() -> None:
    nodes = (variable("data"), make_node("relu", "dead", {}, (Entry(0),)),
             make_node("sigmoid", "live", {}, (Entry(0),)))
    graph = Graph(nodes, (Entry(2),))
    pruned = eliminate_dead_nodes(graph)
    verify(pruned)
    assert ops(pruned) == ["sigmoid"]
    assert eliminate_dead_nodes(pruned) is pruned


def test_fuse_elementwise_merges_epilogues() -> None:
    graph, _ = mlp()
    fused = fuse_elementwise(graph)
    verify(fused)
    assert ops(fused) == ["_fused_elementwise", "_fused_elementwise", "FullyConnected"]
    feed = {"data": np.random.default_rng(1).normal(size=(4, 512)).astype(np.float32)}
    np.testing.assert_allclose(run(fused, feed)[0], run(graph, feed)[0], rtol=1e-5, atol=1e-5)


def test_fuse_elementwise_chain_with_second_operand() -> None:
    nodes = (variable("a"), variable("b"),
             make_node("exp", "e", {}, (Entry(0),)),
             make_node("elemwise_sub", "sub", {}, (Entry(1), Entry(2))),  # running value on rhs
             make_node("_mul_scalar", "mul", {"scalar": "3"}, (Entry(3),)),
             make_node("relu", "relu", {}, (Entry(4),)))
    graph = Graph(nodes, (Entry(5),))
    fused = fuse_elementwise(graph)
    verify(fused)
    assert ops(fused) == ["_fused_elementwise"]
    rng = np.random.default_rng(2)
    feed = {"a": rng.normal(size=(3, 4)).astype(np.float32),
            "b": rng.normal(size=(3, 4)).astype(np.float32)}
    expected = np.maximum((feed["b"] - np.exp(feed["a"])) * 3, 0)
    np.testing.assert_allclose(run(fused, feed)[0], expected, rtol=1e-6)
    np.testing.assert_allclose(run(graph, feed)[0], expected, rtol=1e-6)


def test_fusion_never_writes_into_inputs() -> None:
    nodes = (variable("a"), make_node("BlockGrad", "identity", {}, (Entry(0),)),
             make_node("relu", "relu", {}, (Entry(1),)))
    graph = Graph(nodes, (Entry(2),))
    feed = {"a": np.array([-1.0, 2.0], np.float32)}
    run(fuse_elementwise(graph), feed)
    np.testing.assert_array_equal(feed["a"], [-1.0, 2.0])


def test_full_pipeline_matches_reference() -> None:
    graph, _ = conv_bn_relu()
    optimized = optimize_graph(graph, ["fold_constants", "fold_batchnorm",
                                       "eliminate_dead_nodes", "fuse_elementwise"], check=True)
    feed = {"data": np.random.default_rng(3).normal(size=(1, 2, 5, 5)).astype(np.float32)}
    np.testing.assert_allclose(run(optimized, feed)[0], run(graph, feed)[0], rtol=1e-4, atol=1e-5)
