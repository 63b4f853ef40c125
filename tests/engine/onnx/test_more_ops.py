"""Ops beyond the conformance cases, exported to ONNX, against the engine's interpreter.

The conformance cases hold the interpreter to MXNet's outputs; these ops have no MXNet case in
the fixtures, so the interpreter (optimize=False) is the reference here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")  # an optional dev dependency; installed by `make test`

import engine  # noqa: E402
from engine.onnx import export  # noqa: E402
from tests.conformance.fixtures import DEFAULT_TOLERANCE, assert_close  # noqa: E402
from tests.engine.onnx.helpers import check, one_op_symbol, run  # noqa: E402

RNG = np.random.default_rng(23)


def _values(kind: str, shape: tuple[int, ...]) -> np.ndarray:
    if kind == "unit":  # inside (-1, 1): arcsin, arctanh
        return RNG.uniform(-0.9, 0.9, shape).astype(np.float32)
    if kind == "above_one":  # arccosh, logarithms
        return RNG.uniform(1.1, 4.0, shape).astype(np.float32)
    if kind == "binary":
        return RNG.integers(0, 2, shape).astype(np.float32)
    if kind == "index":
        return RNG.integers(0, 4, shape).astype(np.float32)
    if kind == "with_nan":
        values = RNG.normal(size=shape).astype(np.float32)
        values.flat[::3] = np.nan
        return values
    if kind == "int":
        return RNG.integers(1, 9, shape).astype(np.int32)
    return RNG.normal(size=shape).astype(np.float32)


X = ("x", (3, 4), "normal")
Y = ("y", (3, 4), "normal")
CASES: list[tuple[str, dict, list]] = [
    *[(op, {}, [X]) for op in ("sin", "cos", "tan", "arctan", "sinh", "cosh", "arcsinh",
                               "trunc", "fix")],
    ("MAERegressionOutput", {}, [X, ("label", (3, 4), "normal")]),
    *[(op, {}, [("x", (3, 4), "unit")]) for op in ("arcsin", "arccos", "arctanh")],
    *[(op, {}, [("x", (3, 4), "above_one")]) for op in ("arccosh", "log2", "log10")],
    *[(op, {}, [X, Y]) for op in ("_equal", "_not_equal", "_greater", "_greater_equal",
                                  "_lesser", "_lesser_equal", "_minimum",
                                  "broadcast_not_equal", "broadcast_lesser",
                                  "broadcast_greater_equal", "_npi_equal", "_npi_less",
                                  "_npi_greater_equal", "_npi_not_equal", "_npi_less_equal",
                                  "_npi_greater")],
    ("_power", {}, [("x", (3, 4), "above_one"), Y]),
    ("_npi_true_divide", {}, [("x", (3, 4), "int"), ("y", (3, 4), "int")]),
    ("_npi_matmul", {}, [("x", (2, 3, 4), "normal"), ("y", (4, 5), "normal")]),
    ("_np_dot", {}, [("x", (3, 4), "normal"), ("y", (4, 2), "normal")]),
    *[(op, {}, [("x", (3, 4), "binary"), ("y", (3, 4), "binary")])
      for op in ("_logical_and", "_logical_or", "_logical_xor", "broadcast_logical_and")],
    ("logical_not", {}, [("x", (3, 4), "binary")]),
    *[(op, {"scalar": scalar}, [("x", (3, 4), "binary")])
      for op in ("_logical_and_scalar", "_logical_or_scalar", "_npi_logical_xor_scalar")
      for scalar in ("0", "1")],
    ("nansum", {"axis": "1"}, [("x", (3, 4), "with_nan")]),
    ("nansum", {}, [("x", (3, 4), "with_nan")]),
    ("nanprod", {"axis": "0", "keepdims": "True"}, [("x", (3, 4), "with_nan")]),
    ("_npi_logical_not", {}, [("x", (3, 4), "binary")]),
    *[(op, {"scalar": "0.5"}, [X]) for op in (
        "_not_equal_scalar", "_lesser_scalar", "_greater_equal_scalar", "_lesser_equal_scalar",
        "_npi_add_scalar", "_npi_subtract_scalar", "_npi_rsubtract_scalar",
        "_npi_multiply_scalar", "_npi_true_divide_scalar", "_npi_rtrue_divide_scalar",
        "_npi_maximum_scalar", "_npi_minimum_scalar", "_npi_equal_scalar", "_npi_less_scalar",
        "_npi_greater_scalar")],
    ("_npi_power_scalar", {"scalar": "2.0"}, [("x", (3, 4), "above_one")]),
    ("_npi_true_divide_scalar", {"scalar": "2", "is_int": "True"}, [("x", (3, 4), "int")]),
    *[(op, {"axis": "1"}, [X]) for op in ("_npi_sum", "_npi_mean", "_npi_max", "_npi_min",
                                          "_npi_prod", "_npi_argmax", "_npi_argmin")],
    ("_npi_sum", {}, [X]),
    ("_ones", {"shape": "(2, 3)"}, []),
    ("_full", {"shape": "(2, 3)", "value": "2.5"}, []),
    ("amp_cast", {"dtype": "float16"}, [X]),
    ("broadcast_axis", {"axis": "(1,)", "size": "(4,)"}, [("x", (3, 1), "normal")]),
    ("_npx_reshape", {"newshape": "(-2, -1)"}, [("x", (3, 2, 2), "normal")]),
    ("Activation", {"act_type": "log_sigmoid"}, [X]),
    ("Activation", {"act_type": "mish"}, [X]),
    ("depth_to_space", {"block_size": "2"}, [("x", (2, 8, 3, 3), "normal")]),
    ("space_to_depth", {"block_size": "2"}, [("x", (2, 3, 4, 6), "normal")]),
    ("reverse", {"axis": "(0, 2)"}, [("x", (2, 3, 4), "normal")]),
    ("argsort", {"axis": "1", "is_ascend": "False"}, [X]),
    ("pick", {"axis": "1"}, [X, ("index", (3,), "index")]),
    ("pick", {"axis": "1", "keepdims": "True", "mode": "wrap"}, [X, ("index", (3,), "index")]),
    ("slice_like", {"axes": "(1,)"}, [("x", (3, 5), "normal"), ("like", (3, 2), "normal")]),
    ("shape_array", {}, [("x", (2, 3, 4), "normal")]),
    ("size_array", {}, [("x", (2, 3, 4), "normal")]),
    ("softmin", {"axis": "1", "temperature": "2.0"}, [X]),
    ("GroupNorm", {"num_groups": "2"}, [("x", (2, 4, 3, 3), "normal"), ("gamma", (4,), "normal"),
                                        ("beta", (4,), "normal")]),
]
IDS = [f"{op}-{k}" for k, (op, _, _) in enumerate(CASES)]


@pytest.mark.parametrize(("op", "attrs", "inputs"), CASES, ids=IDS)
def test_op_matches_the_interpreter(op: str, attrs: dict, inputs: list, tmp_path) -> None:
    feed = {name: _values(kind, shape) for name, shape, kind in inputs}
    params = {name: feed.pop(name) for name in ("gamma", "beta") if name in feed}
    symbol = one_op_symbol(op, attrs, [name for name, _, _ in inputs])
    model = engine.load_model(symbol, params, optimize=False)
    expected: Any = list(model.infer(feed).values())[0]
    # Several inputs may broadcast against each other, so only one input follows the batch.
    path = export(model, tmp_path / "op.onnx", input_shapes={k: v.shape for k, v in feed.items()},
                  input_dtypes={k: v.dtype for k, v in feed.items()},
                  dynamic_batch=len(feed) == 1)
    check(path)
    actual = run(path, feed)[0]
    assert actual.dtype == expected.dtype
    assert_close(actual, expected, DEFAULT_TOLERANCE if expected.dtype != np.float16 else
                 {"rtol": 1e-3, "atol": 1e-3}, op)


def _tied_records(batch: int) -> np.ndarray:
    """Detection records ``[class, score, x1, y1, x2, y2]`` with tied scores and overlaps."""
    corners = RNG.uniform(0, 0.5, (batch, 8, 2))
    boxes = np.concatenate([corners, corners + RNG.uniform(0.2, 0.5, (batch, 8, 2))], axis=-1)
    scores = RNG.choice([0.3, 0.6, 0.9], (batch, 8, 1))  # many ties
    classes = RNG.integers(0, 2, (batch, 8, 1))
    return np.concatenate([classes, scores, boxes], axis=-1).astype(np.float32)


@pytest.mark.parametrize("attrs", [
    {"topk": "5", "id_index": "0", "overlap_thresh": "0.3"},
    {"force_suppress": "True", "overlap_thresh": "0.2", "valid_thresh": "0.5"},
    {"id_index": "0", "background_id": "1", "out_format": "center"},
], ids=["class_aware_topk", "force_suppress", "background_center"])
def test_box_nms_keeps_mxnets_order_under_ties_at_any_batch(attrs: dict, tmp_path) -> None:
    # TopK breaks ties by the lower index, as MXNet's stable sort does, so the rows match
    # in order, not only as a set.
    symbol = one_op_symbol("_contrib_box_nms", attrs, ["data"])
    model = engine.load_model(symbol, None, optimize=False)
    path = export(model, tmp_path / "nms.onnx", input_shapes={"data": (1, 8, 6)})
    check(path)
    for batch in (1, 4):
        records = _tied_records(batch)
        expected = next(iter(model.infer({"data": records}).values()))
        assert (expected[:, :, 0] == -1).any()  # something was suppressed or left out
        assert_close(run(path, {"data": records})[0], expected, DEFAULT_TOLERANCE,
                     f"box_nms batch {batch}")
