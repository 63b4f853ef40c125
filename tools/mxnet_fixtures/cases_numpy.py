"""Cases for NumPy-mode operators (``_np_*``/``_npi_*``) that numpy-style Gluon exports contain."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from casefile import Case

Rng = Callable[[str], np.random.Generator]


def reduction_cases(rng_for: Rng) -> list[Case]:
    """sum/prod/max/min/all/any with axis, keepdims, initial and dtype."""
    rng = rng_for("np_reductions")
    x = rng.standard_normal((2, 3, 4)).astype("f4")
    flags = (rng.random((2, 3, 4)) > 0.3).astype("f4")
    return [
        Case("np_sum_axis", "_np_sum", {"a": x}, {"axis": "(0, 2)", "keepdims": "True"}),
        Case("np_sum_all", "_np_sum", {"a": x}),
        Case("np_sum_dtype", "_np_sum", {"a": x}, {"axis": "1", "dtype": "float64"}),
        Case("np_prod", "_np_prod", {"a": x}, {"axis": "-1"}),
        Case("np_max", "_np_max", {"a": x}, {"axis": "1"}),
        Case("np_min_keepdims", "_np_min", {"a": x}, {"axis": "(1, 2)", "keepdims": "True"}),
        Case("np_all", "_np_all", {"data": flags}, {"axis": "2"}),
        Case("np_any_all_axes", "_np_any", {"data": flags}),
        Case("np_any_keepdims", "_np_any", {"data": flags * 0}, {"axis": "0",
                                                                  "keepdims": "True"}),
    ]


def layout_cases(rng_for: Rng) -> list[Case]:
    """transpose, squeeze, moveaxis, roll, flip, broadcast_to, concatenate/stacks, tril."""
    rng = rng_for("np_layout")
    x = rng.standard_normal((2, 1, 3, 4)).astype("f4")
    y = rng.standard_normal((2, 3)).astype("f4")
    return [
        Case("np_transpose_default", "_np_transpose", {"a": x}),
        Case("np_transpose_axes", "_np_transpose", {"a": x}, {"axes": "(2, 0, 3, 1)"}),
        Case("np_squeeze_all", "_np_squeeze", {"a": x}),
        Case("np_squeeze_axis", "_np_squeeze", {"a": x}, {"axis": "1"}),
        Case("np_moveaxis", "_np_moveaxis", {"a": x}, {"source": "(0, 3)",
                                                       "destination": "(2, 0)"}),
        Case("np_roll_flat", "_np_roll", {"data": y}, {"shift": "2"}),
        Case("np_roll_axes", "_np_roll", {"data": x}, {"shift": "(1, -2)", "axis": "(2, 3)"}),
        Case("npi_flip", "_npi_flip", {"data": x}, {"axis": "(0, 3)"}),
        Case("npi_broadcast_to", "_npi_broadcast_to", {"array": y[:, :1].copy()},
             {"shape": "(4, 2, 5)"}),
        Case("npi_concatenate", "_npi_concatenate", {"arg0": y, "arg1": y * 2},
             {"num_args": "2", "axis": "0"}),
        Case("npi_hstack", "_npi_hstack", {"arg0": y, "arg1": y[:, :1].copy()},
             {"num_args": "2"}),
        Case("npi_vstack", "_npi_vstack", {"arg0": y, "arg1": y[:1].copy()}, {"num_args": "2"}),
        Case("npi_vstack_1d", "_npi_vstack", {"arg0": y[0].copy(), "arg1": y[1].copy()},
             {"num_args": "2"}),
        Case("npi_tril", "_npi_tril", {"data": x}, {"k": "1"}),
    ]


def elementwise_cases(rng_for: Rng) -> list[Case]:
    """where (and its scalar forms), isnan/isinf..., around, nan_to_num, copysign, arctan2."""
    rng = rng_for("np_elementwise")
    x = (rng.standard_normal((3, 4)) * 3).astype("f4")
    special = x.copy()
    special[0] = [np.nan, np.inf, -np.inf, 1.0]
    condition = (rng.random((3, 4)) > 0.5).astype("f4")
    z = (rng.standard_normal((3, 4)) * 3).astype("f4")
    return [
        Case("npi_where", "_npi_where", {"condition": condition, "x": x, "y": z}),
        Case("npi_where_lscalar", "_npi_where_lscalar", {"condition": condition, "x": x},
             {"scalar": "-7"}),
        Case("npi_where_rscalar", "_npi_where_rscalar", {"condition": condition, "y": z},
             {"scalar": "3.5"}),
        Case("npi_where_scalar2", "_npi_where_scalar2", {"condition": condition},
             {"x": "1", "y": "-1"}),
        *(Case(f"npi_{name}", f"_npi_{name}", {"x": special})
          for name in ("isnan", "isinf", "isfinite", "isposinf", "isneginf")),
        Case("npi_around", "_npi_around", {"x": x}, {"decimals": "1"}),
        Case("npi_nan_to_num", "_npi_nan_to_num", {"data": special},
             {"nan": "-9", "posinf": "100", "neginf": "-100"}),
        Case("npi_nan_to_num_defaults", "_npi_nan_to_num", {"data": special}),
        Case("npi_copysign", "_npi_copysign", {"lhs": x, "rhs": z}),
        Case("npi_copysign_scalar", "_npi_copysign_scalar", {"data": x}, {"scalar": "-1"}),
        Case("npi_rcopysign_scalar", "_npi_rcopysign_scalar", {"data": x}, {"scalar": "2.5"}),
        Case("npi_arctan2", "_npi_arctan2", {"x1": x, "x2": z}),
        Case("npi_arctan2_scalar", "_npi_arctan2_scalar", {"data": x}, {"scalar": "-2"}),
        Case("npi_rarctan2_scalar", "_npi_rarctan2_scalar", {"data": x}, {"scalar": "0.5"}),
    ]


def creation_cases(rng_for: Rng) -> list[Case]:
    """eye (N, M, k) in both spellings and identity."""
    return [
        Case("eye_legacy", "_eye", {}, {"N": "3", "M": "5", "k": "1"}),
        Case("eye_square_int", "_eye", {}, {"N": "4", "dtype": "int32", "k": "-2"}),
        Case("npi_eye", "_npi_eye", {}, {"N": "3", "M": "2"}),
        Case("npi_identity", "_npi_identity", {}, {"shape": "(3, 3)", "dtype": "float64"}),
    ]


def numpy_cases(rng_for: Rng) -> list[Case]:
    """Every case of this module."""
    return (reduction_cases(rng_for) + layout_cases(rng_for) + elementwise_cases(rng_for)
            + creation_cases(rng_for))
