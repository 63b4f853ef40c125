"""Every conformance operator case, run straight through its registry record (numpy kernels)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.ops import get_op
from tests.conformance.fixtures import assert_close, op_arrays, op_cases, tolerance_for

CASES = op_cases()


def case_inputs(case: dict[str, Any]) -> list[np.ndarray]:
    arrays = op_arrays()
    return [arrays[f"{case['id']}/in{k}"] for k in range(len(case["inputs"]))]


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_case_through_registry(case: dict[str, Any]) -> None:
    op = get_op(case["op"])
    attrs = op.parse_attrs(case["attrs"])
    inputs = case_inputs(case)
    assert len(inputs) == len(op.input_names(attrs))
    _, out_shapes = op.infer_shape(attrs, [tuple(array.shape) for array in inputs])
    _, out_dtypes = op.infer_dtype(attrs, [array.dtype for array in inputs])
    outputs = op.compute(np, attrs, inputs)
    assert len(outputs) == case["num_outputs"] == op.num_outputs(attrs)
    arrays = op_arrays()
    for k, spec in enumerate(case["outputs"]):
        assert_inferred(out_shapes[k], tuple(spec["shape"]), op.shape_depends_on_data(attrs), k)
        assert np.dtype(out_dtypes[k]) == np.dtype(spec["dtype"]), f"inferred dtype of output {k}"
        assert outputs[k].dtype == np.dtype(spec["dtype"]), f"dtype of output {k}"
        if spec.get("unspecified"):
            assert outputs[k].shape == tuple(spec["shape"])
            continue
        expected = arrays[f"{case['id']}/out{k}"]
        assert_close(outputs[k], expected, tolerance_for(expected.dtype, case.get("tolerance")),
                     f"{case['id']} output {k}")


def assert_inferred(inferred: tuple[int, ...] | None, actual: tuple[int, ...], dynamic: str,
                    k: int) -> None:
    """The inferred shape is the output's, except that an op whose output shape depends on the
    data leaves those dimensions unknown (0) and knows the rest."""
    if not dynamic:
        assert inferred == actual, f"inferred shape of output {k}"
        return
    assert inferred is not None and len(inferred) == len(actual), f"rank of output {k}"
    assert all(dim in (0, want) for dim, want in zip(inferred, actual)), \
        f"inferred shape {inferred} of output {k} contradicts {actual}"
