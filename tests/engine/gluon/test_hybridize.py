"""Hybridize semantics: one trace, one compiled Model per block, invalidation, limits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine import nd, sym
from engine.gluon import Block, HybridBlock, nn
from engine.sym import NameManager, Symbol


class Recorder(HybridBlock):
    """Records the namespace and input type of every hybrid_forward call."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[tuple[str, str]] = []
        with self.name_scope():
            self.hidden = nn.Dense(10)
            self.output = nn.Dense(2)

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        self.calls.append((F.__name__, type(x).__name__))
        return self.output(F.relu(self.hidden(x)))


def _mlp() -> nn.HybridSequential:
    net = nn.HybridSequential()
    net.add(nn.Dense(256, activation="relu"), nn.Dense(128, activation="relu"), nn.Dense(2))
    net.initialize()
    return net


def test_result_unchanged_by_hybridize() -> None:
    net = _mlp()
    x = nd.random.normal(shape=(1, 512))
    before = net(x).asnumpy()
    net.hybridize()
    np.testing.assert_allclose(net(x).asnumpy(), before, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net(x).asnumpy(), before, rtol=1e-5, atol=1e-6)


def test_f_is_nd_then_traced_once_with_sym() -> None:
    net = Recorder()
    net.initialize()
    x = nd.random.normal(shape=(1, 4))
    net(x)
    net(x)
    assert net.calls == [("engine.nd", "NDArray")] * 2
    net.hybridize()
    net(x)
    net(x)
    net(x)
    assert net.calls[2:] == [("engine.sym", "Symbol")]


def test_print_inside_hybrid_forward_runs_on_first_hybridized_call_only(capsys: Any) -> None:
    class Printer(HybridBlock):
        def __init__(self) -> None:
            super().__init__()
            with self.name_scope():
                self.dense = nn.Dense(3)

        def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
            print("F:", F.__name__, "x:", x)
            return self.dense(x)

    net = Printer()
    net.initialize()
    x = nd.ones((2, 5))
    net(x)
    assert "engine.nd" in capsys.readouterr().out
    net.hybridize()
    net(x)
    out = capsys.readouterr().out
    assert "engine.sym" in out and "<Symbol data>" in out
    net(x)
    net(x)
    assert capsys.readouterr().out == ""


def test_new_input_shape_replans_without_retracing() -> None:
    net = Recorder()
    net.initialize()
    net.hybridize()
    small = nd.random.normal(shape=(1, 4))
    big = nd.random.normal(shape=(5, 4))
    first = net(small).asnumpy()
    batch = net(big).asnumpy()
    assert batch.shape == (5, 2)
    assert len(net.calls) == 1
    model = net._cached.model
    assert len(model._plans) == 2
    net.hybridize(False)
    np.testing.assert_allclose(net(small).asnumpy(), first, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net(big).asnumpy(), batch, rtol=1e-5, atol=1e-6)


class Reversed(HybridBlock):
    """Reads its second input first and ignores its third: the graph's inputs are ``data1``,
    ``data0``, while the block is called with ``data0``, ``data1``, ``data2``."""

    def hybrid_forward(self, F: Any, x: Any, y: Any, unused: Any) -> Any:  # noqa: N803
        return F.relu(y) * 2 - x


@pytest.mark.parametrize("optimize", [True, False])
def test_inputs_in_another_order_than_the_graphs_reach_the_checked_path(optimize: bool) -> None:
    net = Reversed()
    net.hybridize(optimize=optimize)
    x = nd.array([[1.0, -2.0, 3.0]])
    y = nd.array([[-1.0, 0.5, 2.0]])
    want = np.maximum(y.asnumpy(), 0) * 2 - x.asnumpy()
    for _ in range(3):
        np.testing.assert_allclose(net(x, y, x).asnumpy(), want, rtol=1e-6, atol=1e-6)
    model = net._cached.model
    assert model.input_names == ["data1", "data0"]
    if optimize:  # the first call checked the inputs, later ones took the fast path
        assert [entry.checked for _, entry in model._plans.items()] == [True]
    else:  # the reference interpreter: no plans to cache
        assert len(model._plans) == 0
    x64 = nd.array([[1.0, -2.0, 3.0]], dtype="float64")  # converted to the graph's float32
    np.testing.assert_allclose(net(x64, y, x).asnumpy(), want, rtol=1e-6, atol=1e-6)


def test_set_data_and_force_reinit_invalidate_the_compiled_model() -> None:
    net = _mlp()
    x = nd.random.normal(shape=(1, 512))
    net.hybridize()
    first = net(x).asnumpy()
    last = net[2]
    last.bias.set_data(nd.array([10.0, -10.0]))
    shifted = net(x).asnumpy()
    np.testing.assert_allclose(shifted - first, [[10.0, -10.0]], rtol=1e-4, atol=1e-4)
    net.initialize(force_reinit=True)
    again = net(x).asnumpy()
    assert not np.allclose(again, shifted)
    net.hybridize(False)
    np.testing.assert_allclose(net(x).asnumpy(), again, rtol=1e-5, atol=1e-6)


def test_hybridized_state_is_one_value() -> None:
    net = _mlp()
    net.hybridize()
    net(nd.ones((1, 512)))
    cached = net._cached
    assert cached is not None and cached.model is not None
    net.hybridize()
    assert net._cached is None


def test_symbol_in_symbol_out() -> None:
    net = _mlp()
    with NameManager():
        out = net(sym.var("data"))
    assert isinstance(out, Symbol)
    assert out.list_arguments()[0] == "data"
    assert out.name == net[2].prefix + "fwd"
    assert "FullyConnected" in out.tojson()


def test_hybridize_on_plain_block_hybridizes_children() -> None:
    class Outer(Block):
        def __init__(self) -> None:
            super().__init__()
            with self.name_scope():
                self.inner = Recorder()

        def forward(self, x: Any) -> Any:
            return self.inner(x) * 2

    net = Outer()
    net.initialize()
    x = nd.ones((1, 4))
    expected = net(x).asnumpy()
    net.hybridize()
    np.testing.assert_allclose(net(x).asnumpy(), expected, rtol=1e-5, atol=1e-6)
    net(x)
    assert [namespace for namespace, _ in net.inner.calls] == ["engine.nd", "engine.sym"]


def test_export_needs_a_traced_graph(tmp_path: Any) -> None:
    net = _mlp()
    with pytest.raises(Exception, match="hybridize\\(\\) and run a forward pass"):
        net.export(str(tmp_path / "none"))


def test_uninitialized_parameters_say_how_to_fix() -> None:
    net = nn.Dense(3)
    with pytest.raises(Exception, match="initialize"):
        net(nd.ones((1, 4)))
    net.hybridize()
    with pytest.raises(Exception, match="initialize"):
        net(nd.ones((1, 4)))


def test_deferred_shapes_learned_imperatively_and_hybridized() -> None:
    imperative = nn.Dense(7)
    imperative.initialize()
    assert imperative.weight.shape == (7, 0)
    imperative(nd.ones((2, 3, 4)))
    assert imperative.weight.shape == (7, 12)
    hybrid = nn.HybridSequential()
    hybrid.add(nn.Conv2D(4, 3), nn.BatchNorm(), nn.Dense(5))
    hybrid.initialize()
    hybrid.hybridize()
    assert hybrid(nd.ones((2, 3, 8, 8))).shape == (2, 5)
    assert hybrid[0].weight.shape == (4, 3, 3, 3)
    assert hybrid[1].gamma.shape == (4,)
    assert hybrid[2].weight.shape == (5, 4 * 6 * 6)
