"""A served version held mid-batch by the test (a slow model on demand), and V2 bodies of the
seed MLP, for tests of queueing over the service."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from engine.serving.loaded import LoadedVersion

ROW = np.linspace(-1, 1, 512, dtype=np.float32).reshape(1, 512)


def mlp_body(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON V2 request of one row for the seed MLP, with request `parameters`."""
    return {"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 512],
                        "data": ROW.ravel().tolist()}], "parameters": dict(parameters)}


def gate_batches(handle: LoadedVersion) -> threading.Event:
    """Hold every batch of `handle` until the returned event is set. With max_batch_size 1
    each batch is one request, which the batcher runs through its `infer`."""
    gate, infer = threading.Event(), handle.batcher.infer

    def held(inputs: Any) -> Any:
        assert gate.wait(30), "the test never opened the gate"
        return infer(inputs)

    handle.batcher.infer = held
    return gate


async def wait_until(condition: Callable[[], bool], bound_s: float = 20.0) -> None:
    """Poll `condition` on the event loop until it holds (failing after `bound_s`)."""
    deadline = time.monotonic() + bound_s
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.005)
