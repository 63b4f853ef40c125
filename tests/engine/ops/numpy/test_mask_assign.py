"""Boolean-mask assignment as graph ops, against NumPy's own ``x[mask] = value``."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import InputError, ShapeError
from tests.engine.ops.helpers import infer, run_op

RNG = np.random.default_rng(5)


def test_scalar_assignment_matches_numpy_from_any_start_axis() -> None:
    data = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    mask = RNG.random((3, 4)) > 0.5
    result = run_op("_npi_boolean_mask_assign_scalar", {"value": "2.5", "start_axis": "1"},
                    [data, mask])
    expected = data.copy()
    expected[:, mask] = 2.5
    np.testing.assert_array_equal(result, expected)


def test_tensor_assignment_gives_each_true_element_its_row() -> None:
    data = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    mask = np.array([[True, False, True], [True, True, False]])
    values = RNG.normal(size=(4, 4)).astype(np.float32)
    result = run_op("_npi_boolean_mask_assign_tensor", {}, [data, mask, values])
    expected = data.copy()
    expected[mask] = values
    np.testing.assert_array_equal(result, expected)


def test_tensor_assignment_broadcasts_one_row_and_one_value() -> None:
    data = RNG.normal(size=(3, 4)).astype(np.float32)
    mask = np.array([1, 0, 1], np.float32)
    row = RNG.normal(size=4).astype(np.float32)
    expected = data.copy()
    expected[mask != 0] = row
    np.testing.assert_array_equal(
        run_op("_npi_boolean_mask_assign_tensor", {}, [data, mask, row]), expected)
    expected[mask != 0] = 7
    np.testing.assert_array_equal(
        run_op("_npi_boolean_mask_assign_tensor", {}, [data, mask, np.array([7], np.float32)]),
        expected)


def test_a_value_count_unlike_the_true_count_is_refused() -> None:
    data = np.zeros((3, 2), np.float32)
    with pytest.raises(InputError, match="2 value rows for 1 true mask elements"):
        run_op("_npi_boolean_mask_assign_tensor", {},
               [data, np.array([True, False, False]), np.ones((2, 2), np.float32)])


def test_masks_that_do_not_fit_the_data_are_refused() -> None:
    with pytest.raises(ShapeError, match=r"mask \(4,\) does not match data \(2, 3\) along "
                                         r"axis 1 \(start_axis 1\)"):
        infer("_npi_boolean_mask_assign_scalar", {"value": "1", "start_axis": "1"},
              [(2, 3), (4,)])
    with pytest.raises(ShapeError, match="a 2-D mask from start_axis 1 does not fit"):
        infer("_npi_boolean_mask_assign_scalar", {"value": "1", "start_axis": "1"},
              [(2, 3), (2, 3)])
    with pytest.raises(ShapeError, match=r"value of shape \(3, 5\) does not match the data's "
                                         r"trailing axes \(4,\)"):
        infer("_npi_boolean_mask_assign_tensor", {}, [(2, 3, 4), (2, 3), (3, 5)])
