"""Factorisations and NumPy-mode array utilities beyond the MXNet cases: partial shapes, float64
(the conformance graphs feed float32), properties the factors must have, errors, and powerd's
distribution (MXNet's samples cannot be reproduced)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ModelFormatError, ShapeError
from engine.ops import get_op
from tests.engine.ops.helpers import infer, run

RNG = np.random.default_rng(19)


def test_factorisation_shapes_keep_unknown_dimensions() -> None:
    assert infer("_linalg_gelqf", {}, [(0, 3, 5)])[1] == [(0, 3, 5), (0, 3, 3)]
    assert infer("_npi_svd", {}, [(2, 0, 6)])[1] == [(2, 0, 0), (2, 0), (2, 0, 6)]
    assert infer("_npi_eigh", {}, [(0, 4, 4)])[1] == [(0, 4), (0, 4, 4)]
    assert infer("_npi_pinv", {}, [(2, 4, 3), None])[1] == [(2, 3, 4)]
    assert infer("_npi_eigvals", {}, [None])[1] == [None]
    assert infer("_npi_tensorinv", {"ind": "1"}, [(0, 2, 3)])[1] == [None]


def test_factorisations_refuse_the_wrong_matrices() -> None:
    with pytest.raises(ShapeError, match="rows <= columns"):
        infer("_linalg_gelqf", {}, [(5, 3)])
    with pytest.raises(ShapeError, match="square"):
        infer("_npi_eig", {}, [(2, 3, 4)])
    with pytest.raises(ShapeError, match=r"prod\(a.shape\[:ind\]\)"):
        infer("_npi_tensorinv", {}, [(6, 2, 3)])
    with pytest.raises(ShapeError, match="must start with b's shape"):
        infer("_npi_tensorsolve", {}, [(2, 3, 6), (3, 2)])


def test_factors_rebuild_their_matrix_in_float64() -> None:
    a = RNG.standard_normal((2, 3, 5))
    q, lower = run("_linalg_gelqf", {}, a)
    assert q.dtype == lower.dtype == np.float64
    np.testing.assert_allclose(lower @ q, a, atol=1e-12)
    np.testing.assert_allclose(q @ q.swapaxes(1, 2), np.broadcast_to(np.eye(3), (2, 3, 3)),
                               atol=1e-12)
    assert np.allclose(np.triu(lower, 1), 0)
    ut, values, v = run("_npi_svd", {}, a)
    np.testing.assert_allclose(ut * values[:, None, :] @ v, a, atol=1e-12)
    assert (np.diff(values, axis=-1) <= 0).all()


def test_eigenvectors_have_their_largest_entry_positive() -> None:
    base = RNG.standard_normal((3, 4, 4))
    symmetric = base + base.swapaxes(1, 2)
    rows, values = run("_linalg_syevd", {}, symmetric)
    largest = np.take_along_axis(rows, np.abs(rows).argmax(-1)[..., None], -1)
    assert (largest > 0).all()
    np.testing.assert_allclose(rows @ symmetric, values[..., None] * rows, atol=1e-10)
    w, v = run("_npi_eigh", {"UPLO": "U"}, np.triu(symmetric))
    np.testing.assert_allclose(w, values, atol=1e-10)
    np.testing.assert_allclose(v, rows.swapaxes(1, 2), atol=1e-10)


def test_pinv_cuts_small_singular_values_per_matrix() -> None:
    rank_one = np.outer([1.0, 2.0], [3.0, 4.0, 5.0]) + np.diag([1e-3, 1e-3])[:, :2] @ np.eye(2, 3)
    batch = np.stack([rank_one, rank_one])
    (kept,) = run("_npi_pinv", {}, batch, np.array([1e-9, 0.1]))
    np.testing.assert_allclose(kept[0], np.linalg.pinv(rank_one), rtol=1e-8)
    np.testing.assert_allclose(kept[1], np.linalg.pinv(rank_one, rcond=0.1), rtol=1e-8)
    assert not np.allclose(kept[0], kept[1])


def test_norm_shapes_and_orders() -> None:
    x = RNG.standard_normal((2, 3, 4))
    assert infer("_npi_norm", {"flag": "-2", "keepdims": "True"}, [(2, 3, 4)])[1] == [(1, 1, 1)]
    assert infer("_npi_norm", {"axis": "(0, 2)"}, [(2, 3, 4)])[1] == [(3,)]
    assert infer("_npi_norm", {}, [None])[1] == [None]
    (spectral,) = run("_npi_norm", {"ord": "-2", "axis": "(2, 1)", "flag": "0"}, x)
    np.testing.assert_allclose(spectral, np.linalg.norm(x.swapaxes(1, 2), -2, axis=(1, 2)))
    (negative,) = run("_npi_norm", {"ord": "-1", "axis": "(1,)"}, np.array([[0.0, 2.0, 2.0]]))
    np.testing.assert_allclose(negative, [1.0])  # zeros are skipped, not infinite
    with pytest.raises(ShapeError, match="more than two axes"):
        infer("_npi_norm", {"axis": "(0, 1, 2)"}, [(2, 3, 4)])
    with pytest.raises(ShapeError, match="out of range"):
        infer("_npi_norm", {"axis": "(2,)"}, [(1, 3)])


def test_statistics_keep_float64_and_check_their_inputs() -> None:
    a = RNG.standard_normal((3, 5))
    (average,) = run("_npi_average", {"axis": "1"}, a, np.ones(5))
    assert average.dtype == np.float64
    np.testing.assert_allclose(average, a.mean(1))
    (median,) = run("_npi_percentile", {"q_scalar": "50", "axis": "1"}, a)
    assert median.dtype == np.float64
    np.testing.assert_allclose(median, np.median(a, axis=1))
    with pytest.raises(ShapeError, match="1-D along a single axis"):
        infer("_npi_average", {}, [(3, 5), (5,)])
    with pytest.raises(ShapeError, match="together"):
        infer("_histogram", {"bin_cnt": "3"}, [(4,)])
    hist, edges = run("_histogram", {"bin_cnt": "2", "range": "(1, 1)"}, np.array([1.0, 0.2]))
    np.testing.assert_array_equal(edges, [0.5, 1.0, 1.5])  # an empty range widens by 1
    np.testing.assert_array_equal(hist, [0, 1])


def test_insert_matches_numpy_for_repeated_and_negative_indices() -> None:
    arr = np.arange(12.0).reshape(3, 4)
    indices = np.array([4, -1, 0, 4], np.int64)
    (result,) = run("_npi_insert_tensor", {"axis": "1"}, arr, np.array([[10, 20, 30, 40.0]]),
                    indices)
    np.testing.assert_array_equal(result, np.insert(arr, indices, [[10, 20, 30, 40]], axis=1))
    (scalar,) = run("_npi_insert_scalar", {"int_ind": "-1", "val": "7", "axis": "0"}, arr)
    np.testing.assert_array_equal(scalar, np.insert(arr, -1, 7, axis=0))
    with pytest.raises(ShapeError, match="out of bounds"):
        run("_npi_insert_scalar", {"int_ind": "9", "val": "7", "axis": "0"}, arr)


def test_sequences_partial_shapes_and_bad_attributes() -> None:
    assert infer("_npi_pad", {"pad_width": "((1, 2), (0, 3))"}, [(0, 4)])[1] == [(0, 7)]
    assert infer("_npi_ediff1d", {"to_begin_scalar": "1"}, [(3, 0)])[1] == [None]
    assert infer("_npi_diag_indices_from", {}, [(3, 0, 3)])[1] == [(3, 3)]
    with pytest.raises(ShapeError, match="pair of non-negative sizes"):
        infer("_npi_pad", {"pad_width": "((1, 2), (1, 2), (1, 2))"}, [(2, 2)])
    with pytest.raises(ModelFormatError, match="pad_width"):
        get_op("_npi_pad").parse_attrs({"pad_width": "wide"})
    (odd,) = run("_npi_pad", {"pad_width": "((2, 1),)", "mode": "reflect",
                              "reflect_type": "odd"}, np.array([1.0, 2.0, 4.0]))
    np.testing.assert_array_equal(odd, np.pad([1.0, 2.0, 4.0], (2, 1), "reflect",
                                              reflect_type="odd"))


def test_powerd_samples_the_power_distribution() -> None:
    np.random.seed(19)
    (samples,) = run("_npi_powerd", {"a": "3", "size": "(20000,)"})
    assert samples.dtype == np.float32 and samples.shape == (20000,)
    assert samples.min() >= 0 and samples.max() <= 1
    assert abs(samples.mean() - 3 / 4) < 0.01  # E[X] = a / (a + 1)
    exponents = np.array([[0.5], [8.0]], np.float32)
    (per_row,) = run("_npi_powerd", {"size": "(2, 5000)"}, exponents)
    np.testing.assert_allclose(per_row.mean(axis=1), [1 / 3, 8 / 9], atol=0.02)
    assert infer("_npi_powerd", {}, [(2, 3)])[1] == [(2, 3)]


def test_pinv_rcond_must_fit_the_batch() -> None:
    with pytest.raises(ShapeError, match="rcond"):
        infer("_npi_pinv", {}, [(2, 3, 4), (2, 3, 4)])
    with pytest.raises(ShapeError, match="do not broadcast"):
        infer("_npi_pinv", {}, [(2, 3, 4), (3,)])
    assert infer("_npi_pinv", {}, [(5, 2, 3, 4), (2,)])[1] == [(5, 2, 4, 3)]
