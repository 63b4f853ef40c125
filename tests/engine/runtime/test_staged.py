"""`StagedPlan`: graphs whose shapes depend on the data run in stages cut after those nodes,
each compiled per concrete shape, and agree with the reference interpreter and NumPy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import engine
from engine import sym
from engine.errors import InputError
from engine.graph.ir import verify
from engine.runtime.model import Model
from engine.runtime.plan import Plan
from engine.runtime.staged import StagedPlan, cut_graph, dynamic_nodes
from tests.conformance.fixtures import op_arrays, op_cases

RNG = np.random.default_rng(19)
PARAMS = {"fc_weight": RNG.normal(size=(5, 4)).astype(np.float32),
          "fc_bias": RNG.normal(size=5).astype(np.float32)}


def _two_cuts() -> Any:
    """relu(fc(x)) masked by m, then *2+1; nonzero of that > 2 (a second cut); three heads:
    the nonzero count, column sums of the masked rows, and relu(fc(x)) itself."""
    hidden = sym.relu(sym.FullyConnected(sym.var("x"), num_hidden=5, name="fc"), name="relu")
    kept = sym._contrib_boolean_mask(hidden, sym.var("m"), name="mask")
    scaled = kept * 2 + 1
    count = sym.sum(sym._npx_nonzero(scaled > 2, name="nz"), name="count")
    return sym.Group([count, sym.sum(scaled, axis=0, name="colsum"), hidden])


def _expected(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    hidden = np.maximum(feed["x"] @ PARAMS["fc_weight"].T + PARAMS["fc_bias"], 0)
    scaled = hidden[feed["m"] != 0] * 2 + 1
    return [np.array([np.argwhere(scaled > 2).sum()]), scaled.sum(axis=0), hidden]


def _models() -> tuple[Model, Model]:
    graph = _two_cuts()
    return engine.load_model(graph, PARAMS), engine.load_model(graph, PARAMS, optimize=False)


def _feed(mask: list[int]) -> dict[str, np.ndarray]:
    return {"x": RNG.normal(size=(len(mask), 4)).astype(np.float32),
            "m": np.array(mask, np.float32)}


@pytest.mark.parametrize("mask", [[1, 0, 1, 1, 0, 1], [0, 1, 0, 0, 0, 0], [1] * 6, [0] * 6],
                         ids=["some", "one", "all", "none"])
def test_staged_plan_matches_the_interpreter_and_numpy(mask: list[int]) -> None:
    optimized, reference = _models()
    feed = _feed(mask)
    for model in (optimized, reference):
        outputs = model.run(feed)
        for actual, expected in zip(outputs, _expected(feed), strict=True):
            assert actual.shape == expected.shape
            np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
    assert isinstance(optimized.plan_for(feed), StagedPlan)


def test_outputs_passed_through_an_empty_rest_are_not_overwritten_by_the_next_run() -> None:
    optimized, _ = _models()
    first = _feed([0, 0, 0])
    hidden = optimized.run(first)[2]  # relu(fc(x)), a head the empty rest passes through
    kept = hidden.copy()
    optimized.run(_feed([0, 0, 0]))
    np.testing.assert_array_equal(hidden, kept)


def test_rests_are_compiled_once_per_shape_and_nest_for_a_second_cut() -> None:
    optimized, _ = _models()
    first = _feed([1, 0, 1, 0])
    plan = optimized.plan_for(first)
    assert isinstance(plan, StagedPlan) and isinstance(plan.static, Plan)
    for mask in ([1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]):  # two rows kept each time
        optimized.run({**first, "m": np.array(mask, np.float32)})
    assert len(plan.stages()) == 2  # the static stage and one rest for (2, 5)
    optimized.run({**first, "m": np.array([1, 1, 1, 0], np.float32)})
    stages = plan.stages()
    assert len(stages) == 3 and all(isinstance(stage, StagedPlan) for stage in stages[1:])
    # Each rest cuts again after nonzero: its own static stage holds the fused *2+1.
    rest = stages[1]
    assert [node.op for node in dynamic_nodes(rest.graph)] == ["_npx_nonzero"]
    assert any(node.op == "_fused_elementwise" for node in rest.static.graph.nodes)
    assert optimized.stats()["plans"][0]["cuda_graph_error"].startswith(
        "node 'mask' (_contrib_boolean_mask) cannot run inside a CUDA graph")


def test_the_cut_keeps_parameters_constant_and_feeds_the_crossing_values() -> None:
    graph = engine.load_model(_two_cuts(), PARAMS).optimized_graph
    cut = cut_graph(graph)
    assert [graph.nodes[index].name for index in cut.dynamic] == ["mask"]
    assert not dynamic_nodes(cut.static) and cut.rest is not None
    verify(cut.static)
    verify(cut.rest)
    assert dict(cut.rest_inputs).keys() == {"mask:0", "relu:0"}  # relu is a head
    assert "fc_weight" not in dict(cut.rest_inputs)


def test_an_op_whose_shape_depends_on_the_data_is_never_fused() -> None:
    graph = engine.load_model(_two_cuts(), PARAMS).optimized_graph
    fused = [node for node in graph.nodes if node.op == "_fused_elementwise"]
    assert fused and all(step.op.name != "_contrib_boolean_mask"
                         for node in fused for step in (node.params.head, *node.params.steps))
    assert [node.name for node in dynamic_nodes(graph)] == ["mask", "nz"]


def test_a_data_dependent_model_runs_exact_shapes_whatever_its_buckets() -> None:
    model, _ = _models()
    model.batch_buckets = (8,)
    feed = _feed([1, 0, 1])
    outputs = model.run(feed)
    assert model.plan_signatures() == [(("m", (3,)), ("x", (3, 4)))]
    np.testing.assert_allclose(outputs[1], _expected(feed)[1], rtol=1e-5, atol=1e-5)
    assert model.data_dependent == ("node 'mask' (_contrib_boolean_mask) keeps the rows whose "
                                    "mask entry is nonzero, a count known only at run time")


def test_a_mask_of_the_wrong_length_is_an_input_error_naming_the_node() -> None:
    optimized, reference = _models()
    feed = {"x": np.zeros((4, 4), np.float32), "m": np.ones(3, np.float32)}
    for model in (optimized, reference):
        with pytest.raises(InputError, match=r"node 'mask' \(_contrib_boolean_mask\): index has "
                                             r"3 entries; expected 4"):
            model.run(feed)


def test_static_delete_compiles_a_plain_plan_and_tensor_delete_a_staged_one() -> None:
    cases = {case["id"]: case for case in op_cases()}
    arrays = op_arrays()
    for case_id, kind in (("npi_delete_slice", Plan), ("npi_delete_tensor_axis1", StagedPlan),
                          ("box_nms_topk_all", Plan)):
        case = cases[case_id]
        feed = {spec["name"]: arrays[f"{case_id}/in{k}"]
                for k, spec in enumerate(case["inputs"])}
        model = engine.load_model(case["symbol"])
        assert type(model.plan_for(feed)) is kind, case_id
        np.testing.assert_allclose(model.run(feed)[0], arrays[f"{case_id}/out0"], rtol=1e-6)
        assert (model.data_dependent is None) == (kind is Plan)


def test_profile_and_stats_cover_the_stages() -> None:
    optimized, _ = _models()
    feed = _feed([1, 1, 0, 1])
    optimized.run(feed)
    profile = optimized.profile(feed, repeat=2)
    assert {"_contrib_boolean_mask", "_npx_nonzero", "FullyConnected+relu"} <= set(profile)
    stats = optimized.stats()["plans"][0]
    assert stats["steps"] > 0 and stats["planned_activation_bytes"] > 0
    assert stats["staged"].startswith("node 'mask'") and len(stats["stages"]) == 2
