"""`engine.cuda.blas` against numpy: every layout it hands cuBLAS, on the stand-in's raw-pointer
cuBLAS (column-major, leading dimensions and batch strides taken literally)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.cuda import blas
from tests.engine.gpu import fake_cupy


@pytest.fixture
def cupy(monkeypatch: pytest.MonkeyPatch) -> Any:
    return fake_cupy.install(monkeypatch)


def _device(cupy: Any, array: np.ndarray) -> Any:
    return cupy.asarray(np.ascontiguousarray(array))


def _views(cupy: Any, rng: np.random.Generator, shape: tuple[int, ...]) -> list[Any]:
    """The same logical matrix stack as C-contiguous, transposed, sliced and broadcast views."""
    values = rng.standard_normal(shape).astype(np.float32)
    swapped = _device(cupy, np.swapaxes(values, -1, -2))
    wide = _device(cupy, np.concatenate([values, values], axis=-1))
    return [_device(cupy, values), swapped.swapaxes(-1, -2), wide[..., :shape[-1]]]


SHAPES = [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)),
          ((2, 1, 3, 4), (1, 3, 4, 2)), ((1, 4), (4, 1)), ((4,), (4, 3)), ((2, 3, 4), (4,)),
          ((3, 0), (0, 2)), ((0, 3, 4), (4, 2))]


@pytest.mark.parametrize(("left_shape", "right_shape"), SHAPES)
def test_matmul_matches_numpy_for_every_layout(cupy: Any, left_shape: tuple, right_shape: tuple
                                                ) -> None:
    rng = np.random.default_rng(0)
    lefts = _views(cupy, rng, left_shape) if len(left_shape) > 1 else [
        _device(cupy, rng.standard_normal(left_shape).astype(np.float32))]
    rights = _views(cupy, rng, right_shape) if len(right_shape) > 1 else [
        _device(cupy, rng.standard_normal(right_shape).astype(np.float32))]
    for left in lefts:
        for right in rights:
            expected = np.matmul(np.asarray(left.get()), np.asarray(right.get()))
            np.testing.assert_allclose(blas.matmul(cupy, left, right).get(), expected,
                                       rtol=1e-5, atol=1e-5)
            out = cupy.empty(expected.shape, np.float32)
            assert blas.matmul(cupy, left, right, out) is out
            np.testing.assert_allclose(out.get(), expected, rtol=1e-5, atol=1e-5)


def test_matmul_writes_a_strided_out_and_calls_cublas(cupy: Any) -> None:
    rng = np.random.default_rng(1)
    left = _device(cupy, rng.standard_normal((6, 4)))
    right = _device(cupy, rng.standard_normal((4, 5)))
    host_out = np.zeros((5, 6))
    out = _device(cupy, host_out).T  # a transposed view: cuBLAS writes a copy, then it is copied
    before = blas._library(cupy).gemms
    blas.matmul(cupy, left, right, out)
    assert blas._library(cupy).gemms == before + 1
    np.testing.assert_allclose(out.get(), left.get() @ right.get(), rtol=1e-12)


def test_integers_and_mixed_dtypes_go_to_cupys_matmul(cupy: Any) -> None:
    left = _device(cupy, np.arange(6, dtype=np.int32).reshape(2, 3))
    right = _device(cupy, np.arange(6, dtype=np.int32).reshape(3, 2))
    before = blas._library(cupy).gemms
    np.testing.assert_array_equal(blas.matmul(cupy, left, right).get(),
                                  left.get() @ right.get())
    assert blas._library(cupy).gemms == before


@pytest.mark.parametrize(("left_shape", "right_shape", "axes"), [
    ((2, 3, 4), (4, 3, 5), ([1, 2], [1, 0])), ((3, 4), (4, 5), 1), ((2, 3, 4), (3, 4, 2), 2)])
def test_tensordot_and_dot_match_numpy(cupy: Any, left_shape: tuple, right_shape: tuple,
                                       axes: Any) -> None:
    rng = np.random.default_rng(2)
    left = _device(cupy, rng.standard_normal(left_shape))
    right = _device(cupy, rng.standard_normal(right_shape))
    np.testing.assert_allclose(blas.tensordot(cupy, left, right, axes).get(),
                               np.tensordot(left.get(), right.get(), axes), rtol=1e-12)
    if left.shape[-1] == right.shape[-2 if right.ndim > 1 else 0]:
        np.testing.assert_allclose(blas.dot(cupy, left, right).get(),
                                   np.dot(left.get(), right.get()), rtol=1e-12)


def test_cupys_own_products_are_refused_in_capture_and_ours_are_not(cupy: Any) -> None:
    left = _device(cupy, np.ones((2, 3), np.float32))
    right = _device(cupy, np.ones((3, 2), np.float32))
    stream = cupy.cuda.Stream()
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(NotImplementedError, match="cuBLAS"):
                cupy.matmul(left, right)
            np.testing.assert_allclose(np.asarray(blas.matmul(cupy, left, right)), 3.0)
        finally:
            stream.end_capture()


@pytest.mark.parametrize(("subscripts", "shapes"), [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("ii->", [(4, 4)]), ("ii->i", [(3, 3)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("...ij,...jk", [(2, 3, 4), (4, 2)]),
    ("i,i", [(5,), (5,)]), ("ij->ji", [(2, 3)]), ("i,j->ij", [(2,), (3,)]),
    ("iij,jk->ik", [(3, 3, 2), (2, 4)])])
def test_einsum_without_cublas_matches_numpy(cupy: Any, subscripts: str, shapes: list) -> None:
    from engine.cuda.einsum import einsum

    rng = np.random.default_rng(3)
    operands = [_device(cupy, rng.standard_normal(shape)) for shape in shapes]
    np.testing.assert_allclose(np.asarray(einsum(cupy, subscripts, *operands).get()),
                               np.einsum(subscripts, *(o.get() for o in operands)), rtol=1e-12)
