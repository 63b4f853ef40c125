"""Reshape codes, partial shapes, and views sharing storage (other shape ops copy)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ModelFormatError, ShapeError
from engine.ops import get_op
from tests.engine.ops.helpers import infer, run

RNG = np.random.default_rng(7)


def reshaped(shape: tuple[int, ...], spec: str, reverse: bool = False) -> tuple[int, ...]:
    raw = {"shape": spec, "reverse": str(reverse)}
    _, (out,) = infer("Reshape", raw, [shape])
    data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    (result,) = run("Reshape", raw, data)
    assert result.shape == out
    np.testing.assert_array_equal(result.reshape(-1), data.reshape(-1))
    return out


@pytest.mark.parametrize(("shape", "spec", "expected"), [
    ((2, 3, 4), "(4, 0, 2)", (4, 3, 2)),             # 0 copies the matching input dim
    ((2, 3, 4), "(2, 0, 0)", (2, 3, 4)),
    ((2, 3, 4), "(6, 1, -1)", (6, 1, 4)),            # -1 is inferred
    ((2, 3, 4), "(3, -1, 8)", (3, 1, 8)),
    ((2, 3, 4), "(-1,)", (24,)),
    ((2, 3, 4), "(-2,)", (2, 3, 4)),                  # -2 copies the rest
    ((2, 3, 4), "(2, -2)", (2, 3, 4)),
    ((2, 3, 4), "(-2, 1, 1)", (2, 3, 4, 1, 1)),
    ((2, 3, 4), "(-3, 4)", (6, 4)),                   # -3 merges two dims
    ((2, 3, 4, 5), "(-3, -3)", (6, 20)),
    ((2, 3, 4), "(0, -3)", (2, 12)),
    ((2, 3, 4), "(-4, 1, 2, -2)", (1, 2, 3, 4)),      # -4 splits one dim into two
    ((2, 3, 4), "(2, -4, -1, 3, -2)", (2, 1, 3, 4)),
    ((2, 12), "(0, -4, 3, -1)", (2, 3, 4)),
])
def test_reshape_codes(shape: tuple[int, ...], spec: str, expected: tuple[int, ...]) -> None:
    assert reshaped(shape, spec) == expected


def test_reshape_reverse_matches_from_the_right() -> None:
    assert reshaped((10, 5, 4), "(-1, 0)", reverse=True) == (50, 4)
    assert reshaped((10, 5, 4), "(-1, 0)") == (40, 5)
    assert reshaped((2, 3, 4, 5), "(0, 0, -1)", reverse=True) == (3, 4, 10)
    # A -4 split keeps its two values in written order when matched from the right.
    assert reshaped((3, 8), "(0, -4, 2, 4)", reverse=True) == (3, 2, 4)


def test_reshape_legacy_target_shape_and_keep_highest() -> None:
    _, (out,) = infer("Reshape", {"target_shape": "(0, 6)"}, [(2, 3, 4)])
    assert out == (4, 6)
    _, (out,) = infer("Reshape", {"target_shape": "(9, 0)", "keep_highest": "True"}, [(2, 3, 4)])
    assert out == (2, 12)


def test_reshape_errors_name_the_problem() -> None:
    with pytest.raises(ShapeError, match="only one"):
        infer("Reshape", {"shape": "(-1, -1)"}, [(2, 3)])
    with pytest.raises(ShapeError, match="6 elements"):
        infer("Reshape", {"shape": "(4, 2)"}, [(2, 3)])
    with pytest.raises(ShapeError, match="past the 2 input dimensions"):
        infer("Reshape", {"shape": "(0, 0, 0)"}, [(2, 3)])
    with pytest.raises(ShapeError, match="-4"):
        infer("Reshape", {"shape": "(-4, 2)"}, [(2, 3)])
    with pytest.raises(ModelFormatError, match="unknown attribute 'shapes'"):
        get_op("Reshape").parse_attrs({"shapes": "(1,)"})


def test_reshape_with_unknown_dims_keeps_them_unknown() -> None:
    assert infer("Reshape", {"shape": "(0, -1)"}, [(0, 3, 4)])[1] == [(0, 12)]
    assert infer("Reshape", {"shape": "(-1, 12)"}, [(0, 3, 4)])[1] == [(0, 12)]
    assert infer("Reshape", {"shape": "(-3, 0)"}, [(0, 3, 4)])[1] == [(0, 4)]
    assert infer("Reshape", {"shape": "(-3, -1)"}, [(0, 3, 4)])[1] == [(0, 0)]
    assert infer("Reshape", {"shape": "(0, 0, -1)"}, [(0, 3, 0, 2)])[1] == [(0, 3, 0)]
    assert infer("Reshape", {"shape": "(-1, 0, 0)"}, [(4, 0, 3)])[1] == [(4, 0, 3)]
    assert infer("Reshape", {"shape": "(-1, 0)", "reverse": "True"}, [(3, 4, 0)])[1] == [(12, 0)]
    assert infer("Reshape", {"shape": "(2, 3)"}, [None])[1] == [None]
    assert infer("_np_reshape", {"newshape": "(-1, 512)"}, [(0, 512)])[1] == [(0, 512)]


def test_np_and_npx_reshape() -> None:
    data = RNG.normal(size=(2, 3, 1, 4)).astype(np.float32)
    (out,) = run("_np_reshape", {"newshape": "(-1, 4)"}, data)
    assert out.shape == (6, 4)
    cases = {"(-2, -1)": (2, 12), "(-2, -2, -3, -2)": (2, 3, 4), "(-5, -4)": (6, 1, 4),
             "(-6, 1, -1, -4)": (1, 2, 3, 1, 4), "(-1, -2)": (8, 3)}
    for spec, expected in cases.items():
        assert infer("_npx_reshape", {"newshape": spec}, [data.shape])[1] == [expected], spec
        (out,) = run("_npx_reshape", {"newshape": spec}, data)
        np.testing.assert_array_equal(out, data.reshape(expected))
    assert infer("_npx_reshape", {"newshape": "(-1, -2)", "reverse": "True"},
                 [(2, 3, 4)])[1] == [(6, 4)]
    with pytest.raises(ShapeError, match="size 1"):
        infer("_npx_reshape", {"newshape": "(-3, -4)"}, [(2, 3)])


@pytest.mark.parametrize(("op_name", "raw", "shape"), [
    ("Reshape", {"shape": "(0, -1)"}, (2, 3, 4)),
    ("Flatten", {}, (2, 3, 4)),
    ("expand_dims", {"axis": "1"}, (2, 3)),
    ("squeeze", {}, (2, 1, 3)),
    ("squeeze", {"axis": "(1,)"}, (2, 1, 3)),
    ("_np_reshape", {"newshape": "(3, -1)"}, (2, 3)),
    ("_npx_reshape", {"newshape": "(-5,)"}, (2, 3)),
])
def test_view_ops_share_storage(op_name: str, raw: dict[str, str], shape: tuple) -> None:
    op = get_op(op_name)
    assert op.view
    data = RNG.normal(size=shape).astype(np.float32)
    (out,) = run(op_name, raw, data)
    assert np.shares_memory(out, data)
    assert out.shape == op.infer_shape(op.parse_attrs(raw), [shape])[1][0]


def test_non_view_ops_return_fresh_arrays() -> None:
    data = RNG.normal(size=(4, 3)).astype(np.float32)
    for op_name, raw in [("slice_axis", {"axis": "0", "begin": "1", "end": "3"}),
                         ("transpose", {}), ("SwapAxis", {"dim1": "0", "dim2": "1"})]:
        assert not get_op(op_name).view
        (out,) = run(op_name, raw, data)
        assert not np.shares_memory(out, data), op_name


def test_flatten_and_squeeze_shapes() -> None:
    assert infer("Flatten", {}, [(5,)])[1] == [(5, 1)]
    assert infer("Flatten", {}, [(0, 3, 4)])[1] == [(0, 12)]
    assert infer("squeeze", {}, [(1, 1)])[1] == [(1,)]
    with pytest.raises(ShapeError, match="size 3"):
        infer("squeeze", {"axis": "0"}, [(3, 1)])
