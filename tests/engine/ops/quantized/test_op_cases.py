"""One-op graphs of the int8 ops the model exports do not hold (``_contrib_quantize``,
``_contrib_quantized_elemwise_mul``), as MXNet 1.9.1 wrote and ran them
(tools/mxnet_fixtures/generate_quantized.py, ``ops/``)."""

from __future__ import annotations

import json
from functools import cache

import numpy as np
import pytest

import engine
from tests.engine.ops.quantized.fixtures import ROOT


@cache
def cases() -> tuple[dict, dict[str, np.ndarray]]:
    documents = json.loads((ROOT / "ops" / "cases.json").read_text())
    return documents, dict(np.load(ROOT / "ops" / "cases.npz"))


@pytest.mark.parametrize("case", sorted(cases()[0]))
@pytest.mark.parametrize("optimize", [True, False], ids=["compiled", "interpreter"])
def test_op_case_matches_mxnet(case: str, optimize: bool) -> None:
    document, arrays = cases()[0][case], cases()[1]
    model = engine.load_model(json.dumps(document), None, optimize=optimize)
    feed = {name: arrays[f"{case}/{name}"] for name in model.input_names}
    results = list(model.infer(feed).values())
    expected = [arrays[f"{case}/out{k}"] for k in range(len(results))]
    assert f"{case}/out{len(results)}" not in arrays
    for result, reference in zip(results, expected, strict=True):
        result = np.asarray(result)
        assert result.dtype == reference.dtype
        if np.issubdtype(reference.dtype, np.integer):
            np.testing.assert_array_equal(result, reference)
        else:
            np.testing.assert_allclose(result, reference, rtol=1e-6)
