"""Each conformance operator case exported to ONNX gives MXNet's outputs under ONNX Runtime.

A case whose op the exporter refuses (`engine.onnx.refused.REFUSED`) or whose attributes it
refuses (`REFUSED_CASES`) must fail with the error naming node, op and reason; every other case
must match MXNet.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")  # an optional dev dependency; installed by `make test`

import engine  # noqa: E402
from engine.onnx import OnnxExportError, export  # noqa: E402
from engine.onnx.refused import REFUSED  # noqa: E402
from tests.conformance.fixtures import assert_close, op_arrays, op_cases, tolerance_for  # noqa: E402
from tests.engine.onnx.helpers import check, run  # noqa: E402

CASES = op_cases()
PARAMETER_NAMES = ("weight", "bias", "gamma", "beta", "moving_mean", "moving_var", "parameters")
# Cases whose axis 0 is not a batch (a fixed reshape of the whole tensor): exported static.
NO_BATCH_AXIS = {"reshape_plain", "reshape_minus1_then_minus2", "slicechannel_axis0",
                 "npi_broadcast_to", "split_v2_sections", "diag_matrix", "diag_vector",
                 "npi_einsum_trace", "npx_nonzero_scalar", "npx_nonzero_scalar_zero",
                 "npi_unique_scalar",
                 # a fixed region of axis 0 assigned: the export needs that axis's size
                 "slice_assign_scalar", "slice_assign_scalar_default", "crop_assign_scalar",
                 "npi_slice_assign_scalar"}
# Cases refused for an attribute value of an otherwise mapped op: the message expected.
REFUSED_CASES = {
    "roi_align_position_sensitive": "position_sensitive=True has no ONNX RoiAlign equivalent",
}
# Ops whose ONNX form needs a later opset than the default.
OPSET_18_PREFIX = "_npi_bitwise"


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
    ops = {node.opdef.name for node in model.graph.nodes if not node.is_variable}
    opset = 18 if any(op.startswith(OPSET_18_PREFIX) for op in ops) else 17
    return export(model, path, opset=opset, input_shapes={k: v.shape for k, v in feed.items()},
                  input_dtypes={k: v.dtype for k, v in feed.items()}, dynamic_batch=dynamic)


def _expected_refusal(case: dict[str, Any]) -> str | None:
    """The error a refused case must raise (a regex), or None when it must export."""
    if case["id"] in REFUSED_CASES:
        return r"node '\w+' \(\w+\): " + REFUSED_CASES[case["id"]]
    model = engine.load_model(case["symbol"], None, optimize=False)
    for node in model.graph.nodes:
        if not node.is_variable and node.opdef.name in REFUSED:
            return (rf"node '{re.escape(node.name)}' \({re.escape(node.op)}\): the op has no "
                    rf"ONNX mapping: {re.escape(REFUSED[node.opdef.name])}")
    return None


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_case_through_onnx_runtime(case: dict[str, Any], tmp_path) -> None:
    path = tmp_path / "case.onnx"
    data, _ = _split(case)
    # One data input takes a dynamic batch; several may broadcast, so they stay as given.
    dynamic = len(data) == 1 and case["id"] not in NO_BATCH_AXIS
    refusal = _expected_refusal(case)
    if refusal is not None:
        with pytest.raises(OnnxExportError, match=refusal):
            _export(case, path, dynamic)
        assert not path.exists()
        return
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
