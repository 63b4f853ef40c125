"""Cases for the assignment ops (NDArray item assignment, or graph nodes built with the ops):
_slice_assign and _slice_assign_scalar (and their _crop_assign / _npi_ names), _scatter_set_nd
and NumPy-mode boolean-mask assignment.

Written on their own with ``generate_ops.py --only assign`` (``ops_assign/``). MXNet runs
_scatter_set_nd and _npi_boolean_mask_assign_* only in place and refuses a graph variable as the
array written, so those cases run with their data copied first (``Case.in_place``); the recorded
symbol is still the one-node graph. Scatter indices have no duplicates: MXNet leaves which value
wins unspecified.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from casefile import Case

Rng = Callable[[str], np.random.Generator]


def assign_cases(rng_for: Rng) -> list[Case]:
    """Every family of this topic."""
    return [*slice_assign_cases(rng_for), *scatter_set_cases(rng_for),
            *mask_assign_cases(rng_for)]


def slice_assign_cases(rng_for: Rng) -> list[Case]:
    """Regions with steps, negative steps and None bounds, partial axes, int data, aliases."""
    rng = rng_for("assign_slice")
    data = rng.standard_normal((3, 4, 5)).astype("f4")
    ints = rng.integers(-9, 9, (4, 6)).astype("int32")
    region = {"begin": "(0, 1, 0)", "end": "(3, 4, 5)", "step": "(2, 1, 2)"}
    return [
        Case("slice_assign_step", "_slice_assign",
             {"lhs": data, "rhs": rng.standard_normal((2, 3, 3)).astype("f4")}, region),
        Case("slice_assign_negative_step", "_slice_assign",
             {"lhs": data, "rhs": rng.standard_normal((2, 4, 2)).astype("f4")},
             {"begin": "(1, None, None)", "end": "(None, None, 0)", "step": "(None, 1, -3)"}),
        Case("slice_assign_first_axis", "_slice_assign",
             {"lhs": data, "rhs": rng.standard_normal((1, 4, 5)).astype("f4")},
             {"begin": "(-1,)", "end": "(None,)"}),
        Case("slice_assign_int32", "_slice_assign",
             {"lhs": ints, "rhs": rng.integers(50, 60, (2, 3)).astype("int32")},
             {"begin": "(1, 0)", "end": "(3, 6)", "step": "(1, 2)"}),
        Case("crop_assign", "_crop_assign",
             {"lhs": data, "rhs": rng.standard_normal((3, 2, 5)).astype("f4")},
             {"begin": "(0, 2)", "end": "(3, 4)"}),
        Case("npi_slice_assign", "_npi_slice_assign",
             {"lhs": data, "rhs": rng.standard_normal((3, 4, 1)).astype("f4")},
             {"begin": "(None, None, 4)", "end": "(None, None, 5)"}),
        Case("slice_assign_scalar", "_slice_assign_scalar", {"data": data},
             {"scalar": "-2.5", **region}),
        Case("slice_assign_scalar_default", "_slice_assign_scalar", {"data": data},
             {"begin": "(1,)", "end": "(2,)"}),
        Case("slice_assign_scalar_int32", "_slice_assign_scalar", {"data": ints},
             {"scalar": "7.9", "begin": "(None, -2)", "end": "(None, None)"}),
        Case("crop_assign_scalar", "_crop_assign_scalar", {"data": data},
             {"scalar": "4", "begin": "(0, 0, 1)", "end": "(2, 2, 3)"}),
        Case("npi_slice_assign_scalar", "_npi_slice_assign_scalar", {"data": data},
             {"scalar": "1.5", "begin": "(2, None)", "end": "(0, None)", "step": "(-1, -2)"}),
    ]


def scatter_set_cases(rng_for: Rng) -> list[Case]:
    """Points (indices over every axis) and rows (over the first), float and int indices."""
    rng = rng_for("assign_scatter_set")
    data = rng.standard_normal((3, 4, 2)).astype("f4")
    points = np.array([[0, 2, 1, 2], [1, 3, 0, 0], [1, 0, 1, 0]], "f4")
    return [
        Case("scatter_set_nd_points", "_scatter_set_nd",
             {"lhs": data, "rhs": rng.standard_normal(4).astype("f4"), "indices": points},
             {"shape": "(3, 4, 2)"}, in_place=True),
        Case("scatter_set_nd_rows", "_scatter_set_nd",
             {"lhs": data, "rhs": rng.standard_normal((2, 4, 2)).astype("f4"),
              "indices": np.array([[2, 0]], "int32")},
             {"shape": "(3, 4, 2)"}, in_place=True),
        Case("npi_scatter_set_nd", "_npi_scatter_set_nd",
             {"lhs": data[:, :, 0].copy(), "rhs": rng.standard_normal((2, 3)).astype("f4"),
              "indices": np.array([[[0, 1, 2], [2, 2, 2]], [[3, 0, 1], [0, 3, 2]]], "int64")},
             {"shape": "(3, 4)"}, in_place=True),
    ]


def mask_assign_cases(rng_for: Rng) -> list[Case]:
    """Scalar and tensor values, masks from axis 0, 1 and 2, bool, float and int masks."""
    rng = rng_for("assign_mask")
    data = rng.standard_normal((2, 3, 4)).astype("f4")
    mask = np.array([[True, False, True], [False, False, True]])
    mask_axis1 = np.array([[1, 0, 1, 1], [0, 1, 0, 0], [1, 1, 0, 1]], "f4")
    return [
        Case("npi_boolean_mask_assign_scalar", "_npi_boolean_mask_assign_scalar",
             {"data": data, "mask": mask}, {"value": "-1.5"}, in_place=True),
        Case("npi_boolean_mask_assign_scalar_axis2", "_npi_boolean_mask_assign_scalar",
             {"data": data, "mask": np.array([1, 0, 0, 1], "f4")},
             {"value": "3", "start_axis": "2"}, in_place=True),
        Case("npi_boolean_mask_assign_scalar_int32", "_npi_boolean_mask_assign_scalar",
             {"data": rng.integers(-9, 9, (3, 4)).astype("int32"),
              "mask": np.array([0, 2, 1], "int32")},
             {"value": "2.7", "start_axis": "0"}, in_place=True),
        Case("npi_boolean_mask_assign_tensor_rows", "_npi_boolean_mask_assign_tensor",
             {"data": data, "mask": mask, "value": rng.standard_normal((3, 4)).astype("f4")},
             {"start_axis": "0"}, in_place=True),
        Case("npi_boolean_mask_assign_tensor_broadcast", "_npi_boolean_mask_assign_tensor",
             {"data": data, "mask": mask, "value": rng.standard_normal(4).astype("f4")},
             {"start_axis": "0"}, in_place=True),
        Case("npi_boolean_mask_assign_tensor_one", "_npi_boolean_mask_assign_tensor",
             {"data": data, "mask": mask, "value": np.array([9.0], "f4")},
             {"start_axis": "0"}, in_place=True),
        Case("npi_boolean_mask_assign_tensor_axis1", "_npi_boolean_mask_assign_tensor",
             {"data": data.reshape(2, 3, 4), "mask": mask_axis1,
              "value": rng.standard_normal((2, 7)).astype("f4")},
             {"start_axis": "1"}, in_place=True),
        Case("npi_boolean_mask_assign_tensor_axis1_column", "_npi_boolean_mask_assign_tensor",
             {"data": data, "mask": mask_axis1, "value": np.array([[5.0], [6.0]], "f4")},
             {"start_axis": "1"}, in_place=True),
        Case("npi_boolean_mask_assign_tensor_empty", "_npi_boolean_mask_assign_tensor",
             {"data": data, "mask": np.zeros((2, 3), bool),
              "value": rng.standard_normal(4).astype("f4")},
             {"start_axis": "0"}, in_place=True),
    ]
