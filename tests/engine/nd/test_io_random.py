"""``nd.save``/``nd.load`` round trips and the seeded ``nd.random`` samplers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine import nd
from tests.conformance.fixtures import PARAMS


def test_save_load_dict_round_trip(tmp_path: Path) -> None:
    arrays = {"arg:w": nd.array(np.arange(6).reshape(2, 3)),
              "aux:m": nd.array([1, 2], dtype="float16"),
              "idx": nd.array([3, 4], dtype="int64")}
    path = tmp_path / "x.params"
    nd.save(path, arrays)
    loaded = nd.load(path)
    assert isinstance(loaded, dict) and list(loaded) == list(arrays)
    for key, value in arrays.items():
        assert loaded[key].dtype == value.dtype
        np.testing.assert_array_equal(loaded[key].asnumpy(), value.asnumpy())


def test_save_load_list_round_trip(tmp_path: Path) -> None:
    path = str(tmp_path / "list.params")
    nd.save(path, [nd.ones((2, 2)), nd.zeros((3,))])
    loaded = nd.load(path)
    assert isinstance(loaded, list) and [value.shape for value in loaded] == [(2, 2), (3,)]
    nd.save(path, nd.ones((1,)))
    assert [value.shape for value in nd.load(path)] == [(1,)]


def test_load_mxnet_file() -> None:
    loaded = nd.load(PARAMS / "unnamed_list.params")
    assert isinstance(loaded, list) and loaded
    named = nd.load(PARAMS / "dtypes.params")
    assert isinstance(named, dict) and all(isinstance(v, nd.NDArray) for v in named.values())


def test_save_rejects_non_arrays(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="must be an NDArray"):
        nd.save(tmp_path / "bad.params", {"a": [1, 2]})


def test_random_is_seeded_and_float32() -> None:
    nd.random.seed(7)
    first = nd.random.normal(shape=(3, 4))
    nd.random.seed(7)
    second = nd.random.normal(shape=(3, 4))
    np.testing.assert_array_equal(first.asnumpy(), second.asnumpy())
    assert first.dtype == np.float32 and first.shape == (3, 4)
    assert nd.random.normal().shape == (1,)
    uniform = nd.random.uniform(-2, -1, shape=(1000,))
    assert uniform.asnumpy().min() >= -2 and uniform.asnumpy().max() < -1
    big = nd.random_normal(5.0, 0.5, shape=(20000,)).asnumpy()
    assert abs(big.mean() - 5.0) < 0.02 and abs(big.std() - 0.5) < 0.02
    assert nd.random_uniform(shape=(2,), dtype="float64").dtype == np.float64


def test_random_with_parameter_arrays() -> None:
    samples = nd.random.normal(nd.array([0, 100]), nd.array([1, 1]), shape=(50,))
    assert samples.shape == (2, 50)
    assert abs(samples.asnumpy()[1].mean() - 100) < 1
