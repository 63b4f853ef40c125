"""An int8 upload on a host without our int8 kernels: served in fp32, and the upload's answer
says so (`checks.precision`). A module of its own: the int8 upload's tests count the host as
having the kernels module-wide (`int8_kernels_counted`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.kernels import int8_conv
from tests.service.helpers import AUTH, run, serving, settings_for
from tests.service.rest.test_upload_calibration import npz, upload_files


def test_an_int8_upload_on_a_host_without_int8_kernels_answers_that_it_runs_fp32(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(int8_conv, "supported_here", lambda: False)
    images = np.random.default_rng(2).uniform(0, 1, (4, 1, 28, 28)).astype(np.float32)

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), models=()) as (client, _):
            response = await client.post("/models/digits", headers=AUTH,
                                         files=upload_files(npz(data=images)))
            assert response.status_code == 201, response.text
            precision = response.json()["checks"]["precision"]
            assert {key: precision[key] for key in ("asked", "running", "ran")} == {
                "asked": "int8", "running": "fp32", "ran": False}
            assert precision["reason"].startswith("our int8 kernels cannot run on this CPU")
            assert "calibration" not in precision or precision["calibration"] is None
            answer = await client.post("/v2/models/digits/infer", json={"inputs": [
                {"name": "data", "shape": [1, 1, 28, 28], "datatype": "FP32",
                 "data": images[0].ravel().tolist()}]})
            assert answer.status_code == 200, answer.text

    run(scenario())
