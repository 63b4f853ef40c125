"""Shared helpers for the serving tests: an event-loop runner, model files, a fake loader."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import ModelFormatError
from engine.graph.params import load_params, save_params
from tests.conformance.fixtures import model_files, model_io_sets
from tests.engine.serving.fakes import FakeModel

SEED_MLP_CONFIG = {"max_batch_size": 32,
                   "inputs": [{"name": "data", "datatype": "FP32", "shape": [-1, 512]}],
                   "dynamic_batching": {"max_queue_delay_us": 2000}}
SEED_MLP_BIAS = "arg:seed_mlp_dense2_bias"


def run(coroutine: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
    """Run a coroutine on a fresh event loop, bounded in time."""
    return asyncio.run(asyncio.wait_for(coroutine, timeout))


def seed_mlp() -> tuple[bytes, bytes]:
    """(symbol bytes, params bytes) of the conformance seed MLP."""
    symbol, params = model_files("seed_mlp")
    return symbol.read_bytes(), params.read_bytes()


def seed_mlp_shifted(shift: float) -> bytes:
    """seed_mlp's params with `shift` added to the last bias: outputs move by exactly `shift`."""
    arrays = load_params(model_files("seed_mlp")[1].read_bytes()).as_dict()
    arrays[SEED_MLP_BIAS] = arrays[SEED_MLP_BIAS] + np.float32(shift)
    return save_params(None, arrays)


def seed_mlp_io() -> tuple[np.ndarray, np.ndarray]:
    """The batch-8 input and MXNet's expected output of seed_mlp."""
    inputs, outputs = model_io_sets("seed_mlp")[1]
    return inputs["data"], outputs[0]


def fake_symbol(seed: int = 0, width: int = 4, broken: bool = False) -> bytes:
    """The 'symbol file' the fake loader reads."""
    return json.dumps({"fake": {"seed": seed, "width": width, "broken": broken}}).encode()


def fake_loader(symbol: Path, params: Path, *, device: str = "cpu") -> FakeModel:
    """Loads `fake_symbol` files; raises ModelFormatError like the real loader on bad ones."""
    try:
        spec = json.loads(Path(symbol).read_bytes())["fake"]
    except (ValueError, KeyError) as error:
        raise ModelFormatError(f"fake symbol {symbol} is malformed: {error}") from None
    if spec["broken"]:
        raise ModelFormatError("node 'fc1' (FullyConnected): unknown op on purpose")
    Path(params).read_bytes()
    return FakeModel(spec["width"], seed=spec["seed"])
