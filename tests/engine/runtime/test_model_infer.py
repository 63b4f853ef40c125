"""`Model.infer` on repeated calls: the checked-signature fast path and its limits."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import sym
from engine.compiler.layout_weights import layout_weights
from engine.errors import InputError
from engine.gluon.model_zoo import vision
from engine.runtime import Model
from tests.engine.compiler.graphs import mlp

RNG = np.random.default_rng(11)


def mlp_model(**options) -> Model:
    return mlp_models(options)[0]


def checked_signatures(model: Model) -> int:
    """How many cached signatures calls may take without checks (the fast path)."""
    return sum(entry.checked for _, entry in model._plans.items())


def mlp_models(*options: dict) -> list[Model]:
    """Models of one MLP (the same weights), one per dict of options."""
    graph, constants = mlp()
    return [Model(graph.replace(constants={}), constants, **each) for each in options]


def test_repeated_calls_follow_new_input_values() -> None:
    model, reference = mlp_models({}, {"optimize": False})
    for _ in range(3):  # the first call checks and compiles; later ones take the fast path
        x = RNG.normal(size=(4, 512)).astype(np.float32)
        np.testing.assert_allclose(model.infer({"data": x})["fc2_output"],
                                   reference.infer({"data": x})["fc2_output"],
                                   rtol=1e-5, atol=1e-5)
    assert checked_signatures(model) == 1


def test_outputs_of_earlier_calls_are_not_overwritten() -> None:
    model = mlp_model()
    first = model.infer({"data": np.ones((1, 512), np.float32)})["fc2_output"]
    kept = first.copy()
    model.infer({"data": np.zeros((1, 512), np.float32)})
    np.testing.assert_array_equal(first, kept)


def test_converted_inputs_are_not_taken_as_checked() -> None:
    model = mlp_model()
    x64 = RNG.normal(size=(2, 512))  # float64: converted to the model's float32 on each call
    for _ in range(2):
        out = model.infer({"data": x64})["fc2_output"]
        assert out.dtype == np.float32
    assert checked_signatures(model) == 0
    listed = model.infer({"data": x64.astype(np.float32).tolist()})["fc2_output"]
    np.testing.assert_allclose(listed, out, rtol=1e-5, atol=1e-5)


def test_bad_inputs_are_refused_after_the_fast_path_is_warm() -> None:
    model = mlp_model()
    x = np.zeros((1, 512), np.float32)
    model.infer({"data": x})
    model.infer({"data": x})
    with pytest.raises(InputError, match="unknown input 'extra'"):
        model.infer({"data": x, "extra": x})
    with pytest.raises(InputError, match=r"input .data. shape \[1, 7\] does not fit"):
        model.infer({"data": np.zeros((1, 7), np.float32)})


def test_infinities_are_results_not_warnings() -> None:
    # pytest turns warnings into errors here (filterwarnings = error): log(0) must stay quiet
    # on both the first, checked call and the fast path after it.
    model = engine.load_model(sym.log(sym.var("data")), {})
    for _ in range(2):
        out = model.infer({"data": np.zeros((2, 3), np.float32)})
        assert np.isneginf(next(iter(out.values()))).all()
    with pytest.warns(RuntimeWarning):  # and numpy's own state is back as it was
        np.log(np.zeros(1, np.float32))


def test_fully_connected_weights_are_stored_column_major() -> None:
    graph, constants = mlp()
    relaid = layout_weights(graph)
    for name in ("fc0_weight", "fc1_weight", "fc2_weight"):
        assert relaid.constants[name].flags.f_contiguous
        np.testing.assert_array_equal(relaid.constants[name], constants[name])
    assert layout_weights(relaid) is relaid  # nothing left to do


def test_weights_read_by_other_ops_keep_their_layout() -> None:
    weight = sym.var("w")
    net = sym.FullyConnected(sym.var("data"), weight=weight, num_hidden=3, no_bias=True)
    both = sym.Group([net, sym.elemwise_add(sym.var("other"), weight)])  # not a constant
    params = {"w": RNG.normal(size=(3, 4)).astype(np.float32)}
    model = engine.load_model(both, params)
    assert model.optimized_graph.constants["w"].flags.c_contiguous


def test_resnet18_plan_needs_at_most_half_the_naive_activation_memory(tmp_path) -> None:
    net = vision.get_model("resnet18_v1")
    net.initialize()
    net.hybridize()
    net(engine.nd.zeros((1, 3, 64, 64)))
    net.export(str(tmp_path / "resnet18"))
    model = engine.load_model(str(tmp_path / "resnet18-symbol.json"),
                              str(tmp_path / "resnet18-0000.params"))
    model.activation_bytes({"data": (1, 3, 224, 224)})
    plan = model.stats()["plans"][0]
    assert plan["naive_activation_bytes"] > 30 << 20  # a 224x224 ResNet-18: ~40 MB unplanned
    assert plan["planned_activation_bytes"] <= 0.5 * plan["naive_activation_bytes"]
