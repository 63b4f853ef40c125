"""Each conformance operator case exported to ONNX gives MXNet's outputs under ONNX Runtime."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")  # an optional dev dependency; installed by `make test`

import engine  # noqa: E402
from engine.onnx import OnnxExportError, export  # noqa: E402
from tests.conformance.fixtures import assert_close, op_arrays, op_cases, tolerance_for  # noqa: E402
from tests.engine.onnx.helpers import check, run  # noqa: E402

CASES = op_cases()
PARAMETER_NAMES = ("weight", "bias", "gamma", "beta", "moving_mean", "moving_var", "parameters")
# Cases whose axis 0 is not a batch (a fixed reshape of the whole tensor): exported static.
NO_BATCH_AXIS = {"reshape_plain", "reshape_minus1_then_minus2", "slicechannel_axis0"}


def _split(case: dict[str, Any]) -> tuple[dict, dict]:
    """(data inputs, parameters): weights and statistics become ONNX initializers."""
    arrays = op_arrays()
    data, params = {}, {}
    for k, spec in enumerate(case["inputs"]):
        is_param = spec.get("aux") or spec["name"].endswith(PARAMETER_NAMES)
        (params if is_param else data)[spec["name"]] = arrays[f"{case['id']}/in{k}"]
    return data, params


def _export(case: dict[str, Any], path, dynamic: bool) -> Any:
    data, params = _split(case)
    model = engine.load_model(case["symbol"], params, optimize=False)
    feed = {name: data[name] for name in model.input_names}
    return export(model, path, input_shapes={k: v.shape for k, v in feed.items()},
                  input_dtypes={k: v.dtype for k, v in feed.items()}, dynamic_batch=dynamic)


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_case_through_onnx_runtime(case: dict[str, Any], tmp_path) -> None:
    path = tmp_path / "case.onnx"
    data, _ = _split(case)
    # One data input takes a dynamic batch; several may broadcast, so they stay as given.
    dynamic = len(data) == 1 and case["id"] not in NO_BATCH_AXIS
    check(_export(case, path, dynamic))
    outputs = run(path, data)
    assert len(outputs) == case["num_outputs"]
    arrays = op_arrays()
    for k, spec in enumerate(case["outputs"]):
        assert outputs[k].shape == tuple(spec["shape"])
        assert outputs[k].dtype == np.dtype(spec["dtype"])
        if not spec.get("unspecified"):
            expected = arrays[f"{case['id']}/out{k}"]
            assert_close(outputs[k], expected,
                         tolerance_for(expected.dtype, case.get("tolerance")),
                         f"{case['id']} output {k}")


def test_a_reshape_that_does_not_follow_a_batch_asks_for_a_static_export(tmp_path) -> None:
    case = next(case for case in CASES if case["id"] == "reshape_plain")
    with pytest.raises(OnnxExportError, match="dynamic_batch=False"):
        _export(case, tmp_path / "case.onnx", dynamic=True)
