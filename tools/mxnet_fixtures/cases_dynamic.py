"""Cases for operators whose output shape depends on the data: boolean_mask, nonzero, unique,
bincount and delete (tensor indices and the static int/slice forms), and box_nms with ``topk``
-1, whose shape does not.

Edge cases come from MXNet 1.9.1's own behaviour: an all-zero mask or input (an empty result),
a 0-d input to nonzero, float masks and indices, negative or out-of-range tensor indices (which
MXNet's delete skips), every combination of unique's extra outputs, with and without an axis.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from casefile import Case
from cases_detection import nms_records

Rng = Callable[[str], np.random.Generator]


def dynamic_cases(rng_for: Rng) -> list[Case]:
    """Every family of this topic."""
    return [*mask_cases(rng_for), *nonzero_cases(rng_for), *unique_cases(rng_for),
            *bincount_cases(rng_for), *delete_cases(rng_for), *nms_cases(rng_for)]


def nms_cases(rng_for: Rng) -> list[Case]:
    """box_nms with ``topk`` -1 (every box) keeps its input's shape: suppressed rows become -1
    rather than going away, so it needs no staged plan (checked by the engine's tests)."""
    records = nms_records(rng_for("dynamic_nms"), 2, 10, 3)
    return [
        Case("box_nms_topk_all", "_contrib_box_nms", {"data": records},
             {"topk": "-1", "overlap_thresh": "0.3", "valid_thresh": "0.2", "id_index": "0"}),
        Case("box_nms_topk_all_force", "_contrib_box_nms", {"data": records},
             {"topk": "-1", "overlap_thresh": "0.3", "force_suppress": "True",
              "id_index": "0"}),
    ]


def mask_cases(rng_for: Rng) -> list[Case]:
    """boolean_mask under both names, with float, int and bool masks, and an empty result."""
    rng = rng_for("dynamic_mask")
    data = rng.standard_normal((5, 3, 2)).astype("f4")
    ints = rng.integers(-9, 9, (4, 3)).astype("int32")
    return [
        Case("boolean_mask_float", "_contrib_boolean_mask",
             {"data": data, "index": np.array([0.5, 0, 1, 0, -2], "f4")}),
        Case("boolean_mask_bool", "_contrib_boolean_mask",
             {"data": data, "index": np.array([False, True, True, False, True])}),
        Case("boolean_mask_int_data", "_contrib_boolean_mask",
             {"data": ints, "index": np.array([1, 0, 0, 3], "int32")}, {"axis": "0"}),
        Case("boolean_mask_none", "_contrib_boolean_mask",
             {"data": data, "index": np.zeros(5, "f4")}),
        Case("boolean_mask_all", "_contrib_boolean_mask",
             {"data": data[:, 0, 0].copy(), "index": np.ones(5, "f4")}),
        Case("npi_boolean_mask", "_npi_boolean_mask",
             {"data": data, "index": np.array([True, False, True, True, False])}),
    ]


def nonzero_cases(rng_for: Rng) -> list[Case]:
    """nonzero of 1-, 2- and 3-D arrays, bools, all zeros and 0-d inputs."""
    rng = rng_for("dynamic_nonzero")
    sparse = rng.standard_normal((3, 4)).astype("f4") * (rng.random((3, 4)) > 0.5)
    return [
        Case("npx_nonzero_2d", "_npx_nonzero", {"x": sparse}),
        Case("npx_nonzero_3d_int", "_npx_nonzero",
             {"x": rng.integers(0, 2, (2, 3, 2)).astype("int32")}),
        Case("npx_nonzero_bool", "_npx_nonzero", {"x": np.array([True, False, True, True])}),
        Case("npx_nonzero_none", "_npx_nonzero", {"x": np.zeros((2, 3), "f4")}),
        Case("npx_nonzero_scalar", "_npx_nonzero", {"x": np.array(2.5, "f4")}),
        Case("npx_nonzero_scalar_zero", "_npx_nonzero", {"x": np.array(0, "f4")}),
        Case("npi_nonzero", "_npi_nonzero", {"x": sparse}),
    ]


def unique_cases(rng_for: Rng) -> list[Case]:
    """unique flattened and along axes, each extra output alone and all together."""
    rng = rng_for("dynamic_unique")
    values = rng.integers(0, 5, (4, 6)).astype("f4")
    rows = np.array([[1, 2, 0], [0, 5, 1], [1, 2, 0], [0, 5, 0]], "int32")
    every = {"return_index": "True", "return_inverse": "True", "return_counts": "True"}
    return [
        Case("npi_unique", "_npi_unique", {"data": values}),
        Case("npi_unique_index", "_npi_unique", {"data": values}, {"return_index": "True"}),
        Case("npi_unique_inverse", "_npi_unique", {"data": values}, {"return_inverse": "True"}),
        Case("npi_unique_counts", "_npi_unique", {"data": values}, {"return_counts": "True"}),
        Case("npi_unique_every", "_npi_unique", {"data": values}, every),
        Case("npi_unique_axis0", "_npi_unique", {"data": rows}, {**every, "axis": "0"}),
        Case("npi_unique_axis1", "_npi_unique", {"data": rows.T.copy()},
             {"return_inverse": "True", "axis": "1"}),
        Case("npi_unique_axis_neg", "_npi_unique", {"data": rows},
             {"return_counts": "True", "axis": "-1"}),
        Case("npi_unique_scalar", "_npi_unique", {"data": np.array(3.0, "f4")}, every),
        Case("npi_unique_int64", "_npi_unique",
             {"data": rng.integers(-3, 3, (10,)).astype("int64")}, {"return_counts": "True"}),
    ]


def bincount_cases(rng_for: Rng) -> list[Case]:
    """bincount with and without weights, minlength below and above the largest value."""
    rng = rng_for("dynamic_bincount")
    data = rng.integers(0, 6, (12,)).astype("int32")
    weights = rng.standard_normal(12).astype("f4")
    return [
        Case("npi_bincount", "_npi_bincount", {"data": data}),
        Case("npi_bincount_int64_minlength", "_npi_bincount", {"data": data.astype("int64")},
             {"minlength": "9"}),
        Case("npi_bincount_small_minlength", "_npi_bincount", {"data": data},
             {"minlength": "2"}),
        Case("npi_bincount_weights", "_npi_bincount", {"data": data, "weights": weights},
             {"has_weights": "True"}),
        Case("npi_bincount_weights_f16", "_npi_bincount",
             {"data": data.astype("uint8"), "weights": weights.astype("f2")},
             {"has_weights": "True", "minlength": "8"}),
    ]


def delete_cases(rng_for: Rng) -> list[Case]:
    """delete by tensor (int, float, 0-d, skipped indices), by int and by slice, flat or not."""
    rng = rng_for("dynamic_delete")
    arr = rng.standard_normal((3, 5)).astype("f4")
    return [
        Case("npi_delete_tensor_axis1", "_npi_delete",
             {"arr": arr, "obj": np.array([0, 3, 3], "int64")}, {"axis": "1"}),
        Case("npi_delete_tensor_flat", "_npi_delete",
             {"arr": arr, "obj": np.array([0, 7, 14], "int32")}),
        Case("npi_delete_tensor_skipped", "_npi_delete",
             {"arr": arr, "obj": np.array([-1, 1, 9, -7], "int32")}, {"axis": "1"}),
        Case("npi_delete_tensor_float", "_npi_delete",
             {"arr": arr, "obj": np.array([2.0], "f4")}, {"axis": "0"}),
        Case("npi_delete_tensor_scalar", "_npi_delete",
             {"arr": arr, "obj": np.array(1, "int32")}, {"axis": "-2"}),
        Case("npi_delete_tensor_none", "_npi_delete",
             {"arr": arr, "obj": np.array([7], "int32")}, {"axis": "0"}),
        Case("npi_delete_int", "_npi_delete", {"arr": arr}, {"int_ind": "2"}),
        Case("npi_delete_int_negative", "_npi_delete", {"arr": arr},
             {"int_ind": "-1", "axis": "1"}),
        Case("npi_delete_slice", "_npi_delete", {"arr": arr},
             {"start": "1", "stop": "None", "step": "2", "axis": "1"}),
        Case("npi_delete_slice_reversed", "_npi_delete", {"arr": arr},
             {"start": "4", "stop": "0", "step": "-3", "axis": "1"}),
        Case("npi_delete_slice_flat", "_npi_delete", {"arr": arr},
             {"start": "-6", "stop": "40", "step": "4"}),
        Case("npi_delete_slice_empty", "_npi_delete", {"arr": arr},
             {"start": "2", "stop": "2", "step": "1", "axis": "0"}),
    ]
