"""NDArray: creation, printing, operators (plain, reflected, in place), indexing, conversion."""

from __future__ import annotations

import numpy as np
import pytest

from engine import nd
from engine.context import cpu, gpu
from engine.errors import EngineError, ShapeError


def test_array_defaults_to_float32_and_keeps_ndarray_dtype() -> None:
    assert nd.array([1, 2]).dtype == np.float32
    assert nd.array(np.arange(3)).dtype == np.float32
    assert nd.array(nd.array([1], dtype="int32")).dtype == np.int32
    assert nd.zeros((2, 3)).dtype == np.float32
    assert nd.ones(4).shape == (4,)
    assert nd.full((2,), 7, dtype="int64").asnumpy().tolist() == [7, 7]
    assert nd.empty((1, 2)).shape == (1, 2)
    np.testing.assert_array_equal(nd.arange(5).asnumpy(), np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(nd.arange(1, 3, 0.5, repeat=2).asnumpy(),
                                  [1, 1, 1.5, 1.5, 2, 2, 2.5, 2.5])
    like = nd.zeros_like(nd.array([[1, 2]], dtype="float16"))
    assert like.dtype == np.float16 and like.shape == (1, 2)
    assert nd.ones_like(nd.zeros((3,))).asnumpy().sum() == 3


def test_properties() -> None:
    x = nd.array([[1, 2, 3], [4, 5, 6]])
    assert (x.shape, x.size, x.ndim, len(x)) == ((2, 3), 6, 2, 2)
    assert x.context == cpu(0) and x.ctx == cpu()
    assert x.T.shape == (3, 2)
    assert x.astype("int32").dtype == np.int32
    assert np.asarray(x).dtype == np.float32
    assert x.asnumpy() is not x.asnumpy()
    x.wait_to_read()
    nd.waitall()


def test_printing_matches_mxnet() -> None:
    assert repr(nd.array([[1, 2]])) == "\n[[1. 2.]]\n<NDArray 1x2 @cpu(0)>"
    assert str(nd.zeros((3,))) == "\n[0. 0. 0.]\n<NDArray 3 @cpu(0)>"


def test_scalar_and_array_arithmetic() -> None:
    a = nd.array([[1, 2], [3, 4]])
    b = nd.array([10, 20])
    np.testing.assert_allclose((a + b).asnumpy(), [[11, 22], [13, 24]])  # broadcast
    np.testing.assert_allclose((a - 1).asnumpy(), [[0, 1], [2, 3]])
    np.testing.assert_allclose((10 - a).asnumpy(), [[9, 8], [7, 6]])
    np.testing.assert_allclose((2 * a).asnumpy(), [[2, 4], [6, 8]])
    np.testing.assert_allclose((1 / a).asnumpy(), 1 / np.array([[1, 2], [3, 4]]), rtol=1e-6)
    np.testing.assert_allclose((a / b).asnumpy(), [[0.1, 0.1], [0.3, 0.2]], rtol=1e-6)
    np.testing.assert_allclose((a ** 2).asnumpy(), [[1, 4], [9, 16]])
    np.testing.assert_allclose((2 ** a).asnumpy(), [[2, 4], [8, 16]])
    np.testing.assert_allclose((a % 3).asnumpy(), [[1, 2], [0, 1]])
    np.testing.assert_allclose((-a).asnumpy(), -a.asnumpy())
    np.testing.assert_allclose(abs(-a).asnumpy(), a.asnumpy())
    np.testing.assert_allclose((a + np.float32(1)).asnumpy(), a.asnumpy() + 1)


def test_comparisons_give_float_masks() -> None:
    a = nd.array([1, 2, 3])
    assert (a > 1).asnumpy().tolist() == [0, 1, 1]
    assert (a <= 2).asnumpy().tolist() == [1, 1, 0]
    assert (a == nd.array([1, 0, 3])).asnumpy().tolist() == [1, 0, 1]
    assert (a != 2).asnumpy().tolist() == [1, 0, 1]
    assert (2 < a).asnumpy().tolist() == [0, 0, 1]
    assert (a > 1).dtype == np.float32


def test_in_place_operators_write_into_the_array() -> None:
    a = nd.array([1, 2, 3])
    alias = a
    a += 1
    a *= nd.array([2, 2, 2])
    a -= 1
    a /= 2
    assert alias is a
    np.testing.assert_allclose(a.asnumpy(), [1.5, 2.5, 3.5])
    with pytest.raises(ShapeError, match="has shape"):
        a += nd.ones((2, 3))


def test_indexing_views_and_assignment() -> None:
    x = nd.array(np.arange(12).reshape(3, 4))
    row = x[1]
    assert row.shape == (4,)
    assert x[1, 2].shape == (1,) and x[1, 2].item() == 6  # no 0-d arrays in legacy MXNet
    block = x[0:2]
    block[:] = 0  # a view, as in MXNet
    assert x.asnumpy()[:2].sum() == 0
    x[2, :] = nd.array([1, 1, 1, 1])
    x[:, 0] = 5
    assert x.asnumpy()[:, 0].tolist() == [5, 5, 5]
    assert x.asnumpy()[2].tolist() == [5, 1, 1, 1]
    assert x[nd.array([0, 2])].shape == (2, 4)
    assert [part.shape for part in nd.zeros((2, 3))] == [(3,), (3,)]


def test_bool_and_item() -> None:
    assert bool(nd.array([1]))
    assert not bool(nd.array([0]))
    assert nd.array([2.5]).item() == 2.5 and nd.array([3]).asscalar() == 3
    with pytest.raises(ValueError, match="ambiguous"):
        bool(nd.array([1, 2]))
    with pytest.raises(ValueError, match="size 1"):
        nd.array([1, 2]).item()


def test_reshape_with_mxnet_codes() -> None:
    x = nd.array(np.arange(24).reshape(2, 3, 4))
    assert x.reshape((6, 4)).shape == (6, 4)
    assert x.reshape(4, -1).shape == (4, 6)
    assert x.reshape((0, -1)).shape == (2, 12)
    assert x.reshape((-3, 4)).shape == (6, 4)
    assert x.reshape((0, -4, 1, 3, 4)).shape == (2, 1, 3, 4)
    assert x.reshape(shape=(-2,)).shape == (2, 3, 4)
    assert x.reshape((-1, 0), reverse=True).shape == (6, 4)
    np.testing.assert_array_equal(x.reshape((0, -1)).asnumpy(), np.arange(24).reshape(2, 12))
    with pytest.raises(ShapeError):
        x.reshape((5, 5))


def test_copies() -> None:
    x = nd.array([1, 2])
    y = x.copy()
    y[:] = 0
    assert x.asnumpy().tolist() == [1, 2]
    target = nd.zeros((2,))
    x.copyto(target)
    assert target.asnumpy().tolist() == [1, 2]
    assert x.as_in_context(cpu()) is x


def test_gpu_arrays_fail_clearly(no_cupy: str) -> None:
    with pytest.raises(EngineError, match="CuPy and a GPU"):
        nd.zeros((2,), ctx=gpu(0))
    with pytest.raises(EngineError, match="CuPy and a GPU"):
        nd.array([1]).as_in_context(gpu(1))
    with pytest.raises(EngineError, match="CuPy"), gpu(0):
        nd.ones((1,))


def test_concat_and_stack() -> None:
    a, b = nd.ones((2, 1)), nd.zeros((2, 2))
    assert nd.concat(a, b).shape == (2, 3)
    assert nd.concat(a, a, dim=0).shape == (4, 1)
    assert nd.stack(a, a).shape == (2, 2, 1)
    assert nd.stack(a, a, axis=2).shape == (2, 1, 2)
