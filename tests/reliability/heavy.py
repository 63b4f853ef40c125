"""A deliberately slow model (a wide MLP built with `engine.gluon`) for drain and queue tests."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

WIDTH = 1024


def heavy_mlp(width: int = WIDTH, depth: int = 4) -> tuple[bytes, bytes]:
    """(symbol JSON, params) of `depth` Dense(width) layers on a `width`-wide input."""
    from engine import nd
    from engine.gluon import nn

    net = nn.HybridSequential()
    for _ in range(depth):
        net.add(nn.Dense(width, activation="relu"))
    net.initialize()
    net.hybridize()
    net(nd.array(np.zeros((1, width), np.float32)))
    with tempfile.TemporaryDirectory() as directory:
        prefix = Path(directory) / "heavy"
        net.export(str(prefix))
        return (Path(f"{prefix}-symbol.json").read_bytes(),
                Path(f"{prefix}-0000.params").read_bytes())


def heavy_config(max_batch_size: int = 64, max_queue_size: int = 1024,
                 width: int = WIDTH) -> bytes:
    """config.json of `heavy_mlp`."""
    return json.dumps({"inputs": [{"name": "data", "datatype": "FP32", "shape": [-1, width]}],
                       "max_batch_size": max_batch_size,
                       "dynamic_batching": {"max_queue_size": max_queue_size}}).encode()
