"""Gluon on ``engine.gpu(0)``: parameters placed by ``initialize(ctx=...)``, imperative and
hybridized calls on GPU arrays, and the compiled Model running on that GPU.

Each GPU test runs on the numpy stand-in for CuPy and, marked ``gpu``, on a real GPU
(the ``gpu_backend`` fixture in tests/conftest.py); results must equal the CPU's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine import nd
from engine.context import cpu, gpu
from engine.cuda.array_module import capturable
from engine.errors import EngineError
from engine.gluon import nn, rnn
from tests.engine.gluon.nets import hybridnet, lenet, seed_mlp

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def twins(make: Any, ctx: Any = None) -> tuple[Any, Any]:
    """The same architecture twice with equal parameters: one on ``ctx``, one on the CPU."""
    net, reference = make(), make()
    reference.initialize()
    data = np.random.default_rng(1)
    sample = nd.array(data.normal(size=(2, 1, 28, 28)).astype(np.float32))
    reference(sample if make is lenet else nd.ones((2, 512)))
    net.initialize(ctx=gpu(0) if ctx is None else ctx)
    copy_values(net, reference)
    return net, reference


def copy_values(net: Any, reference: Any) -> None:
    """Give ``net`` the parameter values of ``reference`` (completing deferred shapes)."""
    for param, source in zip(net.collect_params().values(),
                             reference.collect_params().values(), strict=True):
        param.set_data(source.data())


def test_initialize_places_parameters_on_the_gpu(gpu_backend: Any) -> None:
    net = nn.Dense(3, in_units=4)
    net.initialize(ctx=gpu(0))
    weight = net.weight.data()
    assert weight.context == gpu(0) and type(weight._data) is gpu_backend.array_type
    assert net.weight.data(gpu(0)) is weight  # one upload per value
    assert net.weight.list_ctx() == [gpu(0)]
    np.testing.assert_array_equal(weight.asnumpy(), net.weight.array())
    with pytest.raises(EngineError, match=r"'dense\d+_weight' was not initialized on context "
                                          r"cpu\(0\); it lives on \[gpu\(0\)\]"):
        net.weight.data(cpu())
    net.weight.set_data(np.ones((3, 4), np.float32))
    assert net.weight.data().asnumpy().sum() == 12.0  # a new value is uploaded again
    both = nn.Dense(2, in_units=2)
    both.initialize(ctx=[cpu(), gpu(0)])
    assert [array.context for array in both.weight.list_data()] == [cpu(0), gpu(0)]
    np.testing.assert_array_equal(*(array.asnumpy() for array in both.weight.list_data()))


@pytest.mark.parametrize("make", [seed_mlp, hybridnet, lenet])
def test_imperative_calls_on_gpu_match_the_cpu(gpu_backend: Any, make: Any) -> None:
    net, reference = twins(make)
    shape = (2, 1, 28, 28) if make is lenet else (2, 512)
    host = np.random.default_rng(2).normal(size=shape).astype(np.float32)
    if make is hybridnet:  # deferred shapes: learned from the first GPU input
        net, reference = make(), make()
        reference.initialize()
        reference(nd.array(host))
        net.initialize(ctx=gpu(0))
        net(nd.array(host, ctx=gpu(0)))
        copy_values(net, reference)
    output = net(nd.array(host, ctx=gpu(0)))
    assert output.context == gpu(0) and type(output._data) is gpu_backend.array_type
    np.testing.assert_allclose(output.asnumpy(), reference(nd.array(host)).asnumpy(),
                               **TOLERANCE)


@pytest.mark.parametrize("make", [seed_mlp, lenet])
def test_hybridized_gpu_net_compiles_a_gpu_model(gpu_backend: Any, make: Any) -> None:
    net, reference = twins(make)
    net.hybridize()
    reference.hybridize()
    shape = (3, 1, 28, 28) if make is lenet else (3, 512)
    rng = np.random.default_rng(3)
    for _ in range(3):
        host = rng.normal(size=shape).astype(np.float32)
        output = net(nd.array(host, ctx=gpu(0)))
        assert output.context == gpu(0) and type(output._data) is gpu_backend.array_type
        np.testing.assert_allclose(output.asnumpy(), reference(nd.array(host)).asnumpy(),
                                   **TOLERANCE)
    model = net._cached.model
    assert model.device == "gpu" and model.backend.name == "gpu(0)"
    assert model.backend.xp is capturable(gpu_backend.xp)
    assert reference._cached.model.device == "cpu"


def test_hybridized_gpu_net_rebuilds_on_new_values_and_contexts(gpu_backend: Any) -> None:
    net = nn.Dense(2, in_units=3)
    net.initialize(ctx=gpu(0))
    net.hybridize()
    x = nd.ones((1, 3), ctx=gpu(0))
    net(x)
    net.weight.set_data(np.full((2, 3), 2.0, np.float32))
    net.bias.set_data(np.zeros(2, np.float32))
    assert net(x).asnumpy().tolist() == [[6.0, 6.0]]
    with pytest.raises(EngineError, match=r"not initialized on context cpu\(0\)"):
        net(nd.ones((1, 3)))
    net.reset_ctx(cpu())
    on_cpu = net(nd.ones((1, 3)))
    assert on_cpu.context == cpu(0) and on_cpu.asnumpy().tolist() == [[6.0, 6.0]]
    assert net._cached.model.device == "cpu"


def test_inputs_on_two_contexts_fail_clearly(gpu_backend: Any) -> None:
    class Add(nn.HybridBlock):
        def hybrid_forward(self, F: Any, a: Any, b: Any) -> Any:  # noqa: N803
            return a + b

    block = Add()
    for hybridized in (False, True):
        block.hybridize(hybridized)
        with pytest.raises(EngineError, match=r"Add: input 1 is on cpu\(0\) but input 0 is on "
                                              r"gpu\(0\).*same context"):
            block(nd.ones((1,), ctx=gpu(0)), nd.ones((1,)))


def test_load_parameters_and_export_on_the_gpu(gpu_backend: Any, tmp_path: Any) -> None:
    net, reference = twins(seed_mlp)
    path = tmp_path / "mlp.params"
    reference.save_parameters(path)
    loaded = seed_mlp()
    loaded.load_parameters(path, ctx=gpu(0))
    loaded.hybridize()
    x = np.ones((1, 512), np.float32)
    output = loaded(nd.array(x, ctx=gpu(0)))
    assert output.context == gpu(0)
    np.testing.assert_allclose(output.asnumpy(), reference(nd.array(x)).asnumpy(), **TOLERANCE)
    symbol_file, params_file = loaded.export(str(tmp_path / "mlp"))
    exported = nn.SymbolBlock.imports(symbol_file, ["data"], params_file, ctx=gpu(0))
    np.testing.assert_allclose(exported(nd.array(x, ctx=gpu(0))).asnumpy(), output.asnumpy(),
                               **TOLERANCE)


def test_rnn_begin_states_follow_the_input_context(gpu_backend: Any) -> None:
    layer, reference = rnn.LSTM(4, input_size=3), rnn.LSTM(4, input_size=3)
    reference.initialize()
    layer.initialize(ctx=gpu(0))
    copy_values(layer, reference)
    host = np.random.default_rng(5).normal(size=(5, 2, 3)).astype(np.float32)
    output = layer(nd.array(host, ctx=gpu(0)))
    assert output.context == gpu(0)
    np.testing.assert_allclose(output.asnumpy(), reference(nd.array(host)).asnumpy(), **TOLERANCE)


def test_without_cupy_gpu_initialization_fails_and_the_cpu_works(no_cupy: str) -> None:
    net = seed_mlp()
    with pytest.raises(EngineError, match=r"cannot place an array on gpu\(0\): GPU arrays need "
                                          r"CuPy and a GPU, but CuPy is not installed"):
        net.initialize(ctx=gpu(0))
    net.initialize(ctx=cpu())
    net.hybridize()
    assert net(nd.ones((1, 512))).shape == (1, 2)
    with pytest.raises(EngineError, match="CuPy is not installed"):
        net.reset_ctx(gpu(0))
