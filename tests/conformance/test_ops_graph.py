"""Every conformance operator case as the one-node graph MXNet wrote, run through load_model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import engine
from tests.conformance.fixtures import assert_close, op_arrays, op_cases, tolerance_for

CASES = op_cases()


@pytest.mark.parametrize("optimize", [False, True], ids=["reference", "optimized"])
@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_case_through_load_model(case: dict[str, Any], optimize: bool) -> None:
    arrays = op_arrays()
    model = engine.load_model(case["symbol"], optimize=optimize)
    feed = {spec["name"]: arrays[f"{case['id']}/in{k}"] for k, spec in enumerate(case["inputs"])}
    assert sorted(model.input_names) == sorted(feed)
    outputs = list(model.infer(feed).values())
    assert len(outputs) == case["num_outputs"]
    for k, spec in enumerate(case["outputs"]):
        assert outputs[k].shape == tuple(spec["shape"])
        assert outputs[k].dtype == np.dtype(spec["dtype"])
        if spec.get("unspecified"):
            continue
        expected = arrays[f"{case['id']}/out{k}"]
        assert_close(outputs[k], expected, tolerance_for(expected.dtype, case.get("tolerance")),
                     f"{case['id']} output {k}")
