"""An int8 upload with a ``calibration`` part: stored in the version folder, calibrating the
model, and named with the int8 check's result in the upload's answer."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from tests.service.helpers import AUTH, files_for, run, serving, settings_for

# int8's semantics, on any host (where our kernels are missing, on the NumPy path).
pytestmark = pytest.mark.usefixtures("int8_kernels_counted")

CONFIG = {"precision": "int8", "calibration": {"num_bins": 1001},
          "outputs": [{"name": "lenet_dense2_fwd_output", "postprocess": "softmax"}]}


def npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def upload_files(calibration: bytes) -> dict:
    symbol, params = files_for("lenet")
    return {"symbol": ("s.json", symbol), "params": ("p.params", params),
            "config": ("config.json", json.dumps(CONFIG).encode()),
            "calibration": ("images.npz", calibration)}


def test_an_int8_upload_is_calibrated_on_its_calibration_part(tmp_path: Path) -> None:
    images = np.random.default_rng(2).uniform(0, 1, (20, 1, 28, 28)).astype(np.float32)

    async def scenario() -> None:
        async with serving(settings_for(tmp_path), models=()) as (client, _):
            response = await client.post("/models/digits", headers=AUTH,
                                         files=upload_files(npz(data=images)))
            assert response.status_code == 201, response.text
            precision = response.json()["checks"]["precision"]
            assert precision["running"] == "int8" and precision["ran"] is True
            assert precision["calibration"]["source"] == "calibration.npz"
            assert precision["calibration"]["rows"] == 20
            output = precision["outputs"]["lenet_dense2_fwd_output"]
            assert output["top1_agreement"] >= 0.9
            stored = list(tmp_path.glob("digits/*/calibration.npz"))
            assert len(stored) == 1
            with np.load(stored[0], allow_pickle=False) as kept:
                np.testing.assert_array_equal(kept["data"], images)
            answer = await client.post("/v2/models/digits/infer", json={"inputs": [
                {"name": "data", "shape": [1, 1, 28, 28], "datatype": "FP32",
                 "data": images[0].ravel().tolist()}]})
            assert answer.status_code == 200, answer.text

    run(scenario())


def test_a_calibration_part_naming_no_input_is_a_422(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(settings_for(tmp_path), models=()) as (client, _):
            response = await client.post(
                "/models/digits", headers=AUTH,
                files=upload_files(npz(pixels=np.zeros((2, 1, 28, 28), np.float32))))
            assert response.status_code == 422, response.text
            assert "calibration.npz must hold one array per input (data); unknown ['pixels']" \
                in response.json()["error"]

    run(scenario())
