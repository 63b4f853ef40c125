"""The data-dependent ops' kernels on the CuPy stand-in: a staged GPU plan runs those nodes on
the host, so the reference interpreter on a GPU (``optimize=False``) is what runs them on CuPy;
each of MXNet's cases must match there too."""

from __future__ import annotations

from typing import Any

import pytest

import engine
from engine.cuda.array_module import capturable
from engine.runtime.staged import StagedPlan
from tests.conformance.fixtures import assert_close, op_arrays, op_cases, tolerance_for
from tests.engine.gpu import fake_cupy

DYNAMIC = [case for case in op_cases()
           if case["op"] in {"_contrib_boolean_mask", "_npi_boolean_mask", "_npx_nonzero",
                             "_npi_nonzero", "_npi_unique", "_npi_bincount", "_npi_delete"}]


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    return fake_cupy.install(monkeypatch)


@pytest.mark.parametrize("case", DYNAMIC, ids=[case["id"] for case in DYNAMIC])
def test_dynamic_kernels_on_cupy_match_mxnet(fake_gpu: Any, case: dict[str, Any]) -> None:
    arrays = op_arrays()
    feed = {spec["name"]: arrays[f"{case['id']}/in{k}"] for k, spec in enumerate(case["inputs"])}
    model = engine.load_model(case["symbol"], device="gpu", optimize=False)
    assert model.device == "gpu" and model.backend.xp is capturable(fake_gpu)
    outputs = list(model.infer(feed).values())
    for k, spec in enumerate(case["outputs"]):
        expected = arrays[f"{case['id']}/out{k}"]
        assert outputs[k].shape == tuple(spec["shape"]) and outputs[k].dtype == expected.dtype
        assert_close(outputs[k], expected, tolerance_for(expected.dtype, case.get("tolerance")),
                     f"{case['id']} output {k}")


def test_the_cases_cover_every_data_dependent_op() -> None:
    assert {case["op"] for case in DYNAMIC} == {
        "_contrib_boolean_mask", "_npi_boolean_mask", "_npx_nonzero", "_npi_nonzero",
        "_npi_unique", "_npi_bincount", "_npi_delete"}
    assert any(isinstance(engine.load_model(case["symbol"]).plan_for(
        {spec["name"]: op_arrays()[f"{case['id']}/in{k}"]
         for k, spec in enumerate(case["inputs"])}), StagedPlan) for case in DYNAMIC)
