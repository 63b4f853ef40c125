"""Blocks: MXNet's naming scheme, parameter collection, saving and loading, containers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine import nd, sym
from engine.errors import EngineError, ShapeError
from engine.gluon import Block, HybridBlock, Parameter, init, nn
from engine.sym import NameManager


def _mlp() -> nn.HybridSequential:
    net = nn.HybridSequential()
    net.add(nn.Dense(256, activation="relu"), nn.Dense(128, activation="relu"), nn.Dense(2))
    return net


def _scoped_mlp() -> nn.HybridSequential:
    net = nn.HybridSequential()
    with net.name_scope():
        net.add(nn.Dense(256, activation="relu"), nn.Dense(128, activation="relu"),
                nn.Dense(2))
    return net


def test_names_follow_mxnet() -> None:
    with NameManager():
        net = _mlp()
        assert net.prefix == "hybridsequential0_"
        names = list(net.collect_params())
        assert names[:2] == ["dense0_weight", "dense0_bias"]
        other = nn.HybridSequential()
        with other.name_scope():
            other.add(nn.Dense(3), nn.BatchNorm(), nn.Activation("relu"))
    assert other.prefix == "hybridsequential1_"
    assert list(other.collect_params()) == [
        "hybridsequential1_dense0_weight", "hybridsequential1_dense0_bias",
        "hybridsequential1_batchnorm0_gamma", "hybridsequential1_batchnorm0_beta",
        "hybridsequential1_batchnorm0_running_mean", "hybridsequential1_batchnorm0_running_var"]
    other.initialize()
    graph = other(sym.var("data"))
    nodes = [node.name for node in graph.to_graph().nodes if not node.is_variable]
    assert nodes == ["hybridsequential1_dense0_fwd", "hybridsequential1_batchnorm0_fwd",
                     "hybridsequential1_relu0_fwd"]
    assert graph.list_auxiliary_states() == ["hybridsequential1_batchnorm0_running_mean",
                                             "hybridsequential1_batchnorm0_running_var"]


def test_collect_params_select_by_regex() -> None:
    net = nn.HybridSequential(prefix="net_")
    with net.name_scope():
        net.add(nn.Dense(3), nn.BatchNorm())
    assert list(net.collect_params(".*weight|.*bias")) == ["net_dense0_weight", "net_dense0_bias"]
    assert list(net.collect_params("net_batchnorm0_running_.*")) == [
        "net_batchnorm0_running_mean", "net_batchnorm0_running_var"]


def test_initializers_and_parameter_api() -> None:
    param = Parameter("w_weight", shape=(20, 30))
    param.initialize(init=init.Xavier())
    bound = np.sqrt(3.0 / 25)
    assert np.abs(param.data().asnumpy()).max() <= bound
    param.initialize(init=init.One(), force_reinit=True)
    assert (param.data().asnumpy() == 1).all()
    with pytest.warns(UserWarning, match="force_reinit=True"):
        param.initialize(init=init.Zero())
    for initializer, check in [(init.Zero(), lambda a: (a == 0).all()),
                               (init.Constant(2.5), lambda a: (a == 2.5).all()),
                               (init.Normal(0.5), lambda a: 0.3 < a.std() < 0.7),
                               (init.Uniform(0.1), lambda a: np.abs(a).max() <= 0.1),
                               (init.MSRAPrelu(), lambda a: 0.0 < a.std() < 1.0)]:
        param.initialize(init=initializer, force_reinit=True)
        assert check(param.data().asnumpy()), initializer
    bias = Parameter("b_bias", shape=(4,))
    bias.initialize(init=init.Xavier())
    assert (bias.data().asnumpy() == 0).all()
    param.set_data(nd.ones((20, 30)) * 3)
    assert param.data().asnumpy()[0, 0] == 3
    with pytest.raises(ShapeError, match="does not fit"):
        param.set_data(nd.ones((2, 2)))
    assert init.Xavier().dumps() == \
        '["xavier", {"rnd_type": "uniform", "factor_type": "avg", "magnitude": 3}]'


def test_deferred_parameter_errors() -> None:
    dense = nn.Dense(4)
    dense.initialize()
    with pytest.raises(EngineError, match="first forward pass"):
        dense.weight.data()
    with pytest.raises(ShapeError, match="incomplete"):
        Parameter("x", shape=(0, 3)).initialize()


def test_save_and_load_parameters_round_trip(tmp_path: Any) -> None:
    net = _mlp()
    net.initialize()
    x = nd.random.normal(shape=(2, 512))
    expected = net(x).asnumpy()
    net.save_parameters(str(tmp_path / "net.params"))
    loaded = nd.load(str(tmp_path / "net.params"))
    assert sorted(loaded) == ["0.bias", "0.weight", "1.bias", "1.weight", "2.bias", "2.weight"]
    other = _mlp()
    other.load_parameters(str(tmp_path / "net.params"))
    np.testing.assert_allclose(other(x).asnumpy(), expected, rtol=1e-6)
    with pytest.raises(ValueError, match="does not start with it"):
        net.save_params(str(tmp_path / "legacy.params"))  # children made outside name_scope
    scoped = _scoped_mlp()
    scoped.load_parameters(str(tmp_path / "net.params"))
    scoped.save_params(str(tmp_path / "legacy.params"))
    assert sorted(nd.load(str(tmp_path / "legacy.params")))[0] == "dense0_bias"
    legacy = _scoped_mlp()
    legacy.load_params(str(tmp_path / "legacy.params"))
    np.testing.assert_allclose(legacy(x).asnumpy(), expected, rtol=1e-6)
    partial = nn.HybridSequential()
    partial.add(nn.Dense(256, activation="relu"))
    with pytest.raises(EngineError, match="ignore_extra=True"):
        partial.load_parameters(str(tmp_path / "net.params"))
    partial.load_parameters(str(tmp_path / "net.params"), ignore_extra=True)
    bigger = _mlp()
    bigger.add(nn.Dense(1))
    with pytest.raises(EngineError, match="allow_missing=True"):
        bigger.load_parameters(str(tmp_path / "net.params"))


def test_sequential_lambda_and_concurrent() -> None:
    seq = nn.Sequential()
    seq.add(nn.Dense(4), nn.Lambda(lambda x: x * 2), nn.Lambda("relu"))
    seq.initialize()
    x = nd.random.normal(shape=(3, 5))
    out = seq(x).asnumpy()
    assert out.shape == (3, 4) and (out >= 0).all()
    assert len(seq) == 3 and isinstance(seq[0], nn.Dense)
    conc = nn.HybridConcurrent(axis=1)
    conc.add(nn.Dense(2), nn.HybridLambda(lambda F, v: F.relu(v)), nn.Identity())
    conc.initialize()
    imperative = conc(x).asnumpy()
    assert imperative.shape == (3, 12)
    conc.hybridize()
    np.testing.assert_allclose(conc(x).asnumpy(), imperative, rtol=1e-5, atol=1e-6)
    plain = nn.Concurrent(axis=1)
    plain.add(nn.Lambda("sigmoid"), nn.Lambda(lambda v: v))
    assert plain(x).shape == (3, 10)


def test_forward_hooks() -> None:
    seen: list[str] = []
    dense = nn.Dense(2, in_units=3)
    dense.initialize()
    dense.register_forward_pre_hook(lambda block, inputs: seen.append("pre"))
    dense.register_forward_hook(lambda block, inputs, out: seen.append("post"))
    dense(nd.ones((1, 3)))
    assert seen == ["pre", "post"]


def test_block_subclass_with_parameter_attribute() -> None:
    class Scale(HybridBlock):
        def __init__(self) -> None:
            super().__init__(prefix="scale_")
            with self.name_scope():
                self.factor = self.params.get("factor", shape=(1,), init=init.Constant(3.0))

        def hybrid_forward(self, F: Any, x: Any, factor: Any) -> Any:  # noqa: N803
            return F.broadcast_mul(x, factor)

    block = Scale()
    block.initialize()
    x = nd.ones((2, 2))
    assert (block(x).asnumpy() == 3).all()
    block.hybridize()
    assert (block(x).asnumpy() == 3).all()
    assert list(block.collect_params()) == ["scale_factor"]
    assert isinstance(block, Block)
