"""The generated ``nd.<op>`` functions: signatures, docstrings, argument binding, ``out=``."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from engine import nd
from engine.errors import ModelFormatError
from engine.ops import all_ops


def _fc_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    return x @ w.T + b


def test_every_registered_name_is_a_function() -> None:
    for name in all_ops():
        assert callable(getattr(nd, name)), name
    assert nd.__name__ == "engine.nd"


def test_signature_and_doc_come_from_the_schema() -> None:
    signature = inspect.signature(nd.FullyConnected)
    assert list(signature.parameters)[:3] == ["data", "weight", "bias"]
    num_hidden = signature.parameters["num_hidden"]
    assert num_hidden.kind is inspect.Parameter.KEYWORD_ONLY
    assert num_hidden.default is inspect.Parameter.empty
    assert signature.parameters["flatten"].default is True
    assert "out" in signature.parameters and "name" in signature.parameters
    assert "num_hidden (int, required)" in nd.FullyConnected.__doc__
    assert nd.FullyConnected.__name__ == "FullyConnected"
    concat = inspect.signature(nd.Concat).parameters
    assert concat["data"].kind is inspect.Parameter.VAR_POSITIONAL


def test_inputs_by_position_and_keyword() -> None:
    rng = np.random.default_rng(1)
    x, w, b = (rng.normal(size=shape).astype(np.float32) for shape in [(2, 5), (3, 5), (3,)])
    expected = _fc_reference(x, w, b)
    by_position = nd.FullyConnected(nd.array(x), nd.array(w), nd.array(b), num_hidden=3)
    by_keyword = nd.FullyConnected(data=nd.array(x), weight=nd.array(w), bias=nd.array(b),
                                   num_hidden="3", name="ignored")
    np.testing.assert_allclose(by_position.asnumpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(by_keyword.asnumpy(), expected, rtol=1e-5)
    no_bias = nd.FullyConnected(nd.array(x), nd.array(w), None, num_hidden=3, no_bias=True)
    np.testing.assert_allclose(no_bias.asnumpy(), x @ w.T, rtol=1e-5)


def test_out_writes_into_the_given_array() -> None:
    x = nd.array([[-1, 2]])
    target = nd.zeros((1, 2))
    result = nd.relu(x, out=target)
    assert result is target
    assert target.asnumpy().tolist() == [[0, 2]]


def test_variadic_ops_fill_num_args() -> None:
    a, b, c = nd.ones((2, 1)), nd.zeros((2, 2)), nd.ones((2, 3))
    assert nd.Concat(a, b, c, dim=1).shape == (2, 6)
    assert nd.concat(a, b).shape == (2, 3)
    total = nd.add_n(a, a, a)
    assert total.asnumpy().tolist() == [[3], [3]]
    assert nd.ElementWiseSum(a, a).asnumpy().tolist() == [[2], [2]]


def test_multiple_outputs_come_back_as_a_list() -> None:
    parts = nd.split(nd.array(np.arange(6).reshape(2, 3)), num_outputs=3, axis=1)
    assert isinstance(parts, list) and [part.shape for part in parts] == [(2, 1)] * 3
    assert parts[2].asnumpy().ravel().tolist() == [2, 5]


def test_aliases_and_numpy_mode_names() -> None:
    x = nd.array([[-1.0, 3.0]])
    assert nd.Activation(x, act_type="relu").asnumpy().tolist() == [[0, 3]]
    assert nd.npx.relu(x).asnumpy().tolist() == [[0, 3]]
    assert nd.flatten(nd.zeros((2, 3, 4))).shape == (2, 12)
    assert nd.np.add(x, x).asnumpy().tolist() == [[-2, 6]]
    assert nd.np.ones((2,)).dtype == np.float32
    with pytest.raises(AttributeError, match="_npx_no_such_op"):
        nd.npx.no_such_op  # noqa: B018


def test_binding_errors_name_the_problem() -> None:
    x = nd.ones((2, 3))
    with pytest.raises(TypeError, match="missing input.*'weight'"):
        nd.FullyConnected(x, num_hidden=3)
    with pytest.raises(TypeError, match="unknown argument 'colour'"):
        nd.relu(x, colour="red")
    with pytest.raises(TypeError, match="takes 1 inputs"):
        nd.relu(x, x)
    with pytest.raises(TypeError, match="given twice"):
        nd.relu(x, data=x)
    with pytest.raises(TypeError, match="must be an NDArray"):
        nd.relu([1, 2])
    with pytest.raises(ModelFormatError, match="num_hidden"):
        nd.FullyConnected(x, nd.ones((3, 3)), nd.ones((3,)))
    with pytest.raises(AttributeError, match="no registry op"):
        nd.NoSuchOperator  # noqa: B018
