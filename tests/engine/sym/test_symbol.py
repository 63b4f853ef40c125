"""Symbol: variables, naming, list_* on a small MLP, internals, groups, attributes, printing."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from engine import sym
from engine.graph.ir import verify
from engine.sym import NameManager, Prefix


def _mlp() -> sym.Symbol:
    data = sym.var("data")
    fc1 = sym.FullyConnected(data, num_hidden=16, name="fc1")
    act = sym.Activation(fc1, act_type="relu", name="relu1")
    bn = sym.BatchNorm(act, name="bn1")
    return sym.FullyConnected(bn, num_hidden=2, name="fc2")


def test_mlp_lists() -> None:
    net = _mlp()
    assert net.list_arguments() == ["data", "fc1_weight", "fc1_bias", "bn1_gamma", "bn1_beta",
                                    "fc2_weight", "fc2_bias"]
    assert net.list_auxiliary_states() == ["bn1_moving_mean", "bn1_moving_var"]
    assert net.list_inputs() == ["data", "fc1_weight", "fc1_bias", "bn1_gamma", "bn1_beta",
                                 "bn1_moving_mean", "bn1_moving_var", "fc2_weight", "fc2_bias"]
    assert net.list_outputs() == ["fc2_output"]
    assert net.name == "fc2"
    internals = net.get_internals()
    assert "relu1_output" in internals.list_outputs()
    assert internals["fc1_output"].name == "fc1"
    children = net.get_children()
    assert children is not None and children.list_outputs() == ["bn1_output", "fc2_weight",
                                                               "fc2_bias"]
    assert sym.var("x").get_children() is None


def test_auto_names_like_mxnet() -> None:
    with NameManager():
        data = sym.var("data")
        first = sym.FullyConnected(data, num_hidden=3)
        second = sym.FullyConnected(first, num_hidden=3)
        assert (first.name, second.name) == ("fullyconnected0", "fullyconnected1")
        assert second.list_arguments()[-2:] == ["fullyconnected1_weight", "fullyconnected1_bias"]
        assert sym.relu(data).name == "relu0"
        assert sym.npx.relu(data).name == "relu1"
        assert (data + data).name == "_plus0"
        assert (data + 1).name == "_plusscalar0"
        assert (2 - data).name == "_rminusscalar0"
        assert (data == 1).name == "_equal_scalar0"
        assert sym.split(data, num_outputs=2).name == "split0"
    with Prefix("dense0_"):
        assert sym.FullyConnected(sym.var("x"), num_hidden=1, name="fwd").name == "dense0_fwd"
        assert sym.relu(sym.var("x")).name == "dense0_relu0"


def test_operators_build_mxnet_ops() -> None:
    a, b = sym.var("a"), sym.var("b")
    cases = {
        "elemwise_add": a + b, "elemwise_sub": a - b, "elemwise_mul": a * b,
        "elemwise_div": a / b, "_mod": a % b, "_power": a ** b,
        "_plus_scalar": 1 + a, "_minus_scalar": a - 1, "_rminus_scalar": 1 - a,
        "_mul_scalar": -a, "_div_scalar": a / 2, "_rdiv_scalar": 2 / a,
        "_rpower_scalar": 2 ** a, "_power_scalar": a ** 2, "_rmod_scalar": 3 % a,
        "_greater": a > b, "_lesser_equal": a <= b, "_not_equal_scalar": a != 0, "abs": abs(a),
    }
    for op, symbol in cases.items():
        graph = symbol.to_graph()
        assert graph.nodes[graph.heads[0].node].op == op
    assert (a - 2.5).list_attr() == {"scalar": "2.5"}


def test_variable_annotations() -> None:
    v = sym.var("w", shape=(3, 4), dtype="float16", init="zeros", lr_mult=2.0, wd_mult=0.0,
                __layout__="NC")
    assert v.list_attr() == {"__shape__": "(3, 4)", "__dtype__": "2", "__init__": "zeros",
                             "__lr_mult__": "2.0", "__wd_mult__": "0.0", "__layout__": "NC"}
    assert v.attr("__shape__") == "(3, 4)" and v.attr("missing") is None
    assert sym.Variable("x", stype="csr").attr("__storage_type__") == "2"
    with pytest.raises(ValueError, match="double underscores"):
        sym.var("x", colour="red")
    with pytest.raises(TypeError, match="non-empty string"):
        sym.var("")


def test_group_indexing_and_printing() -> None:
    a, b = sym.var("a"), sym.var("b")
    group = sym.Group([sym.relu(a, name="r"), b])
    assert len(group) == 2 and group.name is None
    assert repr(group) == "<Symbol group [r, b]>"
    assert repr(group[0]) == "<Symbol r>" and str(a) == "<Symbol a>"
    assert group.list_outputs() == ["r_output", "b"]
    assert group[-1].name == "b"
    assert [part.name for part in group] == ["r", "b"]
    parts = sym.SliceChannel(a, num_outputs=3, name="s")
    assert len(parts) == 3 and parts.list_outputs() == ["s_output0", "s_output1", "s_output2"]
    assert sym.Concat(*parts, dim=1, name="c").list_attr() == {"dim": "1", "num_args": "3"}
    with pytest.raises(IndexError, match="out of range"):
        group[2]
    with pytest.raises(TypeError, match="exactly one output"):
        sym.relu(parts)


def test_shared_subexpressions_appear_once() -> None:
    x = sym.var("x")
    shared = sym.relu(x, name="shared")
    graph = sym.Group([shared + 1, shared * 2, shared]).to_graph()
    verify(graph)
    assert [node.name for node in graph.nodes].count("shared") == 1
    assert [node.name for node in graph.nodes].count("x") == 1
    back = sym.Symbol.from_graph(graph)
    assert back.list_outputs() == ["_plusscalar0_output", "_mulscalar0_output",
                                   "shared_output"] or len(back) == 3
    assert back.to_graph() == graph


def test_aux_inputs_carry_version_one() -> None:
    graph = sym.BatchNorm(sym.var("d"), name="bn").to_graph()
    versions = [entry.version for entry in graph.nodes[-1].inputs]
    assert versions == [0, 0, 0, 1, 1]


def test_sym_functions_have_signatures() -> None:
    parameters = inspect.signature(sym.Convolution).parameters
    assert list(parameters)[:3] == ["data", "weight", "bias"]
    assert "attr" in parameters and "out" not in parameters
    assert sym.__name__ == "engine.sym"
    with pytest.raises(TypeError, match="must be a Symbol"):
        sym.relu(np.ones(3))


def test_constants() -> None:
    zeros = sym.zeros((2, 3))
    assert zeros.to_graph().nodes[-1].op == "_zeros"
    assert zeros.infer_shape()[1] == [(2, 3)]
    assert sym.ones((1,), dtype="int32").infer_type()[1] == [np.int32]
