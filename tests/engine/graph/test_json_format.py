"""Symbol JSON: byte-exact round trips of MXNet 1.9.1 files, legacy upgrades, and clear errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from engine.errors import ModelFormatError, UnknownOperatorError
from engine.graph.ir import Entry, Graph, make_node, verify
from engine.graph.json_format import graph_from_json, graph_to_json
from tests.conformance.fixtures import MODELS, PARAMS, model_files, model_names, op_cases

MXNET_FILES = [model_files(name)[0] for name in model_names() if name != "legacy_json"]
MXNET_FILES.append(PARAMS / "cnn_fp16-symbol.json")


def _ids(paths: list[Path]) -> list[str]:
    return [path.name for path in paths]


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _mlp() -> dict[str, Any]:
    return _load(MODELS / "seed_mlp" / "seed_mlp-symbol.json")


# --- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", MXNET_FILES, ids=_ids(MXNET_FILES))
def test_round_trip_is_byte_exact(path: Path) -> None:
    text = path.read_text()
    graph = graph_from_json(text)
    assert graph_to_json(graph) == text


@pytest.mark.parametrize("path", MXNET_FILES, ids=_ids(MXNET_FILES))
def test_graph_matches_file(path: Path) -> None:
    document = _load(path)
    graph = graph_from_json(document)
    assert [node.op for node in graph.nodes] == [node["op"] for node in document["nodes"]]
    assert [node.name for node in graph.nodes] == [node["name"] for node in document["nodes"]]
    assert graph.variable_indices() == document["arg_nodes"]
    assert [list(entry) for entry in graph.heads] == document["heads"]
    for node, raw in zip(graph.nodes, document["nodes"], strict=True):
        assert dict(node.attrs) == raw.get("attrs", {})
        assert [list(entry) for entry in node.inputs] == raw["inputs"]


@pytest.mark.parametrize("case", op_cases(), ids=[case["id"] for case in op_cases()])
def test_op_case_symbols_round_trip(case: dict[str, Any]) -> None:
    # Each case's one-op symbol as MXNet wrote it: node_row_ptr checks every op's output count.
    assert json.loads(graph_to_json(graph_from_json(case["symbol"]))) == case["symbol"]


def test_entry_versions_are_kept() -> None:
    graph = graph_from_json((MODELS / "lenet" / "lenet-symbol.json").read_text())
    batch_norm = next(node for node in graph.nodes if node.op == "BatchNorm")
    assert [entry.version for entry in batch_norm.inputs] == [0, 0, 0, 2, 2]


def test_node_row_ptr_counts_hidden_outputs() -> None:
    text = (MODELS / "lenet" / "lenet-symbol.json").read_text()
    graph = graph_from_json(text)
    row_ptr = json.loads(graph_to_json(graph))["node_row_ptr"]
    steps = {node.op: after - before
             for node, before, after in zip(graph.nodes, row_ptr, row_ptr[1:])}
    assert steps["BatchNorm"] == 3 and steps["Pooling"] == 2  # max pooling's workspace
    assert row_ptr == json.loads(text)["node_row_ptr"]


def test_numpy_mode_file_keeps_raw_shapes_and_graph_attrs() -> None:
    graph = graph_from_json((MODELS / "np_mlp" / "np_mlp-symbol.json").read_text())
    weight = next(node for node in graph.nodes if node.name == "np_mlp_dense0_weight")
    assert weight.attrs["__shape__"] == "(256, -1)"
    assert graph.attrs["is_np_shape"] == ("int", 1)


@pytest.mark.parametrize("kind", ["str", "bytes", "bytearray", "memoryview", "dict"])
def test_accepts_every_source_kind(kind: str) -> None:
    text = (MODELS / "hybridnet" / "hybridnet-symbol.json").read_text()
    source: Any = {"str": text, "bytes": text.encode(), "bytearray": bytearray(text.encode()),
                   "memoryview": memoryview(text.encode()), "dict": json.loads(text)}[kind]
    assert graph_to_json(graph_from_json(source)) == text


# --- legacy files --------------------------------------------------------------------------------


def test_legacy_file_upgrades_to_seed_mlp() -> None:
    legacy = graph_from_json((MODELS / "legacy_json" / "legacy_json-symbol.json").read_text())
    seed_text = (MODELS / "seed_mlp" / "seed_mlp-symbol.json").read_text()
    assert legacy == graph_from_json(seed_text)
    assert graph_to_json(legacy) == seed_text


def _legacy(nodes: list[dict[str, Any]], heads: list[list[int]]) -> dict[str, Any]:
    return {"nodes": nodes, "arg_nodes": [], "heads": heads}


def test_legacy_missing_inputs_become_variables() -> None:
    document = _legacy([
        {"op": "null", "name": "data", "inputs": []},
        {"op": "FullyConnected", "name": "fc1", "param": {"num_hidden": "4"},
         "attr": {"ctx_group": "dev1"}, "inputs": [[0, 0]], "backward_source_id": -1},
    ], [[1, 0]])
    graph = graph_from_json(document)
    assert [node.name for node in graph.nodes] == ["data", "fc1_weight", "fc1_bias", "fc1"]
    assert graph.nodes[3].inputs == (Entry(0), Entry(1), Entry(2))
    assert graph.heads == (Entry(3),)
    assert graph.nodes[3].attrs["__ctx_group__"] == "dev1"
    assert graph.nodes[1].attrs == {"__ctx_group__": "dev1"}
    verify(graph)


def test_legacy_missing_aux_states_named_after_node() -> None:
    document = _legacy([
        {"op": "null", "name": "data", "inputs": []},
        {"op": "null", "name": "bn0_gamma", "inputs": []},
        {"op": "null", "name": "bn0_beta", "inputs": []},
        {"op": "BatchNorm", "name": "bn0", "param": {"eps": "0.001"},
         "inputs": [[0, 0], [1, 0], [2, 0]]},
    ], [[3, 0]])
    graph = graph_from_json(document)
    assert [node.name for node in graph.nodes] == [
        "data", "bn0_gamma", "bn0_beta", "bn0_moving_mean", "bn0_moving_var", "bn0"]
    assert graph.aux_variable_names() == ["bn0_moving_mean", "bn0_moving_var"]


def test_legacy_hidden_keys_are_upgraded() -> None:
    document = _legacy([
        {"op": "null", "name": "data", "inputs": []},
        {"op": "null", "name": "w", "attr": {"lr_mult": "0.5"}, "inputs": []},
        {"op": "null", "name": "b", "inputs": []},
        {"op": "FullyConnected", "name": "fc",
         "param": {"num_hidden": "2"}, "attr": {"bias_wd_mult": "0", "wd_mult": "3"},
         "inputs": [[0, 0], [1, 0], [2, 0]]},
    ], [[3, 0]])
    graph = graph_from_json(document)
    assert graph.nodes[1].attrs == {"__lr_mult__": "0.5"}
    assert graph.nodes[2].attrs == {"__wd_mult__": "0"}
    assert graph.nodes[3].attrs == {"num_hidden": "2", "__wd_mult__": "3"}
    assert graph.nodes[3].params.num_hidden == 2


def test_current_files_do_not_get_missing_inputs() -> None:
    document = _mlp()
    document["nodes"][3]["inputs"] = document["nodes"][3]["inputs"][:1]
    with pytest.raises(ModelFormatError, match=r"node #3 'seed_mlp_dense0_fwd'.*has 1 inputs; "
                                               r"expected 3 \(data, weight, bias\)"):
        graph_from_json(document)


def test_control_deps_ignored_and_empty_subgraphs_accepted() -> None:
    document = _mlp()
    document["nodes"][3]["control_deps"] = [0]
    document["nodes"][3]["subgraphs"] = []
    assert graph_from_json(document) == graph_from_json(_mlp())


def test_subgraphs_are_refused() -> None:
    document = _mlp()
    document["nodes"][3]["subgraphs"] = [{"nodes": []}]
    with pytest.raises(ModelFormatError, match=r"node #3 'seed_mlp_dense0_fwd'.*subgraphs"):
        graph_from_json(document)


# --- writing ------------------------------------------------------------------------------------


def test_writer_formats_python_attribute_values_and_layout() -> None:
    data = make_node("null", "data")
    weight = make_node("null", "w", {"__shape__": (3, 0)})
    fc = make_node("FullyConnected", "fc", {"num_hidden": 3, "no_bias": True},
                   (Entry(0), Entry(1)))
    graph = Graph((data, weight, fc), (Entry(2),))
    expected = """{
  "nodes": [
    {
      "op": "null",
      "name": "data",
      "inputs": []
    },
    {
      "op": "null",
      "name": "w",
      "attrs": {"__shape__": "(3, 0)"},
      "inputs": []
    },
    {
      "op": "FullyConnected",
      "name": "fc",
      "attrs": {
        "no_bias": "True",
        "num_hidden": "3"
      },
      "inputs": [[0, 0, 0], [1, 0, 0]]
    }
  ],
  "arg_nodes": [0, 1],
  "node_row_ptr": [0, 1, 2, 3],
  "heads": [[2, 0, 0]],
  "attrs": {"mxnet_version": ["int", 10901]}
}""".replace(",\n", ", \n")  # MXNet puts a space after every comma, line ends included
    assert graph_to_json(graph) == expected


def test_writer_breaks_long_arrays_and_escapes_names() -> None:
    name = 'odd "name"\n\twith\\slash\x01 ü'
    nodes = tuple(make_node("null", f"{name}{index}") for index in range(11))
    graph = Graph(nodes, tuple(Entry(index) for index in range(11)))
    text = graph_to_json(graph)
    assert '"heads": [\n    [0, 0, 0], \n    [1, 0, 0], ' in text
    assert '"arg_nodes": [\n    0, \n    1, ' in text
    document = json.loads(text)
    assert document["nodes"][3]["name"] == f"{name}3"
    assert graph_from_json(text) == graph.replace(
        attrs={"mxnet_version": ("int", 10901)})


# --- errors -------------------------------------------------------------------------------------


def _mutated(change: Any) -> dict[str, Any]:
    document = _mlp()
    change(document)
    return document


BAD_DOCUMENTS: list[tuple[str, Any, str]] = [
    ("top-level list", [1, 2], r"expected an object at the top level"),
    ("no nodes", lambda d: d.pop("nodes"), r"required key 'nodes' is missing"),
    ("nodes not list", lambda d: d.update(nodes={}), r"'nodes' must be a list; got dict"),
    ("no heads", lambda d: d.pop("heads"), r"required key 'heads' is missing"),
    ("empty heads", lambda d: d.update(heads=[]), r"'heads' is empty"),
    ("node not object", lambda d: d["nodes"].__setitem__(2, 7), r"node #2 must be an object"),
    ("no op", lambda d: d["nodes"][3].pop("op"), r"node #3: required key 'op' is missing"),
    ("no name", lambda d: d["nodes"][3].pop("name"), r"node #3: required key 'name'"),
    ("no inputs", lambda d: d["nodes"][3].pop("inputs"),
     r"node #3 'seed_mlp_dense0_fwd': required key 'inputs' is missing"),
    ("op not str", lambda d: d["nodes"][3].update(op=5), r"node #3: 'op' must be a str"),
    ("attr not str", lambda d: d["nodes"][3]["attrs"].update(num_hidden=256),
     r"node #3 'seed_mlp_dense0_fwd': attribute 'num_hidden' must be a string; got int"),
    ("attrs not object", lambda d: d["nodes"][3].update(attrs=[]),
     r"node #3 'seed_mlp_dense0_fwd': 'attrs' must be an object"),
    ("bad attr value", lambda d: d["nodes"][3]["attrs"].update(num_hidden="many"),
     r"node #3.*seed_mlp_dense0_fwd.*num_hidden"),
    ("unknown attr", lambda d: d["nodes"][3]["attrs"].update(colour="red"),
     r"node #3.*seed_mlp_dense0_fwd.*unknown attribute 'colour'"),
    ("entry strings", lambda d: d["nodes"][3]["inputs"].__setitem__(0, ["0", 0, 0]),
     r"node #3 'seed_mlp_dense0_fwd' input #0: expected \[node, output, version\]"),
    ("entry float", lambda d: d["nodes"][3]["inputs"].__setitem__(0, [0.0, 0, 0]),
     r"input #0: expected \[node, output, version\] integers"),
    ("entry bool", lambda d: d["nodes"][3]["inputs"].__setitem__(0, [True, 0, 0]),
     r"input #0: expected"),
    ("entry length", lambda d: d["nodes"][3]["inputs"].__setitem__(0, [0]), r"input #0"),
    ("dangling", lambda d: d["nodes"][3]["inputs"].__setitem__(1, [99, 0, 0]),
     r"node #3 'seed_mlp_dense0_fwd' input #1 refers to node #99: past the end"),
    ("negative", lambda d: d["nodes"][3]["inputs"].__setitem__(1, [-1, 0, 0]),
     r"input #1 refers to node #-1: a negative index"),
    ("cycle", lambda d: d["nodes"][3]["inputs"].__setitem__(0, [4, 0, 0]),
     r"node #3 'seed_mlp_dense0_fwd' input #0 refers to node #4: not defined yet \(a cycle"),
    ("self loop", lambda d: d["nodes"][3]["inputs"].__setitem__(0, [3, 0, 0]),
     r"input #0 refers to node #3: not defined yet"),
    ("bad output index", lambda d: d["nodes"][4]["inputs"].__setitem__(0, [3, 1, 0]),
     r"node #4 'seed_mlp_dense0_relu_fwd' input #0 reads output 1 of node #3 "
     r"node 'seed_mlp_dense0_fwd' \(FullyConnected\), which has 1 outputs"),
    ("huge index", lambda d: d["nodes"][3]["inputs"].__setitem__(0, [10**30, 0, 0]),
     r"refers to node #1000000000000000000000000000000: past the end"),
    ("negative version", lambda d: d["nodes"][3]["inputs"].__setitem__(0, [0, 0, -1]),
     r"input #0: output index and version must not be negative"),
    ("arity", lambda d: d["nodes"][3]["inputs"].append([0, 0, 0]),
     r"node #3 'seed_mlp_dense0_fwd' \(FullyConnected\): has 4 inputs; expected 3"),
    ("variable inputs", lambda d: d["nodes"][1]["inputs"].append([0, 0, 0]),
     r"node #1 'seed_mlp_dense0_weight': a variable \(op 'null'\) must have no inputs"),
    ("head past end", lambda d: d.update(heads=[[12, 0, 0]]),
     r"head #0 refers to node #12: past the end \(the file has 12 nodes\)"),
    ("head output", lambda d: d.update(heads=[[11, 2, 0]]),
     r"head #0 reads output 2 of node #11"),
    ("graph attrs", lambda d: d.update(attrs=[]), r"'attrs' must be an object"),
    ("graph attr pair", lambda d: d["attrs"].update(x=5), r"graph attribute 'x' must be"),
    ("version type", lambda d: d["attrs"].update(mxnet_version=["str", "1.9.1"]),
     r"'mxnet_version' must be \[\"int\", N\]"),
    ("huge num_args", lambda d: d["nodes"][3]["attrs"].update(num_args="10000000000"),
     r"node #3 'seed_mlp_dense0_fwd' \(FullyConnected\): attribute 'num_args' is 10000000000"),
]


@pytest.mark.parametrize(("case", "change", "message"), BAD_DOCUMENTS,
                         ids=[case for case, _, _ in BAD_DOCUMENTS])
def test_bad_documents_raise_model_format_error(case: str, change: Any, message: str) -> None:
    document = change if not callable(change) else _mutated(change)
    if isinstance(document, dict):
        with pytest.raises(ModelFormatError, match=message):
            graph_from_json(copy.deepcopy(document))
    with pytest.raises(ModelFormatError, match=message):
        graph_from_json(json.dumps(document))


def test_unknown_operator_names_op_and_node() -> None:
    document = _mutated(lambda d: d["nodes"][4].update(op="NoSuchOp"))
    with pytest.raises(UnknownOperatorError,
                       match=r"node #4: node 'seed_mlp_dense0_relu_fwd': unknown operator "
                             r"'NoSuchOp'"):
        graph_from_json(document)


@pytest.mark.parametrize("text", ["", "{", "nodes", '{"nodes": [}', "\xff", "[" * 100_000])
def test_malformed_json(text: str) -> None:
    with pytest.raises(ModelFormatError, match="not valid JSON"):
        graph_from_json(text)


def test_invalid_utf8_bytes() -> None:
    with pytest.raises(ModelFormatError, match="not valid JSON"):
        graph_from_json(b'{"nodes": ["\xff"]}')


def test_max_nodes_guard() -> None:
    document = {"nodes": [{"op": "null", "name": "x", "inputs": []}] * 11, "heads": [[0, 0]]}
    assert len(graph_from_json(document, max_nodes=11).nodes) == 11
    with pytest.raises(ModelFormatError, match=r"11 nodes is more than the limit of 10"):
        graph_from_json(document, max_nodes=10)


def test_max_bytes_guard() -> None:
    text = (MODELS / "seed_mlp" / "seed_mlp-symbol.json").read_text()
    with pytest.raises(ModelFormatError, match=r"more than the limit of 100 \(max_bytes\)"):
        graph_from_json(text, max_bytes=100)


def test_source_of_wrong_type() -> None:
    with pytest.raises(ModelFormatError, match="expected text, bytes or a dict; got int"):
        graph_from_json(3)  # type: ignore[arg-type]
