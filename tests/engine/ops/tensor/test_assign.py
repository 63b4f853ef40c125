"""_slice_assign, _slice_assign_scalar and _scatter_set_nd as graph ops: a new array with the
region replaced, the input untouched, and shape errors that name the region."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ShapeError
from engine.ops import get_op
from tests.engine.ops.helpers import infer, run_op

RNG = np.random.default_rng(4)


def test_slice_assign_replaces_the_region_and_leaves_lhs_alone() -> None:
    lhs = RNG.normal(size=(4, 5)).astype(np.float32)
    kept = lhs.copy()
    rhs = RNG.normal(size=(2, 2)).astype(np.float32)
    result = run_op("_slice_assign", {"begin": "(1, None)", "end": "(None, 0)",
                                      "step": "(2, -2)"}, [lhs, rhs])
    expected = lhs.copy()
    expected[1::2, :0:-2] = rhs
    np.testing.assert_array_equal(result, expected)
    np.testing.assert_array_equal(lhs, kept)


def test_slice_assign_writes_into_a_given_output() -> None:
    lhs = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = np.full((3, 4), np.nan, np.float32)
    run_op("_slice_assign", {"begin": "(0, 1)", "end": "(1, 3)"},
           [lhs, np.zeros((1, 2), np.float32)], out=out)
    assert out.tolist() == [[0, 0, 0, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_slice_assign_refuses_a_rhs_of_another_shape() -> None:
    with pytest.raises(ShapeError, match=r"_slice_assign rhs \(the region begin=\(0,\), "
                                         r"end=\(2,\).*\(1, 4\) vs \(2, 4\)"):
        infer("_slice_assign", {"begin": "(0,)", "end": "(2,)"}, [(3, 4), (1, 4)])
    assert infer("_slice_assign", {"begin": "(0,)", "end": "(2,)"}, [(3, 4), None]) == (
        [(3, 4), (2, 4)], [(3, 4)])


def test_slice_assign_scalar_truncates_for_integer_data() -> None:
    data = np.arange(6, dtype=np.int32).reshape(2, 3)
    result = run_op("_slice_assign_scalar", {"scalar": "-7.9", "begin": "(None, 1)",
                                             "end": "(None, None)"}, [data])
    assert result.tolist() == [[0, -7, -7], [3, -7, -7]]


@pytest.mark.parametrize("alias", ["_crop_assign", "_npi_slice_assign"])
def test_slice_assign_aliases_resolve_to_it(alias: str) -> None:
    assert get_op(alias) is get_op("_slice_assign")
    assert get_op(alias.replace("assign", "assign_scalar")) is get_op("_slice_assign_scalar")


def test_scatter_set_nd_writes_rhs_at_the_points() -> None:
    lhs = RNG.normal(size=(3, 4)).astype(np.float32)
    indices = np.array([[0, 2], [3, 1]], np.float32)  # points (0, 3) and (2, 1)
    result = run_op("_scatter_set_nd", {"shape": "(3, 4)"},
                    [lhs, np.array([10, 20], np.float32), indices])
    expected = lhs.copy()
    expected[0, 3], expected[2, 1] = 10, 20
    np.testing.assert_array_equal(result, expected)


def test_scatter_set_nd_infers_rhs_and_refuses_deep_indices() -> None:
    assert infer("_scatter_set_nd", {"shape": "(3, 4, 2)"}, [None, None, (1, 5)]) == (
        [(3, 4, 2), (5, 4, 2), (1, 5)], [(3, 4, 2)])
    with pytest.raises(ShapeError, match=r"indices \(4, 2\) must address at most 3 axes"):
        infer("_scatter_set_nd", {"shape": "(3, 4, 2)"}, [None, None, (4, 2)])
