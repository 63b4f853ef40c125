"""Cases for small contrib utilities and further NumPy-mode operators."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from casefile import Case

Rng = Callable[[str], np.random.Generator]


def contrib_cases(rng_for: Rng) -> list[Case]:
    """index_array, index_copy, allclose, quadratic, batch_take, khatri_rao, index (un)ravel."""
    rng = rng_for("contrib_misc")
    x = rng.standard_normal((2, 3, 4)).astype("f4")
    old = rng.standard_normal((5, 3)).astype("f4")
    return [
        Case("index_array", "_contrib_index_array", {"data": x}),
        Case("index_array_axes", "_contrib_index_array", {"data": x}, {"axes": "(2, 0)"}),
        Case("index_copy", "_contrib_index_copy",
             {"old_tensor": old, "index_vector": np.array([3, 0], "f4"),
              "new_tensor": rng.standard_normal((2, 3)).astype("f4")}),
        Case("allclose_true", "_contrib_allclose", {"a": x, "b": x + 1e-7}),
        Case("allclose_false", "_contrib_allclose", {"a": x, "b": x + 1e-2},
             {"rtol": "1e-3", "atol": "1e-4"}),
        Case("quadratic", "_contrib_quadratic", {"data": x}, {"a": "0.5", "b": "-2", "c": "1"}),
        Case("batch_take", "batch_take", {"a": x[0], "indices": np.array([3, 0, 2], "int32")}),
        Case("khatri_rao", "khatri_rao", {"arg0": x[0, :, :2].copy(), "arg1": x[1, :2, :2].copy()},
             {"num_args": "2"}),
        Case("ravel_multi_index", "_ravel_multi_index",
             {"data": np.array([[1, 0, 2], [3, 1, 0]], "f4")}, {"shape": "(3, 4)"}),
        Case("unravel_index", "_unravel_index", {"data": np.array([7, 0, 11], "f4")},
             {"shape": "(3, 4)"}),
    ]


def numpy_more_cases(rng_for: Rng) -> list[Case]:
    """std/var, diff, rot90, stacks, windows, logspace, indices, bitwise, lcm, ldexp, dots."""
    rng = rng_for("numpy_more")
    x = rng.standard_normal((3, 4)).astype("f4")
    ints = rng.integers(1, 20, (3, 4)).astype("int32")
    other = rng.integers(1, 20, (3, 4)).astype("int32")
    return [
        Case("npi_std", "_npi_std", {"a": x}, {"axis": "1", "ddof": "1"}),
        Case("npi_var_keepdims", "_npi_var", {"a": x}, {"axis": "0", "keepdims": "True"}),
        Case("npi_var_all", "_npi_var", {"a": x}),
        Case("npi_diff", "_npi_diff", {"a": x}, {"n": "2", "axis": "1"}),
        Case("npi_rot90", "_npi_rot90", {"data": x}, {"k": "3", "axes": "(0, 1)"}),
        Case("npi_column_stack", "_npi_column_stack", {"arg0": x[0].copy(), "arg1": x[1].copy()},
             {"num_args": "2"}),
        Case("npi_dstack", "_npi_dstack", {"arg0": x, "arg1": x * 2}, {"num_args": "2"}),
        Case("npi_hanning", "_npi_hanning", {}, {"M": "6"}),
        Case("npi_hamming", "_npi_hamming", {}, {"M": "5"}),
        Case("npi_blackman", "_npi_blackman", {}, {"M": "7"}),
        Case("npi_logspace", "_npi_logspace", {}, {"start": "0", "stop": "2", "num": "5",
                                                   "base": "2"}),
        Case("npi_logspace_open", "_npi_logspace", {}, {"start": "1", "stop": "3", "num": "4",
                                                        "endpoint": "False"}),
        Case("npi_indices", "_npi_indices", {}, {"dimensions": "(2, 3)"}),
        Case("npi_bitwise_and", "_npi_bitwise_and", {"lhs": ints, "rhs": other}),
        Case("npi_bitwise_or", "_npi_bitwise_or", {"lhs": ints, "rhs": other}),
        Case("npi_bitwise_xor", "_npi_bitwise_xor", {"lhs": ints, "rhs": other}),
        Case("npi_bitwise_and_scalar", "_npi_bitwise_and_scalar", {"data": ints}, {"scalar": "6"}),
        Case("npi_bitwise_or_scalar", "_npi_bitwise_or_scalar", {"data": ints}, {"scalar": "6"}),
        Case("npi_bitwise_xor_scalar", "_npi_bitwise_xor_scalar", {"data": ints}, {"scalar": "6"}),
        Case("npi_bitwise_not", "_npi_bitwise_not", {"x": ints}),
        Case("npi_lcm", "_npi_lcm", {"lhs": ints, "rhs": other}),
        Case("npi_lcm_scalar", "_npi_lcm_scalar", {"data": ints}, {"scalar": "4"}),
        Case("npi_ldexp", "_npi_ldexp", {"lhs": x, "rhs": ints.astype("f4") % 4}),
        Case("npi_ldexp_scalar", "_npi_ldexp_scalar", {"data": x}, {"scalar": "3"}),
        Case("npi_rldexp_scalar", "_npi_rldexp_scalar", {"data": np.abs(x).round()},
             {"scalar": "1.5"}),
        Case("npi_tensordot", "_npi_tensordot",
             {"a": rng.standard_normal((2, 3, 4)).astype("f4"),
              "b": rng.standard_normal((4, 3, 5)).astype("f4")},
             {"a_axes_summed": "(1, 2)", "b_axes_summed": "(1, 0)"}),
        Case("npi_tensordot_int", "_npi_tensordot_int_axes",
             {"a": rng.standard_normal((2, 3, 4)).astype("f4"),
              "b": rng.standard_normal((3, 4, 2)).astype("f4")}, {"axes": "2"}),
        Case("npi_einsum", "_npi_einsum", {"arg0": rng.standard_normal((2, 3, 4)).astype("f4"),
                                           "arg1": rng.standard_normal((2, 4, 5)).astype("f4")},
             {"num_args": "2", "subscripts": "bij,bjk->bik"}),
        Case("npi_einsum_trace", "_npi_einsum", {"arg0": rng.standard_normal((3, 3)).astype("f4")},
             {"num_args": "1", "subscripts": "ii"}),
    ]


def misc_cases(rng_for: Rng) -> list[Case]:
    """Every case of this module."""
    return (contrib_cases(rng_for) + numpy_more_cases(rng_for) + image_and_split_cases(rng_for)
            + last_cases(rng_for))


def image_and_split_cases(rng_for: Rng) -> list[Case]:
    """Deterministic image transforms (HWC), diagonals, splits, Cholesky/solve, scatter_nd."""
    rng = rng_for("image_split")
    image = rng.integers(0, 256, (5, 6, 3)).astype("uint8")
    batch = rng.integers(0, 256, (2, 5, 6, 3)).astype("uint8")
    chw = rng.random((3, 5, 6)).astype("f4")
    x = rng.standard_normal((4, 6)).astype("f4")
    cube = rng.standard_normal((2, 3, 4)).astype("f4")
    spd = rng.standard_normal((3, 3)).astype("f4")
    spd = (spd @ spd.T + 3 * np.eye(3)).astype("f4")
    tol = {"rtol": 1e-4, "atol": 1e-4}
    return [
        Case("image_to_tensor", "_image_to_tensor", {"data": image}),
        Case("image_to_tensor_batch", "_image_to_tensor", {"data": batch}),
        Case("image_normalize", "_image_normalize", {"data": chw},
             {"mean": "(0.5, 0.4, 0.3)", "std": "(0.2, 0.25, 0.3)"}),
        Case("image_flip_left_right", "_image_flip_left_right", {"data": image}),
        # Even height: MXNet 1.9.1 zeroes the middle row of odd-height images (a bug).
        Case("image_flip_top_bottom", "_image_flip_top_bottom", {"data": image[:4].copy()}),
        Case("image_crop", "_image_crop", {"data": image},
             {"x": "1", "y": "2", "width": "4", "height": "3"}),
        Case("image_adjust_lighting", "_image_adjust_lighting",
             {"data": image.astype("f4")}, {"alpha": "(0.02, -0.01, 0.03)"}, tolerance=tol),
        Case("np_diagonal", "_np_diagonal", {"data": cube}, {"offset": "1", "axis1": "1",
                                                             "axis2": "2"}),
        Case("np_trace", "_np_trace", {"data": cube}, {"offset": "-1", "axis1": "2",
                                                       "axis2": "1"}),
        Case("np_diagflat", "_np_diagflat", {"data": x[:2, :2].copy()}, {"k": "1"}),
        Case("split_v2_indices", "_split_v2", {"data": x}, {"indices": "(0, 2, 3)",
                                                            "axis": "1"}),
        Case("split_v2_sections", "_split_v2", {"data": x},
             {"indices": "()", "sections": "2", "axis": "0", "squeeze_axis": "False"}),
        Case("npi_hsplit", "_npi_hsplit", {"data": x}, {"indices": "()", "sections": "3"}),
        Case("npi_dsplit", "_npi_dsplit", {"data": cube},
             {"indices": "(0, 1)", "axis": "2"}),
        Case("npi_cholesky", "_npi_cholesky", {"A": spd}, tolerance=tol),
        Case("npi_solve", "_npi_solve", {"A": spd, "B": x[:3, :2].copy()}, tolerance=tol),
        Case("linalg_extracttrian", "_linalg_extracttrian", {"A": cube[:, :3, :3].copy()},
             {"offset": "1", "lower": "False"}),
        Case("linalg_maketrian", "_linalg_maketrian", {"A": x[:2].copy()}, {"offset": "-1"}),
        Case("scatter_nd", "scatter_nd", {"data": np.array([2.0, 3.0, 4.0], "f4"),
                                          "indices": np.array([[0, 1, 1], [2, 0, 3]], "f4")},
             {"shape": "(2, 4)"}),
    ]


def last_cases(rng_for: Rng) -> list[Case]:
    """np.split, atleast_nd, polyval and FlowNet's Correlation."""
    rng = rng_for("last_batch")
    x = rng.standard_normal((4, 6)).astype("f4")
    first = rng.standard_normal((1, 3, 7, 8)).astype("f4")
    second = rng.standard_normal((1, 3, 7, 8)).astype("f4")
    return [
        Case("npi_split", "_npi_split", {"data": x}, {"indices": "(0, 1, 3)", "axis": "0"}),
        Case("np_atleast_1d", "_np_atleast_1d", {"arg0": x[0, 0:1].reshape(()).copy(),
                                                 "arg1": x}, {"num_args": "2"}),
        Case("np_atleast_2d", "_np_atleast_2d", {"arg0": x[0].copy()}, {"num_args": "1"}),
        Case("np_atleast_3d", "_np_atleast_3d", {"arg0": x[0].copy(), "arg1": x},
             {"num_args": "2"}),
        Case("npi_polyval", "_npi_polyval", {"p": np.array([2.0, -1.0, 0.5], "f4"), "x": x}),
        Case("correlation", "Correlation", {"data1": first, "data2": second},
             {"kernel_size": "1", "max_displacement": "2", "pad_size": "2"}),
        Case("correlation_kernel3_strides", "Correlation", {"data1": first, "data2": second},
             {"kernel_size": "3", "max_displacement": "2", "stride1": "2", "stride2": "2",
              "pad_size": "3", "is_multiply": "False"}),
    ]
