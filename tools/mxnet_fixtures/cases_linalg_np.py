"""Cases for factorisations (``gelqf``, ``syevd``, NumPy-mode ``eig``/``svd``/``pinv``...) and
NumPy-mode array utilities (``norm``, ``average``, ``ediff1d``, ``histogram``, ``insert``,
``linspace``, ``pad``, ``percentile``, ``powerd``).

Matrices are drawn well conditioned (a random matrix plus a multiple of the identity, or
symmetric ones with separated eigenvalues), so the factors are unique up to the sign MXNet fixes
itself. ``powerd`` samples with MXNet's own generator: its values are unspecified.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from casefile import Case

Rng = Callable[[str], np.random.Generator]


def _symmetric(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Symmetric matrices with well separated eigenvalues."""
    base = rng.standard_normal(shape)
    spread = np.diag(np.arange(shape[-1], dtype=np.float64) * 2.0)
    return ((base + np.swapaxes(base, -1, -2)) / 2 + spread).astype(dtype)


def _real_spectrum(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Non-symmetric matrices with real, distinct eigenvalues (a similarity of a diagonal)."""
    size = shape[-1]
    basis = rng.standard_normal(shape) + 3 * np.eye(size)
    values = np.arange(1, size + 1, dtype=np.float64) * np.where(np.arange(size) % 2, -1.0, 1.0)
    return (basis * values[..., None, :] @ np.linalg.inv(basis)).astype("f4")


def factorisation_cases(rng_for: Rng) -> list[Case]:
    """gelqf (both names), syevd, eig/eigh/eigvals/eigvalsh and svd."""
    rng = rng_for("linalg_np_factorisations")
    wide = rng.standard_normal((2, 3, 5)).astype("f4")
    square = _symmetric(rng, (2, 4, 4), "f4")
    general = _real_spectrum(rng, (2, 3, 3))
    return [
        Case("linalg_gelqf", "_linalg_gelqf", {"A": wide}),
        Case("linalg_gelqf_square", "_linalg_gelqf",
             {"A": (rng.standard_normal((3, 3)) + 2 * np.eye(3)).astype("f4")}),
        Case("linalg_gelqf_alias", "linalg_gelqf", {"A": wide[0].copy()}),
        Case("linalg_syevd", "_linalg_syevd", {"A": square}),
        Case("linalg_syevd_single", "_linalg_syevd", {"A": _symmetric(rng, (3, 3), "f4")}),
        Case("npi_eig", "_npi_eig", {"A": general}),
        Case("npi_eigvals", "_npi_eigvals", {"A": general[0].copy()}),
        Case("npi_eigh_lower", "_npi_eigh", {"A": square}),
        Case("npi_eigh_upper", "_npi_eigh", {"A": np.triu(square)}, {"UPLO": "U"}),
        Case("npi_eigh_lower_reads_lower", "_npi_eigh", {"A": np.tril(square[1])}),
        Case("npi_eigvalsh", "_npi_eigvalsh", {"A": square}),
        Case("npi_eigvalsh_upper", "_npi_eigvalsh", {"A": np.triu(square)}, {"UPLO": "U"}),
        Case("npi_svd", "_npi_svd", {"A": wide}),
        Case("npi_svd_square", "_npi_svd", {"A": rng.standard_normal((4, 4)).astype("f4")}),
    ]


def inverse_cases(rng_for: Rng) -> list[Case]:
    """pinv (tensor and scalar rcond), tensorinv and tensorsolve."""
    rng = rng_for("linalg_np_inverses")
    tall = rng.standard_normal((2, 4, 3)).astype("f4")
    deficient = np.array([[1, 2, 3], [2, 4, 6.0000001], [1, 0, 1]], "f4")
    square = (rng.standard_normal((6, 6)) + 3 * np.eye(6)).astype("f4")
    system = (rng.standard_normal((6, 6)) + 3 * np.eye(6)).astype("f4")
    return [
        Case("npi_pinv", "_npi_pinv", {"A": tall, "rcond": np.array([1e-5, 0.5], "f4")}),
        Case("npi_pinv_wide_hermitian_flag", "_npi_pinv",
             {"A": np.swapaxes(tall, 1, 2).copy(), "rcond": np.array(1e-15, "f4")},
             {"hermitian": "False"}),
        Case("npi_pinv_scalar_rcond", "_npi_pinv_scalar_rcond", {"A": tall}),
        Case("npi_pinv_scalar_rcond_cut", "_npi_pinv_scalar_rcond", {"A": deficient},
             {"rcond": "0.01"}),
        Case("npi_tensorinv", "_npi_tensorinv", {"a": square.reshape(2, 3, 6)}, {"ind": "2"}),
        Case("npi_tensorinv_default", "_npi_tensorinv", {"a": square.reshape(2, 3, 3, 2)}),
        Case("npi_tensorsolve", "_npi_tensorsolve",
             {"a": system.reshape(2, 3, 2, 3), "b": rng.standard_normal((2, 3)).astype("f4")}),
        Case("npi_tensorsolve_axes", "_npi_tensorsolve",
             {"a": system.reshape(2, 3, 3, 2), "b": rng.standard_normal((2, 3)).astype("f4")},
             {"a_axes": "(2,)"}),
    ]


def norm_cases(rng_for: Rng) -> list[Case]:
    """norm: flattened, vector p-norms, Frobenius, nuclear, spectral and row/column sums."""
    rng = rng_for("linalg_np_norm")
    x = rng.standard_normal((2, 3, 4)).astype("f4")
    vector = rng.standard_normal(5).astype("f4")
    flat = {"ord": "2", "axis": "None", "keepdims": "False", "flag": "-2"}
    return [
        Case("npi_norm_flat", "_npi_norm", {"data": x}, flat),
        Case("npi_norm_flat_keepdims", "_npi_norm", {"data": x}, {**flat, "keepdims": "True"}),
        Case("npi_norm_vector_default", "_npi_norm", {"data": vector}),
        Case("npi_norm_vector_axis_l1", "_npi_norm", {"data": x},
             {"ord": "1", "axis": "(1,)", "flag": "-1"}),
        Case("npi_norm_vector_l3_keepdims", "_npi_norm", {"data": x},
             {"ord": "3", "axis": "(-1,)", "keepdims": "True", "flag": "-1"}),
        Case("npi_norm_vector_l0", "_npi_norm", {"data": np.round(x)},
             {"ord": "0", "axis": "(2,)", "flag": "-1"}),
        Case("npi_norm_vector_negative", "_npi_norm", {"data": x},
             {"ord": "-2", "axis": "(0,)", "flag": "-1"}),
        Case("npi_norm_fro", "_npi_norm", {"data": x}, {"ord": "2", "axis": "(1, 2)",
                                                        "flag": "1"}),
        Case("npi_norm_fro_default_axes", "_npi_norm", {"data": x}, {"flag": "1"}),
        Case("npi_norm_nuc", "_npi_norm", {"data": x}, {"ord": "2", "axis": "(1, 2)",
                                                        "flag": "2"}),
        Case("npi_norm_spectral", "_npi_norm", {"data": x}, {"ord": "2", "axis": "(0, 2)",
                                                             "flag": "0"}),
        Case("npi_norm_spectral_min_keepdims", "_npi_norm", {"data": x},
             {"ord": "-2", "axis": "(1, 2)", "keepdims": "True", "flag": "0"}),
        Case("npi_norm_matrix_l1", "_npi_norm", {"data": x}, {"ord": "1", "axis": "(1, 2)",
                                                              "flag": "-1"}),
        Case("npi_norm_matrix_l_minus1", "_npi_norm", {"data": x},
             {"ord": "-1", "axis": "(2, 0)", "keepdims": "True", "flag": "-1"}),
    ]


def statistics_cases(rng_for: Rng) -> list[Case]:
    """average (weighted, 1-D weights, returned), percentile (interpolations, q scalar)."""
    rng = rng_for("linalg_np_statistics")
    x = rng.standard_normal((3, 4, 5)).astype("f4")
    weights = rng.random((3, 4, 5)).astype("f4")
    q = np.array([0, 12.5, 50, 90, 100], "f4")
    return [
        Case("npi_average_weighted_all", "_npi_average", {"a": x, "weights": weights}),
        Case("npi_average_axis_returned", "_npi_average", {"a": x, "weights": weights},
             {"axis": "(0, 2)", "returned": "True"}),
        Case("npi_average_1d_weights", "_npi_average", {"a": x, "weights": weights[0, :, 0].copy()},
             {"axis": "1", "returned": "True"}),
        Case("npi_average_unweighted", "_npi_average", {"a": x},
             {"axis": "2", "weighted": "False", "returned": "True"}),
        Case("npi_average_unweighted_all", "_npi_average", {"a": x}, {"weighted": "False"}),
        *(Case(f"npi_percentile_{mode}", "_npi_percentile", {"a": x, "q": q},
               {"axis": "1", "interpolation": mode})
          for mode in ("linear", "lower", "higher", "midpoint", "nearest")),
        Case("npi_percentile_all_axes", "_npi_percentile", {"a": x, "q": q[1:3].copy()}),
        Case("npi_percentile_keepdims", "_npi_percentile", {"a": x, "q": q},
             {"axis": "(0, 2)", "keepdims": "True"}),
        Case("npi_percentile_q_scalar", "_npi_percentile", {"a": x},
             {"axis": "2", "q_scalar": "37.5"}),
        Case("npi_percentile_q_scalar_nearest", "_npi_percentile", {"a": x},
             {"q_scalar": "62.5", "interpolation": "nearest"}),
        Case("npi_percentile_one_q", "_npi_percentile",
             {"a": x, "q": np.array([25.0], "f4")}, {"axis": "0"}),
        Case("npi_percentile_ints", "_npi_percentile",
             {"a": rng.integers(-9, 9, (4, 6)).astype("int32"), "q": q}, {"axis": "1"}),
    ]


def sequence_cases(rng_for: Rng) -> list[Case]:
    """diag_indices_from, ediff1d (arrays and scalars at either end), linspace, histogram."""
    rng = rng_for("linalg_np_sequences")
    x = rng.standard_normal((3, 4)).astype("f4")
    begin = np.array([-1, -2], "f4")
    end = np.array([7], "f4")
    data = rng.standard_normal((4, 6)).astype("f4")
    data[0, :3] = [-1.0, 1.0, 0.5]  # on the edges: the last bin is closed
    return [
        Case("npi_diag_indices_from", "_npi_diag_indices_from", {"data": np.zeros((3, 3), "f4")}),
        Case("npi_diag_indices_from_3d", "_npi_diag_indices_from",
             {"data": np.zeros((2, 2, 2), "int32")}),
        Case("npi_ediff1d", "_npi_ediff1d", {"input1": x}),
        Case("npi_ediff1d_arrays", "_npi_ediff1d", {"input1": x[0].copy(), "input2": begin,
                                                    "input3": end},
             {"to_begin_arr_given": "True", "to_end_arr_given": "True"}),
        Case("npi_ediff1d_scalars", "_npi_ediff1d", {"input1": x[1].copy()},
             {"to_begin_scalar": "5", "to_end_scalar": "-0.5"}),
        Case("npi_ediff1d_end_array_begin_scalar", "_npi_ediff1d",
             {"input1": x[2].copy(), "input2": end},
             {"to_end_arr_given": "True", "to_begin_scalar": "3"}),
        Case("npi_ediff1d_begin_array", "_npi_ediff1d", {"input1": x[2].copy(), "input2": begin},
             {"to_begin_arr_given": "True"}),
        Case("linspace", "_linspace", {}, {"start": "0", "stop": "1", "num": "5"}),
        Case("linspace_open_f64", "_linspace", {}, {"start": "-2", "stop": "3", "num": "7",
                                                    "endpoint": "False", "dtype": "float64"}),
        Case("linspace_int", "_linspace", {}, {"start": "-3", "stop": "8", "num": "4",
                                               "dtype": "int32"}),
        Case("linspace_one", "_linspace", {}, {"start": "2.5", "stop": "9", "num": "1"}),
        Case("npi_linspace", "_npi_linspace", {}, {"start": "1", "stop": "-1", "num": "6"}),
        Case("histogram_bins", "_histogram",
             {"data": data, "bins": np.array([-1, -0.25, 0, 0.5, 1], "f4")}),
        Case("histogram_count", "_histogram", {"data": data},
             {"bin_cnt": "5", "range": "(-1, 1)"}),
        Case("histogram_count_wide", "_histogram", {"data": data},
             {"bin_cnt": "3", "range": "(-3.0, 3.0)"}),
        Case("npi_histogram", "_npi_histogram", {"data": data},
             {"bin_cnt": "4", "range": "(-2, 0)"}),
    ]


def insert_cases(rng_for: Rng) -> list[Case]:
    """insert with a scalar index, a slice or an index tensor; values as arrays or val."""
    rng = rng_for("linalg_np_insert")
    arr = rng.standard_normal((3, 4)).astype("f4")
    row = rng.standard_normal(4).astype("f4")
    column = rng.standard_normal((3, 1)).astype("f4")
    return [
        Case("npi_insert_scalar_val", "_npi_insert_scalar", {"arr": arr[0].copy()},
             {"val": "9", "int_ind": "1", "axis": "0"}),
        Case("npi_insert_scalar_flat", "_npi_insert_scalar", {"arr": arr},
             {"val": "-1", "int_ind": "-2"}),
        Case("npi_insert_scalar_values", "_npi_insert_scalar", {"arr": arr, "values": row},
             {"int_ind": "3", "axis": "0"}),
        Case("npi_insert_scalar_moved", "_npi_insert_scalar",
             {"arr": arr, "values": rng.standard_normal((2, 3)).astype("f4")},
             {"int_ind": "4", "axis": "1"}),
        Case("npi_insert_slice_broadcast", "_npi_insert_slice",
             {"arr": arr, "values": np.array([5], "f4")},
             {"start": "0", "stop": "4", "step": "2", "axis": "1"}),
        Case("npi_insert_slice_values", "_npi_insert_slice", {"arr": arr, "values": column},
             {"start": "1", "stop": "None", "step": "1", "axis": "1"}),
        Case("npi_insert_slice_negative_step", "_npi_insert_slice",
             {"arr": arr, "values": rng.standard_normal(6).astype("f4")},
             {"start": "None", "stop": "None", "step": "-2"}),
        Case("npi_insert_tensor", "_npi_insert_tensor",
             {"arr": arr, "values": column, "obj": np.array([3, 0, -1], "int64")},
             {"axis": "1"}),
        Case("npi_insert_tensor_repeated", "_npi_insert_tensor",
             {"arr": arr, "values": np.array([7], "f4"), "obj": np.array([2, 2, 0], "int64")},
             {"axis": "0"}),
        Case("npi_insert_tensor_single", "_npi_insert_tensor",
             {"arr": arr, "values": rng.standard_normal((3, 2)).astype("f4"),
              "obj": np.array([1], "int64")}, {"axis": "1"}),
        Case("npi_insert_tensor_flat", "_npi_insert_tensor",
             {"arr": arr, "values": row[:2].copy(), "obj": np.array([5, 12], "int64")}),
    ]


def pad_cases(rng_for: Rng) -> list[Case]:
    """pad in every mode MXNet has."""
    rng = rng_for("linalg_np_pad")
    x = rng.standard_normal((2, 3, 4)).astype("f4")
    width = "((0, 1), (2, 1), (1, 3))"
    cases = [Case("npi_pad_constant", "_npi_pad", {"data": x},
                  {"pad_width": width, "constant_value": "1.5"}),
             Case("npi_pad_default", "_npi_pad", {"data": x[0].copy()},
                  {"pad_width": "((1, 1), (0, 2))"})]
    cases += [Case(f"npi_pad_{mode}", "_npi_pad", {"data": x},
                   {"pad_width": width if mode in ("edge", "maximum", "minimum")
                    else "((1, 1), (2, 1), (1, 3))", "mode": mode})
              for mode in ("edge", "reflect", "symmetric", "maximum", "minimum")]
    return cases


def sampling_cases(rng_for: Rng) -> list[Case]:
    """powerd: shapes and dtype only (MXNet's own random numbers)."""
    rng = rng_for("linalg_np_sampling")
    a = (rng.random((2, 3)) + 0.5).astype("f4")
    # The form without inputs (a as an attribute) is left out: a graph folds it into one
    # constant sample at load, so it cannot be compared as a per-run sampler.
    return [
        Case("npi_powerd_tensor", "_npi_powerd", {"input1": a}, unspecified=(0,)),
        Case("npi_powerd_tensor_size", "_npi_powerd", {"input1": a}, {"size": "(4, 2, 3)"},
             unspecified=(0,)),
    ]


def linalg_np_cases(rng_for: Rng) -> list[Case]:
    """Every case of this module."""
    return (factorisation_cases(rng_for) + inverse_cases(rng_for) + norm_cases(rng_for)
            + statistics_cases(rng_for) + sequence_cases(rng_for) + insert_cases(rng_for)
            + pad_cases(rng_for) + sampling_cases(rng_for))
