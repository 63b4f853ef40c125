"""``POST /predict`` bodies: ``{"model", "version", "inputs": {name: nested list}}`` to arrays.

The inputs are read by the JSON reader (`service.tensors.json`) once the model's dtypes and
ranks are known; outputs go back as nested lists (`service.tensors.postprocess.predict_outputs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.errors import BadRequest
from service.tensors import json
from service.tensors.datatypes import MAX_DIMENSIONS, check_elements


@dataclass
class PredictRequest:
    """A decoded ``POST /predict`` body; inputs are still JSON values (no dtype known yet):
    Python scalars or `service.tensors.json` proxies."""

    model: str
    version: str | None
    inputs: dict[str, Any]
    brackets: int  # how many "[" the body holds: see `json.read_floats`


def decode_predict(body: bytes) -> PredictRequest:
    """Decode ``{"model": NAME, "version": optional, "inputs": {name: nested list}}``."""
    request = json.as_object(json.parse(body), "predict request")
    unknown = sorted(set(request) - {"model", "version", "inputs"})
    if unknown:
        raise BadRequest(f"predict request: unknown fields {unknown}; expected model, version, "
                         "inputs")
    model = request.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("predict request: 'model' must be a non-empty string")
    version = request.get("version")
    if version is not None and (isinstance(version, bool)
                                or not isinstance(version, (int, str))):
        raise BadRequest(f"predict request: 'version' must be an integer or a string, got "
                         f"{json.plain(version)!r:.50}")
    inputs = json.as_object(request.get("inputs"), "predict request: 'inputs'")
    if not inputs:
        raise BadRequest("predict request: 'inputs' must name at least one input")
    return PredictRequest(model, None if version is None else str(version), inputs,
                          json.brackets(body))


def predict_arrays(request: PredictRequest, dtypes: Mapping[str, np.dtype],
                   max_elements: int, ranks: Mapping[str, int] | None = None
                   ) -> dict[str, np.ndarray]:
    """The inputs as arrays of each input's dtype, nested no deeper than its rank in `ranks`
    (inputs not in `dtypes` are left to the caller's name check, converted as float32)."""
    depths = {name: (ranks or {}).get(name, MAX_DIMENSIONS) for name in request.inputs}
    arrays = json.read_arrays(request.inputs, dtypes, request.brackets, depths)
    for name, array in arrays.items():
        check_elements(array.size, max_elements, f"input {name!r}")
    return arrays
