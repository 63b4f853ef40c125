"""``engine.np``/``engine.npx``: what seed code written for ``mx.np``/``mx.npx`` uses."""

from __future__ import annotations

import numpy

from engine import np, npx


def test_seed_style_calls() -> None:
    npx.set_np()
    try:
        assert npx.is_np_array() and npx.is_np_shape()
        x = np.random.normal(size=(2, 3))
        assert x.shape == (2, 3) and x.dtype == numpy.float32
        assert np.ones((2, 2)).asnumpy().sum() == 4
        assert np.zeros((3,)).dtype == numpy.float32
        assert np.array([1, 2]).dtype == numpy.float32
        assert np.array(numpy.array([1, 2], dtype="int32")).dtype == numpy.int32
        assert isinstance(x, np.ndarray)
        relu = npx.relu(np.array([[-1.0, 2.0]]))
        assert relu.asnumpy().tolist() == [[0, 2]]
        npx.waitall()
    finally:
        npx.reset_np()
    assert not npx.is_np_array()


def test_np_ops_resolve_to_numpy_mode_registry_names() -> None:
    a = np.array([[1.0, 2.0]])
    assert np.add(a, a).asnumpy().tolist() == [[2, 4]]
    assert np.dot(a, np.array([[1.0], [1.0]])).asnumpy().tolist() == [[3]]
    assert np.reshape(a, newshape=(2, 1)).shape == (2, 1)
