"""Layers: imperative, hybridized and exported-then-loaded runs agree; numerics spot-checked."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import engine
from engine import nd, sym
from engine.gluon import nn, rnn
from engine.gluon.model_zoo import vision
from engine.sym import NameManager

CASES = [
    (lambda: nn.Conv1D(4, 3, padding=1), (2, 3, 9)),
    (lambda: nn.Conv2D(4, 3, strides=2, groups=1, activation="relu"), (2, 3, 9, 9)),
    (lambda: nn.Conv2D(6, 3, groups=3, padding=1, in_channels=3), (1, 3, 5, 5)),
    (lambda: nn.Conv3D(2, 2), (1, 2, 4, 4, 4)),
    (lambda: nn.Conv2DTranspose(3, 3, strides=2, output_padding=1), (1, 2, 4, 4)),
    (lambda: nn.MaxPool1D(2), (1, 2, 8)),
    (lambda: nn.MaxPool2D(3, 2, 1, ceil_mode=True), (1, 2, 7, 7)),
    (lambda: nn.MaxPool3D(2), (1, 1, 4, 4, 4)),
    (lambda: nn.AvgPool1D(3, 1, 1), (1, 2, 6)),
    (lambda: nn.AvgPool2D(3, 1, 1, count_include_pad=False), (1, 2, 5, 5)),
    (lambda: nn.AvgPool3D(2), (1, 1, 4, 4, 4)),
    (lambda: nn.GlobalAvgPool1D(), (2, 3, 5)),
    (lambda: nn.GlobalMaxPool2D(), (2, 3, 5, 5)),
    (lambda: nn.GlobalAvgPool3D(), (1, 2, 3, 3, 3)),
    (lambda: nn.BatchNorm(), (2, 3, 4, 4)),
    (lambda: nn.LayerNorm(), (2, 5)),
    (lambda: nn.InstanceNorm(), (2, 3, 6)),
    (lambda: nn.Dropout(0.5), (2, 5)),
    (lambda: nn.Flatten(), (2, 3, 4)),
    (lambda: nn.Activation("tanh"), (2, 5)),
    (lambda: nn.LeakyReLU(0.1), (2, 5)),
    (lambda: nn.PReLU(), (2, 5)),
    (lambda: nn.ELU(), (2, 5)),
    (lambda: nn.SELU(), (2, 5)),
    (lambda: nn.GELU(), (2, 5)),
    (lambda: nn.Swish(), (2, 5)),
    (lambda: nn.Dense(3, flatten=False, use_bias=False), (2, 4, 5)),
    (lambda: rnn.GRU(6, num_layers=2), (5, 2, 3)),
    (lambda: rnn.LSTM(4, bidirectional=True, layout="NTC"), (2, 5, 3)),
]


@pytest.mark.parametrize(("make", "shape"), CASES, ids=lambda case: getattr(case, "__name__",
                                                                              str(case)))
def test_layer_imperative_hybridized_and_exported_agree(make: Any, shape: tuple,
                                                        tmp_path: Any) -> None:
    layer = make()
    layer.initialize()
    x = nd.random.normal(shape=shape)
    layer(x)
    for param in layer.collect_params().values():  # non-trivial statistics and biases
        param.set_data(param.data() + nd.random.uniform(0.1, 0.5, shape=param.shape))
    expected = layer(x).asnumpy()
    layer.hybridize()
    np.testing.assert_allclose(layer(x).asnumpy(), expected, rtol=1e-4, atol=1e-5)
    symbol_file, params_file = layer.export(str(tmp_path / "layer"))
    model = engine.load_model(symbol_file, params_file)
    (output,) = model.infer({"data": x.asnumpy()}).values()
    np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-5)


def test_dense_and_conv_numerics() -> None:
    dense = nn.Dense(3, activation="relu", in_units=4)
    dense.initialize()
    x = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
    weight, bias = dense.weight.data().asnumpy(), dense.bias.data().asnumpy()
    np.testing.assert_allclose(dense(nd.array(x)).asnumpy(),
                               np.maximum(x @ weight.T + bias, 0), rtol=1e-5, atol=1e-6)
    pool = nn.GlobalAvgPool2D()
    image = np.random.default_rng(1).normal(size=(2, 3, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(pool(nd.array(image)).asnumpy()[:, :, 0, 0],
                               image.mean(axis=(2, 3)), rtol=1e-5, atol=1e-6)


def test_embedding_lstm_learns_its_input_width_when_hybridized_first() -> None:
    net = nn.HybridSequential()
    with net.name_scope():
        net.add(nn.Embedding(20, 8), rnn.LSTM(5, layout="NTC"))
    net.initialize()
    net.hybridize()
    tokens = nd.array(np.arange(12).reshape(2, 6) % 20)
    out = net(tokens)
    assert out.shape == (2, 6, 5)
    assert net[1].l0_i2h_weight.shape == (20, 8)
    net.hybridize(False)
    np.testing.assert_allclose(net(tokens).asnumpy(), out.asnumpy(), rtol=1e-4, atol=1e-5)


def test_lstm_with_explicit_states_returns_states() -> None:
    layer = rnn.LSTM(4, input_size=3)
    layer.initialize()
    states = layer.begin_state(2)
    out, new_states = layer(nd.ones((5, 2, 3)), states)
    assert out.shape == (5, 2, 4)
    assert [state.shape for state in new_states] == [(1, 2, 4), (1, 2, 4)]


def test_rnn_export_layout_matches_mxnet() -> None:
    with NameManager():
        layer = rnn.LSTM(8, layout="NTC")
        graph = layer(sym.var("data")).to_graph()
    ops = [node.op for node in graph.nodes if not node.is_variable]
    assert ops == ["SwapAxis", "Reshape", "Reshape", "Reshape", "Reshape",
                   "_rnn_param_concat", "_zeros", "_zeros", "RNN", "SwapAxis"]
    zeros = [node for node in graph.nodes if node.op == "_zeros"]
    assert zeros[0].name == "lstm0_h0_0"
    assert zeros[0].attrs["shape"] == "(1, 0, 8)" and zeros[0].attrs["__layout__"] == "LNC"


@pytest.mark.parametrize("name", ["resnet18_v1", "resnet34_v1", "resnet50_v1", "resnet18_v2",
                                  "resnet50_v2", "mobilenetv2_1.0"])
def test_model_zoo_names_and_hybridize(name: str) -> None:
    with NameManager():
        net = vision.get_model(name, classes=7)
    params = list(net.collect_params())
    prefix = net.prefix
    assert prefix in ("resnetv10_", "resnetv20_", "mobilenetv20_")
    if name == "resnet18_v1":
        assert len(params) == 102
        assert "resnetv10_stage1_conv0_weight" in params
        assert "resnetv10_stage2_conv2_weight" in params  # the projection shortcut
    if name.startswith("mobilenet"):
        assert "mobilenetv20_features_linearbottleneck0_conv0_weight" in params
        assert params[-1] == "mobilenetv20_output_pred_weight"
    net.initialize()
    x = nd.random.normal(shape=(1, 3, 32, 32))
    expected = net(x).asnumpy()
    assert expected.shape == (1, 7)
    net.hybridize()
    np.testing.assert_allclose(net(x).asnumpy(), expected, rtol=1e-3, atol=1e-5)


def test_get_model_errors() -> None:
    with pytest.raises(ValueError, match="available"):
        vision.get_model("vgg11")
    with pytest.raises(ValueError, match="load_parameters"):
        vision.get_model("resnet18_v1", pretrained=True)
