"""MXNet's mod family through ONNX: the divisor's sign, and 0 where the divisor is 0.

No MXNet case covers mod in the fixtures, so each output is checked twice: against the
engine's interpreter, and against the rule written out per element with ``math.fmod``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("onnxruntime")  # an optional dev dependency; installed by `make test`

import engine  # noqa: E402
from engine.onnx import export  # noqa: E402
from tests.conformance.fixtures import DEFAULT_TOLERANCE, assert_close  # noqa: E402
from tests.engine.onnx.helpers import check, one_op_symbol, run  # noqa: E402

# Every sign pairing, exact multiples (remainder 0) and zero divisors.
DIVIDENDS = np.array([[7.5, -7.5, 7.5, -7.5, 6.0, -6.0, 0.0, 5.25],
                      [1.0, -1.0, 2.5, -2.5, 9.0, -9.0, 3.0, -0.5]])
DIVISORS = np.array([[2.0, 2.0, -2.0, -2.0, 3.0, -3.0, 2.0, 0.0],
                     [3.0, 3.0, -0.75, 0.75, -4.0, 4.0, 0.0, 0.25]])


def _mxnet_mod(a: float, b: float) -> float:
    """MXNet's rule: C fmod moved to the divisor's sign, 0 for a 0 divisor."""
    if b == 0:
        return 0.0
    remainder = math.fmod(a, b)
    if remainder != 0 and (remainder < 0) != (b < 0):
        remainder += b
    return remainder


def _rule(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    return np.vectorize(_mxnet_mod, otypes=[np.float64])(a, b)


def _export_and_run(op: str, attrs: dict, feed: dict, tmp_path) -> tuple[np.ndarray, ...]:
    model = engine.load_model(one_op_symbol(op, attrs, list(feed)), None, optimize=False)
    expected = next(iter(model.infer(feed).values()))
    path = export(model, tmp_path / "mod.onnx", input_shapes={k: v.shape for k, v in feed.items()},
                  input_dtypes={k: v.dtype for k, v in feed.items()},
                  dynamic_batch=len(feed) == 1)
    check(path)
    actual = run(path, feed)[0]
    assert actual.dtype == expected.dtype
    return actual, expected


@pytest.mark.parametrize("op", ["_mod", "broadcast_mod", "_npi_mod"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_binary_mod_matches_mxnet(op: str, dtype: type, tmp_path) -> None:
    dividends = DIVIDENDS if dtype != np.int32 else np.trunc(DIVIDENDS * 2)
    divisors = DIVISORS if dtype != np.int32 else np.trunc(DIVISORS * 2)
    feed = {"x": dividends.astype(dtype), "y": divisors.astype(dtype)}
    if op != "_mod":  # the broadcasting forms: one divisor row for both dividend rows
        feed["y"] = feed["y"][1:]
    actual, expected = _export_and_run(op, {}, feed, tmp_path)
    assert_close(actual, expected, DEFAULT_TOLERANCE, op)
    assert_close(actual, _rule(feed["x"], feed["y"]).astype(dtype), DEFAULT_TOLERANCE, op)


@pytest.mark.parametrize("op", ["_mod_scalar", "_npi_mod_scalar", "_rmod_scalar",
                                "_npi_rmod_scalar"])
@pytest.mark.parametrize("scalar", [2.5, -2.5, 0.0])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_scalar_mod_matches_mxnet(op: str, scalar: float, dtype: type, tmp_path) -> None:
    data = (DIVIDENDS if dtype != np.int32 else np.trunc(DIVIDENDS * 2)).astype(dtype)
    actual, expected = _export_and_run(op, {"scalar": str(scalar)}, {"x": data}, tmp_path)
    assert_close(actual, expected, DEFAULT_TOLERANCE, op)
    if np.issubdtype(actual.dtype, np.integer):
        scalar = float(int(scalar))  # an integer tensor truncates the scalar
    pair = (scalar, data) if "rmod" in op else (data, scalar)
    assert_close(actual, _rule(*pair).astype(actual.dtype), DEFAULT_TOLERANCE, op)
