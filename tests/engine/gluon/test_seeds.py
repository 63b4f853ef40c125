"""Every code example of the hybridize seed texts, translated to engine imports, run and checked
(through examples/hybridize_tour.py, which prints what the seeds print)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine
from engine import nd
from engine.gluon import SymbolBlock
from engine.sym import Symbol

TOUR = Path(__file__).resolve().parents[3] / "examples" / "hybridize_tour.py"


def _load_tour() -> Any:
    spec = importlib.util.spec_from_file_location("hybridize_tour", TOUR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tour() -> Any:
    return _load_tour()


def test_tour_runs_every_seed_in_order(tour: Any, capsys: Any) -> None:
    results = tour.tour(passes=20)
    out = capsys.readouterr().out
    assert results["fancy"] == 10
    assert out.count("\n10\n") >= 2  # fancy_func, then the compiled program text
    seed000 = results["000"]
    np.testing.assert_allclose(seed000["after"].asnumpy(), seed000["before"].asnumpy(),
                               rtol=1e-5, atol=1e-6)
    assert isinstance(seed000["symbol"], Symbol)
    assert re.search(r"before hybridizing: \d+\.\d{4} sec", out)
    assert re.search(r"after hybridizing: \d+\.\d{4} sec", out)
    assert {"my_mlp-symbol.json", "my_mlp-0000.params", "model.json", "model.params",
            "np_mlp-symbol.json", "np_mlp-0000.params"} <= set(results["files"])
    assert '"op": "FullyConnected"' in results["001"]["json"]
    assert "With    hybridization:" in out and "Without hybridization:" in out


def test_hybridnet_prints_with_nd_then_once_with_sym(tour: Any, capsys: Any) -> None:
    net = tour.HybridNet()
    net.initialize()
    x = nd.random.normal(shape=(1, 4))
    net(x)
    net(x)
    out = capsys.readouterr().out
    assert out.count("F:  <module 'engine.nd'") == 2 and "hidden:" in out
    net.hybridize()
    net(x)
    out = capsys.readouterr().out
    assert out.count("F:  <module 'engine.sym'") == 1
    assert "x:  <Symbol data>" in out and "hidden:  <Symbol" in out
    net(x)
    assert capsys.readouterr().out == ""


def test_straight_dope_net_calls_hybrid_forward_once_after_hybridize(tour: Any,
                                                                     capsys: Any) -> None:
    net = tour.Net()
    net.collect_params().initialize()
    x = nd.random_normal(shape=(1, 512))
    net(x)
    net(x)
    net.hybridize()
    net(x)
    net(x)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("type")]
    assert lines == ["type(x): NDArray, F: engine.nd"] * 2 + ["type(x): Symbol, F: engine.sym"]


def test_exported_mlp_reloads_with_imports_and_load_model(tour: Any, tmp_path: Path) -> None:
    net = tour.get_net()
    x = nd.random.normal(shape=(3, 512))
    net.hybridize()
    expected = net(x).asnumpy()
    symbol_file, params_file = net.export(str(tmp_path / "my_mlp"))
    assert Path(symbol_file).name == "my_mlp-symbol.json"
    assert Path(params_file).name == "my_mlp-0000.params"
    block = SymbolBlock.imports(symbol_file, ["data"], params_file)
    np.testing.assert_allclose(block(x).asnumpy(), expected, rtol=1e-5, atol=1e-6)
    model = engine.load_model(symbol_file, params_file)
    (output,) = model.infer({"data": x.asnumpy()}).values()
    np.testing.assert_allclose(output, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(block(x * 2).asnumpy(), net(x * 2).asnumpy(), rtol=1e-5,
                               atol=1e-6)
    assert isinstance(block(tour.sym.var("data")), Symbol)
    params = nd.load(params_file)
    assert sorted(params)[0].startswith("arg:")


ALTERNATIVES = {"indexing x[0, 0]": "F.slice_axis", "x.dtype": "constructor argument",
                "x.context": "constructor arguments", "x.shape": "F.reshape",
                "item assignment x[0] = 2": "F.where", "x.asnumpy()": "engine.load_model",
                "in-place x += 1": "x = x + y", "if on a Symbol": "F.where"}
KINDS = {"indexing x[0, 0]": TypeError, "item assignment x[0] = 2": TypeError,
         "in-place x += 1": TypeError, "if on a Symbol": TypeError}


def test_each_limitation_raises_an_error_naming_the_alternative(tour: Any,
                                                                capsys: Any) -> None:
    errors = tour.limitations()
    assert set(errors) == set(tour.LIMITATIONS)
    for title, error in errors.items():
        assert isinstance(error, KINDS.get(title, AttributeError)), title
        assert ALTERNATIVES[title] in str(error), (title, str(error))
    assert "Symbol only support integer index" in str(errors["indexing x[0, 0]"])
    assert "does not support item assignment" in str(errors["item assignment x[0] = 2"])
    assert "[2. 2. 3.]" in capsys.readouterr().out


def test_limitations_work_imperatively(tour: Any) -> None:
    x = nd.array([[1.0, 2.0, 3.0]])
    for title in ("x.dtype", "x.context", "x.shape"):
        block = tour.Limited(tour.LIMITATIONS[title])
        assert block(x).shape == (1, 3), title


def test_python_control_flow_is_baked_into_the_trace(tour: Any) -> None:
    def body(F: Any, x: Any) -> Any:  # noqa: N803
        for _ in range(3):
            x = x * 2
        return x

    block = tour.Limited(body)
    block.hybridize()
    np.testing.assert_allclose(block(nd.ones((1, 2))).asnumpy(), [[8.0, 8.0]])
    graph = block._cached.traced.graph()
    assert [node.op for node in graph.nodes if not node.is_variable] == ["_mul_scalar"] * 3
