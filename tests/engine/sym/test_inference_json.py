"""infer_shape / infer_type (full and partial) and JSON/file round trips."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine import sym
from engine.errors import InputError
from tests.conformance.fixtures import model_files, model_names


def _mlp() -> sym.Symbol:
    data = sym.var("data")
    hidden = sym.relu(sym.FullyConnected(data, num_hidden=8, name="fc1"), name="act")
    return sym.FullyConnected(hidden, num_hidden=3, name="fc2")


def test_infer_shape_fills_weight_shapes() -> None:
    args, outs, aux = _mlp().infer_shape(data=(4, 5))
    assert args == [(4, 5), (8, 5), (8,), (3, 8), (3,)]
    assert outs == [(4, 3)] and aux == []
    assert _mlp().infer_shape((4, 5)) == (args, outs, aux)


def test_infer_shape_with_aux_states() -> None:
    net = sym.BatchNorm(sym.Convolution(sym.var("data"), kernel=(3, 3), num_filter=4,
                                        name="conv"), name="bn")
    args, outs, aux = net.infer_shape(data=(1, 2, 8, 8))
    assert args == [(1, 2, 8, 8), (4, 2, 3, 3), (4,), (4,), (4,)]
    assert outs == [(1, 4, 6, 6)] and aux == [(4,), (4,)]


def test_partial_shapes() -> None:
    net = _mlp()
    with pytest.warns(UserWarning, match="cannot decide"):
        assert net.infer_shape() == (None, None, None)
    args, outs, _ = net.infer_shape_partial()
    assert args == [(), (8, 0), (8,), (3, 0), (3,)] and outs == [()]
    args, outs, _ = net.infer_shape_partial(data=(0, 5))
    assert args[1] == (8, 5) and outs == [(0, 3)]
    declared = sym.FullyConnected(sym.var("data", shape=(2, 7)), num_hidden=1, name="fc")
    assert declared.infer_shape()[0][1] == (1, 7)


def test_infer_shape_rejects_unknown_names() -> None:
    with pytest.raises(InputError, match="unknown argument 'nope'.*data"):
        _mlp().infer_shape(nope=(1, 2))


def test_infer_type() -> None:
    args, outs, aux = _mlp().infer_type(data="float16")
    assert args == [np.float16] * 5 and outs == [np.float16] and aux == []
    with pytest.warns(UserWarning):
        assert _mlp().infer_type() == (None, None, None)
    typed = sym.relu(sym.var("x", dtype="float64"))
    assert typed.infer_type()[1] == [np.float64]


def test_json_round_trip(tmp_path: Path) -> None:
    net = sym.Group([_mlp(), sym.BatchNorm(sym.var("x", shape=(2, 3)), fix_gamma=False,
                                           name="bn")])
    text = net.tojson()
    again = sym.fromjson(text)
    assert again.tojson() == text
    assert again.list_arguments() == net.list_arguments()
    assert again.list_auxiliary_states() == ["bn_moving_mean", "bn_moving_var"]
    assert again[1].attr("fix_gamma") == "False"
    path = tmp_path / "net-symbol.json"
    net.save(path)
    assert path.read_text() == text
    assert sym.load(path).tojson() == text
    document = json.loads(text)
    assert len(document["heads"]) == 2
    assert document["nodes"][document["heads"][1][0]]["name"] == "bn"


@pytest.mark.parametrize("name", model_names())
def test_mxnet_exports_load_and_write_back_unchanged(name: str) -> None:
    symbol_file, _ = model_files(name)
    text = symbol_file.read_text()
    loaded = sym.load(symbol_file)
    assert loaded.list_outputs()
    if name != "legacy_json":  # legacy files are upgraded on load, so they change
        # node_row_ptr counts hidden outputs, which the op definitions own.
        written, original = json.loads(loaded.tojson()), json.loads(text)
        written.pop("node_row_ptr")
        original.pop("node_row_ptr")
        assert written == original


def test_numpy_mode_marks_the_json() -> None:
    from engine import npx

    net = sym.npx.relu(sym.var("data"))
    assert "is_np_shape" not in json.loads(net.tojson())["attrs"]
    npx.set_np()
    try:
        assert json.loads(net.tojson())["attrs"]["is_np_shape"] == ["int", 1]
    finally:
        npx.reset_np()
    assert json.loads(net.tojson())["nodes"][1]["op"] == "_npx_relu"
