"""The dtypes operator definitions name, made once: MXNet's default float32, the int64 of
indices and shapes, and the rest that shape and dtype rules return."""

from __future__ import annotations

import numpy as np

BOOL = np.dtype(np.bool_)
UINT8 = np.dtype(np.uint8)
INT32 = np.dtype(np.int32)
INT64 = np.dtype(np.int64)
FLOAT32 = np.dtype(np.float32)
FLOAT64 = np.dtype(np.float64)
