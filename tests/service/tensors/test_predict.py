"""/predict bodies to numpy."""

from __future__ import annotations

import numpy as np
import pytest

from service.errors import BadRequest
from service.tensors import predict as codecs

LIMIT = 1 << 20


def test_predict_body() -> None:
    request = codecs.decode_predict(b'{"model": "m", "version": 2, "inputs": {"x": [[1, 2]]}}')
    assert (request.model, request.version) == ("m", "2")
    arrays = codecs.predict_arrays(request, {"x": np.dtype(np.float64)}, LIMIT)
    assert arrays["x"].dtype == np.float64 and arrays["x"].shape == (1, 2)
    with pytest.raises(BadRequest, match="unknown fields \\['extra'\\]"):
        codecs.decode_predict(b'{"model": "m", "inputs": {"x": [1]}, "extra": 1}')
    with pytest.raises(BadRequest, match="'model' must be a non-empty string"):
        codecs.decode_predict(b'{"inputs": {"x": [1]}}')
