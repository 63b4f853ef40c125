"""`engine.ops.control.flow` beyond MXNet's own outputs: shapes, padding, passes and errors."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import engine
from engine.compiler import PASSES, optimize_graph
from engine.errors import ExecutionError
from engine.graph.infer import infer_dtypes, infer_shapes
from engine.graph.json_format import graph_from_json
from engine.runtime.loader import read_params
from tests.conformance.fixtures import model_files, model_io_sets


def _graph(name: str) -> Any:
    return graph_from_json(model_files(name)[0].read_text())


def _head_shapes(graph: Any, known: dict[str, tuple[int, ...]]) -> list[Any]:
    shapes = infer_shapes(graph, known)
    return [shapes[entry.node][entry.index] for entry in graph.heads]


def test_foreach_shapes_follow_the_sequence_and_learn_the_state() -> None:
    graph = _graph("foreach_rnn_tiny")
    # Only the sequence is given: the state's shape comes back from the body's new state.
    shapes = infer_shapes(graph, {"data0": (5, 3, 4)})
    assert _head_shapes(graph, {"data0": (5, 3, 4)}) == [(5, 3, 8), (3, 8)]
    state = next(index for index, node in enumerate(graph.nodes) if node.name == "data1")
    assert shapes[state] == [(3, 8)]


def test_while_loop_outputs_are_padded_to_max_iterations_in_shape_and_dtype() -> None:
    graph = _graph("while_loop_tiny")
    assert _head_shapes(graph, {"data": (7, 4)}) == [(6, 7, 4), (1,), (7, 4)]
    dtypes = infer_dtypes(graph, {"data": np.float32})
    assert [dtypes[entry.node][entry.index] for entry in graph.heads] == [np.float32] * 3


@pytest.mark.parametrize("optimize", [False, True])
def test_a_loop_that_never_iterates_gives_zero_rows_and_its_inputs(optimize: bool) -> None:
    # MXNet 1.9.1 cannot run this case (its output shapes stay unknown); the engine infers them.
    model = engine.load_model(*model_files("while_loop_tiny"), optimize=optimize)
    data = np.full((2, 4), 2.0, np.float32)  # mean |data| = 2 fails the condition at once
    steps, count, value = model.run({"data": data})
    assert steps.shape == (6, 2, 4) and not steps.any()
    assert count.tolist() == [0.0]
    np.testing.assert_array_equal(value, data)


def test_padding_rows_after_an_early_stop_are_zero() -> None:
    model = engine.load_model(*model_files("while_loop_tiny"))
    inputs, _ = model_io_sets("while_loop_tiny")[1]
    steps, count, _ = model.run(inputs)
    assert 0 < int(count[0]) < 6
    assert steps[int(count[0]):].size and not steps[int(count[0]):].any()
    assert np.abs(steps[:int(count[0])]).min(axis=(1, 2)).all()


@pytest.mark.parametrize("name", ["foreach_rnn_tiny", "while_loop_tiny", "cond_tiny"])
def test_passes_keep_subgraphs_and_the_variables_only_they_read(name: str) -> None:
    graph = _graph(name)
    params = read_params(model_files(name)[1])
    graph = graph.replace(constants={key.split(":", 1)[-1]: value
                                     for key, value in params.items()})
    optimized = optimize_graph(graph, [name for name in PASSES if name != "plan_memory"],
                               check=True)
    before = [node for node in graph.nodes if node.subgraphs]
    after = [node for node in optimized.nodes if node.subgraphs]
    assert [(node.op, node.subgraphs) for node in after] == [
        (node.op, node.subgraphs) for node in before]
    # The weights feed nothing but the control-flow node: they must survive dead-node removal.
    weights = {node.name for node in graph.nodes if node.name.endswith("_weight")}
    assert weights and weights <= {node.name for node in optimized.nodes}


def test_a_predicate_with_more_than_one_element_is_an_error_naming_the_node() -> None:
    document = json.loads(model_files("cond_tiny")[0].read_text())
    control = next(node for node in document["nodes"] if node.get("subgraphs"))
    control["inputs"][0] = [0, 0, 0]  # the predicate reads the (2, 3) data, not its mean
    model = engine.load_model(document, model_files("cond_tiny")[1], optimize=False)
    with pytest.raises(ExecutionError, match=r"condbranch0__cond0.*\(_cond\).*predicate must "
                                             r"have one element; got shape \(2, 3\)"):
        model.run({"data": np.ones((2, 3), np.float32)})


def test_control_flow_ops_refuse_capture_with_a_reason() -> None:
    for op in ("_foreach", "_while_loop", "_cond"):
        opdef = engine.ops.get_op(op)
        assert not opdef.capturable and opdef.uncapturable
