"""Reductions, argmax/argmin, norm, sort/argsort/topk: semantics, shapes, dtypes and ``out=``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.errors import ModelFormatError, ShapeError
from engine.ops import get_op

RNG = np.random.default_rng(11)
X = RNG.normal(size=(2, 3, 4)).astype(np.float32)


def run(name: str, *inputs: np.ndarray, out: Any = None, **raw: str) -> tuple[np.ndarray, ...]:
    op = get_op(name)
    return op.compute(np, op.parse_attrs(raw), list(inputs), out=out)


def out_shape(name: str, shape: Any, **raw: str) -> Any:
    op = get_op(name)
    return op.infer_shape(op.parse_attrs(raw), [shape])[1]


# ---- value reductions -----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "reference"), [
    ("sum", np.sum), ("mean", np.mean), ("max", np.max), ("min", np.min), ("prod", np.prod),
    ("nansum", np.nansum), ("nanprod", np.nanprod),
])
@pytest.mark.parametrize(("raw", "axes", "keepdims"), [
    ({}, None, False),
    ({"axis": "()"}, None, False),
    ({"axis": "1"}, (1,), False),
    ({"axis": "(0, 2)", "keepdims": "True"}, (0, 2), True),
    ({"axis": "-1"}, (2,), False),
    ({"axis": "1", "exclude": "True"}, (0, 2), False),
    ({"axis": "(0, 2)", "exclude": "True", "keepdims": "True"}, (1,), True),
])
def test_reductions_match_numpy(name: str, reference: Any, raw: dict[str, str], axes: Any,
                                keepdims: bool) -> None:
    (got,) = run(name, X, **raw)
    expected = reference(X, axis=axes, keepdims=keepdims)
    if axes is None and not keepdims:
        expected = np.reshape(expected, (1,))
    assert got.dtype == np.float32
    assert got.shape == out_shape(name, X.shape, **raw)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_nan_reductions_skip_nan() -> None:
    x = np.array([[1.0, np.nan, 3.0]], dtype=np.float32)
    assert run("nansum", x, axis="1")[0].tolist() == [4.0]
    assert run("nanprod", x, axis="1")[0].tolist() == [3.0]


def test_aliases() -> None:
    assert get_op("sum_axis") is get_op("sum")
    assert get_op("max_axis") is get_op("max")
    assert get_op("min_axis") is get_op("min")
    assert get_op("_npx_topk") is get_op("topk")


@pytest.mark.parametrize(("shape", "raw", "expected"), [
    (None, {"axis": "1"}, None),
    ((0, 3, 4), {"axis": "1"}, (0, 4)),
    ((0, 3, 0), {"axis": "(0, 2)", "keepdims": "True"}, (1, 3, 1)),
    ((0, 3, 0), {"axis": "1", "exclude": "True"}, (3,)),
    ((0, 3), {}, (1,)),
    ((0, 3), {"keepdims": "True"}, (1, 1)),
])
def test_reduce_shape_inference_with_partial_shapes(shape: Any, raw: dict[str, str],
                                                    expected: Any) -> None:
    assert out_shape("sum", shape, **raw) == [expected]


def test_reduce_axis_errors() -> None:
    with pytest.raises(ShapeError, match="out of range"):
        out_shape("mean", (2, 3), axis="2")
    with pytest.raises(ShapeError, match="twice"):
        out_shape("mean", (2, 3), axis="(1, -1)")
    with pytest.raises(ModelFormatError, match="axis"):
        get_op("sum").parse_attrs({"axis": "one"})


def test_numpy_mode_reductions() -> None:
    (got,) = run("_npi_sum", X)
    assert got.shape == ()
    np.testing.assert_allclose(got, X.sum(), rtol=1e-5)
    assert out_shape("_npi_sum", (2, 3)) == [()]
    assert out_shape("_npi_sum", (2, 3), axis="()") == [(2, 3)]
    assert out_shape("_npi_max", (0, 3), axis="0", keepdims="True") == [(1, 3)]
    np.testing.assert_allclose(run("_npi_sum", X, axis="1", initial="2")[0],
                               X.sum(axis=1) + 2, rtol=1e-5)
    ints = np.array([[1, 2], [3, 4]], dtype=np.int32)
    (mean,) = run("_npi_mean", ints, axis="0")
    assert mean.dtype == np.float32
    np.testing.assert_allclose(mean, [2, 3])
    op = get_op("_npi_sum")
    assert op.input_names(op.parse_attrs({})) == ("a",)
    assert op.infer_dtype(op.parse_attrs({"dtype": "float64"}), [np.dtype(np.float32)])[1] == [
        np.float64]
    assert run("_npi_sum", ints, dtype="float64")[0].dtype == np.float64


def test_float16_sum_accumulates_in_float32() -> None:
    x = np.full(4096, 1.0, dtype=np.float16)
    (got,) = run("sum", x)
    assert got.dtype == np.float16
    assert got.tolist() == [4096.0]


@pytest.mark.parametrize(("name", "raw"), [
    ("sum", {}), ("sum", {"axis": "1"}), ("mean", {"axis": "(0, 2)", "keepdims": "True"}),
    ("max", {"axis": "-1"}), ("prod", {"axis": "0", "exclude": "True"}), ("_npi_sum", {}),
    ("_npi_max", {"axis": "1"}),
])
def test_reductions_write_into_out(name: str, raw: dict[str, str]) -> None:
    op = get_op(name)
    assert op.writes_out
    (expected,) = run(name, X, **raw)
    out = np.full(expected.shape, np.nan, dtype=np.float32)
    (written,) = run(name, X, out=out, **raw)
    assert written is out
    np.testing.assert_allclose(out, expected, rtol=1e-6)


# ---- norm -----------------------------------------------------------------------------------


def test_norm() -> None:
    (got,) = run("norm", X)
    assert got.shape == (1,)
    np.testing.assert_allclose(got, [np.sqrt((X.astype(np.float64) ** 2).sum())], rtol=1e-5)
    (got,) = run("norm", X, ord="1", axis="-1", keepdims="True")
    np.testing.assert_allclose(got, np.abs(X).sum(axis=-1, keepdims=True), rtol=1e-5)
    (got,) = run("norm", X, axis="(1, 2)")
    np.testing.assert_allclose(got, np.sqrt((X ** 2).sum(axis=(1, 2))), rtol=1e-5)
    with pytest.raises(ModelFormatError, match="ord"):
        get_op("norm").parse_attrs({"ord": "3"})
    assert out_shape("norm", (0, 4), axis="1") == [(0,)]


# ---- argmax / argmin ------------------------------------------------------------------------


def test_argmax_argmin() -> None:
    (got,) = run("argmax", X, axis="1")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, X.argmax(axis=1))
    (got,) = run("argmin", X, axis="-1", keepdims="True")
    np.testing.assert_array_equal(got, X.argmin(axis=-1)[..., None])
    (got,) = run("argmax", X)
    assert got.shape == (1,)
    assert got[0] == X.argmax()
    assert out_shape("argmax", (2, 0, 4), axis="2") == [(2, 0)]
    assert out_shape("argmax", (2, 3), keepdims="True") == [(1, 1)]
    assert out_shape("argmax", (5,), axis="0") == [(1,)]
    assert out_shape("argmax", None, axis="0") == [None]


def test_numpy_mode_argmax_gives_int64() -> None:
    (got,) = run("_npi_argmax", X, axis="0")
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, X.argmax(axis=0))
    (got,) = run("_npi_argmin", X)
    assert got.shape == ()
    assert out_shape("_npi_argmax", (2, 3)) == [()]


# ---- sort / argsort / topk ------------------------------------------------------------------


def test_sort_and_argsort() -> None:
    (got,) = run("sort", X)
    np.testing.assert_array_equal(got, np.sort(X, axis=-1))
    (got,) = run("sort", X, axis="0", is_ascend="False")
    np.testing.assert_array_equal(got, -np.sort(-X, axis=0))
    (got,) = run("argsort", X, axis="1")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.argsort(X, axis=1))
    (got,) = run("argsort", X, is_ascend="False", dtype="int32")
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.argsort(-X, axis=-1))
    (got,) = run("sort", X, axis="None")
    np.testing.assert_array_equal(got, np.sort(X.reshape(-1)))
    assert out_shape("sort", (2, 0, 4), axis="None") == [(0,)]


def test_topk_return_types() -> None:
    x = np.array([[0.3, 0.9, 0.1, 0.5], [0.8, 0.2, 0.6, 0.4]], dtype=np.float32)
    (indices,) = run("topk", x, k="2")
    assert indices.dtype == np.float32
    assert indices.tolist() == [[1, 3], [0, 2]]
    (values,) = run("topk", x, k="2", ret_typ="value")
    np.testing.assert_array_equal(values, x[[[0], [1]], [[1, 3], [0, 2]]])
    values, indices = run("topk", x, k="1", ret_typ="both", is_ascend="True", dtype="int64")
    assert indices.dtype == np.int64
    assert indices.tolist() == [[2], [1]]
    np.testing.assert_array_equal(values, x[[[0], [1]], [[2], [1]]])
    (mask,) = run("topk", x, k="2", ret_typ="mask")
    assert mask.dtype == np.float32
    assert mask.tolist() == [[0, 1, 0, 1], [1, 0, 1, 0]]
    (values,) = run("topk", x, k="0", ret_typ="value", axis="0")
    np.testing.assert_array_equal(values, -np.sort(-x, axis=0))
    (indices,) = run("topk", x, k="3", axis="None")
    assert indices.tolist() == [1, 4, 6]
    (mask,) = run("topk", x, k="3", axis="None", ret_typ="mask")
    assert mask.shape == x.shape
    assert mask.sum() == 3


def test_topk_records() -> None:
    op = get_op("topk")
    counts = {"indices": (1, 1), "value": (1, 2), "both": (2, 2), "mask": (1, 1)}
    for ret_typ, (visible, total) in counts.items():
        attrs = op.parse_attrs({"ret_typ": ret_typ})
        assert op.num_outputs(attrs) == visible
        assert op.num_total_outputs(attrs) == total
    sort = get_op("sort")
    assert sort.num_total_outputs(sort.parse_attrs({})) == 2
    attrs = op.parse_attrs({"k": "2", "ret_typ": "both", "axis": "0"})
    assert op.infer_shape(attrs, [(5, 0)]) == ([(5, 0)], [(2, 0), (2, 0)])
    assert op.infer_shape(attrs, [(0, 3)]) == ([(0, 3)], [(2, 3), (2, 3)])
    assert op.infer_dtype(attrs, [np.dtype(np.float16)]) == (
        [np.float16], [np.float16, np.float32])
    with pytest.raises(ShapeError, match="larger"):
        op.infer_shape(op.parse_attrs({"k": "7"}), [(2, 3)])
    with pytest.raises(ModelFormatError, match="ret_typ"):
        op.parse_attrs({"ret_typ": "values"})
