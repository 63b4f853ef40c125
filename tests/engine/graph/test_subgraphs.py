"""Reading and writing control-flow nodes' subgraphs (``_foreach``, ``_while_loop``, ``_cond``)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from engine.errors import ModelFormatError
from engine.graph.json_format import MAX_SUBGRAPH_DEPTH, graph_from_json, graph_to_json
from tests.conformance.fixtures import control_flow_names, model_files

SUBGRAPH_COUNTS = {"_foreach": 1, "_while_loop": 2, "_cond": 3}


def _document(name: str) -> dict[str, Any]:
    return json.loads(model_files(name)[0].read_text())


def _control_node(document: dict[str, Any]) -> dict[str, Any]:
    return next(node for node in document["nodes"] if node.get("subgraphs"))


@pytest.mark.parametrize("name", control_flow_names())
def test_subgraphs_are_read_into_the_ir_and_written_back_byte_for_byte(name: str) -> None:
    text = model_files(name)[0].read_text()
    graph = graph_from_json(text)
    (node,) = [node for node in graph.nodes if node.subgraphs]
    assert len(node.subgraphs) == SUBGRAPH_COUNTS[node.op]
    raw = _control_node(json.loads(text))["subgraphs"]
    for subgraph, document in zip(node.subgraphs, raw):
        assert [sub.name for sub in subgraph.nodes] == [item["name"] for item in document["nodes"]]
        assert len(subgraph.heads) == len(document["heads"])
    assert graph_to_json(graph) == text


def test_unknown_annotations_inside_a_subgraph_are_tolerated() -> None:
    document = _document("foreach_rnn_tiny")
    body = _control_node(document)["subgraphs"][0]
    body["nodes"][3]["attrs"]["__init__"] = "<object repr>"
    body["nodes"][3]["attrs"]["__made_by__"] = "gluon"
    graph = graph_from_json(document)
    (node,) = [node for node in graph.nodes if node.subgraphs]
    assert node.subgraphs[0].nodes[3].attrs["__made_by__"] == "gluon"


def test_a_bad_subgraph_is_refused_naming_the_node_and_subgraph() -> None:
    document = _document("while_loop_tiny")
    _control_node(document)["subgraphs"][1]["nodes"][3]["inputs"] = [[99, 0, 0]]
    with pytest.raises(ModelFormatError, match=r"_while_loop\) subgraph #1.*node #99"):
        graph_from_json(document)


def test_subgraphs_that_are_not_a_list_are_refused() -> None:
    document = _document("cond_tiny")
    _control_node(document)["subgraphs"] = {"nodes": []}
    with pytest.raises(ModelFormatError, match="'subgraphs' must be a list; got dict"):
        graph_from_json(document)


def test_subgraphs_nested_too_deep_are_refused() -> None:
    document = _document("cond_tiny")
    node = _control_node(document)
    innermost = node
    for _ in range(MAX_SUBGRAPH_DEPTH):  # wrap the cond node in its own else branch, repeatedly
        wrapped = copy.deepcopy(innermost)
        innermost["subgraphs"][2] = {"nodes": [*document["nodes"][:node_index(document)],
                                               wrapped],
                                     "arg_nodes": [], "node_row_ptr": [],
                                     "heads": [[node_index(document), 0, 0]]}
        innermost = wrapped
    with pytest.raises(ModelFormatError, match=f"nested more than {MAX_SUBGRAPH_DEPTH} deep"):
        graph_from_json(document)


def node_index(document: dict[str, Any]) -> int:
    return next(index for index, node in enumerate(document["nodes"]) if node.get("subgraphs"))
