"""gamma, gammaln and erfinv in float64 against Python's own functions; densities, MXNet's
internal helpers and partial shapes (MXNet's float32 outputs are in tests/fixtures ops_special)."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from engine.errors import InputError, ShapeError
from tests.engine.ops.helpers import infer, run

RNG = np.random.default_rng(19)


def _reference_gamma(x: float) -> float:
    try:
        return math.gamma(x)
    except OverflowError:
        return math.inf
    except ValueError:
        return math.copysign(math.inf, x) if x == 0 else math.nan


def test_float64_gamma_and_gammaln_match_python_across_the_domain() -> None:
    x = np.concatenate([RNG.uniform(-60, 175, 4000), [1e-300, -1e-300, 0.5, 1, 2, 3, 1e15,
                                                       -170.5, -171.5, 2e305]])
    x = x[~((x <= 0) & (x == np.floor(x)))]
    gammaln = run("gammaln", {}, x)[0]
    expected = np.array([math.lgamma(value) for value in x])
    np.testing.assert_allclose(gammaln, expected, rtol=1e-13, atol=1e-13)
    gamma = run("_npx_gamma", {}, x)[0]
    expected = np.array([_reference_gamma(value) for value in x])
    finite = np.isfinite(expected)
    np.testing.assert_allclose(gamma[finite], expected[finite], rtol=1e-12)
    assert np.all(gamma[~finite] == expected[~finite])


def test_gamma_poles_signed_zeros_infinities_and_nan() -> None:
    x = np.array([0.0, -0.0, -1.0, -7.0, -np.inf, np.inf, np.nan, 172.0])
    gamma = run("gamma", {}, x)[0]
    np.testing.assert_array_equal(gamma, [np.inf, -np.inf, np.nan, np.nan, np.nan, np.inf,
                                          np.nan, np.inf])
    gammaln = run("gammaln", {}, x)[0]
    np.testing.assert_array_equal(gammaln[:7], [np.inf] * 6 + [np.nan])
    assert gammaln[7] == pytest.approx(math.lgamma(172.0), rel=1e-14)


def test_float64_erfinv_inverts_erf_and_matches_the_normal_quantile() -> None:
    y = np.concatenate([RNG.uniform(-1, 1, 2000), [1e-300, 1e-9, 0.5, 0.99999, 1 - 1e-15]])
    result = run("erfinv", {}, y)[0]
    quantile = statistics.NormalDist().inv_cdf
    expected = np.array([quantile((1 + v) / 2) / math.sqrt(2) if abs(v) < 0.5 else
                         math.copysign(-quantile((1 - abs(v)) / 2) / math.sqrt(2), v)
                         for v in y])
    tiny = np.abs(y) < 1e-6  # the quantile's (1 + y) / 2 loses these; erfinv(y) ~ y sqrt(pi)/2
    expected[tiny] = y[tiny] * math.sqrt(math.pi) / 2
    np.testing.assert_allclose(result, expected, rtol=2e-9)
    np.testing.assert_allclose([math.erf(value) for value in result[:2000]], y[:2000],
                               rtol=1e-8, atol=1e-15)
    edges = run("_npx_erfinv", {}, np.array([1.0, -1.0, 1.5, -2.0, np.nan]))[0]
    np.testing.assert_array_equal(edges, [np.inf, -np.inf, np.nan, np.nan, np.nan])


def test_integer_inputs_keep_their_dtype_with_exact_factorials() -> None:
    n = np.arange(1, 13, dtype=np.int64)
    gamma = run("gamma", {}, n)[0]
    assert gamma.dtype == np.int64
    np.testing.assert_array_equal(gamma, [math.factorial(k - 1) for k in n])
    float16 = run("gamma", {}, np.array([0.5, 9.0, 10.0], np.float16))[0]
    assert float16.dtype == np.float16 and float16[-1] == np.inf  # 9! > float16's max


def _pdf(name: str, is_log: bool, *inputs: np.ndarray) -> np.ndarray:
    return run(f"_random_pdf_{name}", {"is_log": str(is_log)}, *inputs)[0]


def test_densities_broadcast_parameters_over_trailing_sample_axes() -> None:
    sample = RNG.normal(size=(2, 3, 5))
    mu, sigma = RNG.normal(size=(2, 3)), RNG.uniform(0.5, 2, (2, 3))
    density = _pdf("normal", False, sample, mu, sigma)
    expected = np.exp(-0.5 * ((sample - mu[..., None]) / sigma[..., None]) ** 2) / (
        math.sqrt(2 * math.pi) * sigma[..., None])
    np.testing.assert_allclose(density, expected, rtol=1e-12)
    np.testing.assert_allclose(_pdf("normal", True, sample, mu, sigma), np.log(expected),
                               rtol=1e-12)


def test_discrete_densities_sum_to_one() -> None:
    counts = np.arange(200, dtype=np.float64)[None, :]
    lam, k, p = np.array([3.5]), np.array([2.5]), np.array([0.4])
    assert _pdf("poisson", False, counts, lam).sum() == pytest.approx(1.0, abs=1e-12)
    assert _pdf("negative_binomial", False, counts, k, p).sum() == pytest.approx(1.0, abs=1e-9)
    # mean mu, dispersion alpha: the same law as k = 1 / alpha, p = 1 / (1 + mu alpha)
    mu, alpha = np.array([4.0]), np.array([0.5])
    np.testing.assert_allclose(_pdf("generalized_negative_binomial", False, counts, mu, alpha),
                               _pdf("negative_binomial", False, counts, 1 / alpha,
                                    1 / (1 + mu * alpha)), rtol=1e-12)


def test_dirichlet_reduces_the_vector_axis() -> None:
    sample = RNG.dirichlet(np.ones(3), (2, 4))
    alpha = RNG.uniform(0.5, 3, (2, 3))
    density = _pdf("dirichlet", True, sample, alpha)
    assert density.shape == (2, 4)
    a = alpha[0]
    expected = (math.lgamma(a.sum()) - sum(math.lgamma(v) for v in a)
                + ((a - 1) * np.log(sample[0, 1])).sum())
    assert density[0, 1] == pytest.approx(expected, rel=1e-12)
    assert _pdf("dirichlet", False, sample[0, 0], alpha[0]).shape == (1,)


def test_density_shapes_partial_and_refused() -> None:
    assert infer("_random_pdf_gamma", {}, [(2, 3, 4), None, (0, 3)]) == (
        [(2, 3, 4), (2, 3), (2, 3)], [(2, 3, 4)])
    assert infer("_random_pdf_dirichlet", {}, [(2, 5, 4), (2, 0)])[0][1] == (2, 4)
    assert infer("random_pdf_normal", {}, [None, (2,), None])[1] == [None]
    with pytest.raises(ShapeError, match="leading part of the sample"):
        infer("_random_pdf_exponential", {}, [(2,), (2, 3)])
    with pytest.raises(ShapeError, match="disagree"):
        infer("_random_pdf_uniform", {}, [(2, 3), (2,), (3,)])


def test_square_sum_reduces_like_sum_of_squares() -> None:
    data = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(run("_square_sum", {"axis": "(1,)"}, data)[0],
                               (data ** 2).sum(axis=1), rtol=1e-6)
    result = run("_square_sum", {"axis": "(1,)", "exclude": "True", "keepdims": "True"}, data)
    np.testing.assert_allclose(result[0], (data ** 2).sum(axis=(0, 2), keepdims=True),
                               rtol=1e-6)
    assert infer("_square_sum", {}, [(2, 3)])[1] == [(1,)]


def test_legacy_onehot_and_fill_element_0index() -> None:
    # Values as MXNet 1.9.1 gives them imperatively (it cannot run these two in a graph).
    index = np.array([0, 3, 1, 7, -1, 2.7], np.float32)
    onehot = run("_onehot_encode", {}, index, np.full((6, 4), 5, np.float32))[0]
    expected = np.zeros((6, 4), np.float32)
    for row, column in enumerate(index.astype(int)):
        if 0 <= column < 4:
            expected[row, column] = 1
    np.testing.assert_array_equal(onehot, expected)
    filled = run("fill_element_0index", {}, np.ones((4, 3), np.float32),
                 np.array([7, 8, 9, 10], np.float32), np.array([2, 0, 5, 1.8], np.float32))[0]
    np.testing.assert_array_equal(filled, [[1, 1, 7], [8, 1, 1], [1, 1, 1], [1, 10, 1]])
    assert infer("fill_element_0index", {}, [None, (4,), None]) == (
        [None, (4,), (4,)], [None])


def test_amp_multicast_dtype_rules() -> None:
    half, single = np.ones(2, np.float16), np.ones(2, np.float32)
    ints, double = np.ones(2, np.int32), np.ones(2, np.float64)
    dtypes = [out.dtype for out in run("amp_multicast", {"num_outputs": "3"}, half, single,
                                       double)]
    assert dtypes == [np.float32, np.float32, np.float64]
    dtypes = [out.dtype for out in run("amp_multicast", {"num_outputs": "2",
                                                         "cast_narrow": "True"}, single, half)]
    assert dtypes == [np.float16, np.float16]
    assert [out.dtype for out in run("amp_multicast", {"num_outputs": "2"}, ints, half)] == [
        np.int32, np.int32]


def test_constraint_check_raises_its_message() -> None:
    assert run("_npx_constraint_check", {}, np.ones(3, bool))[0] == np.True_
    with pytest.raises(InputError, match="ValueError: scale must be positive"):
        run("_npx_constraint_check", {"msg": "scale must be positive"},
            np.array([True, False]))
