"""A small fake model for pure-asyncio batcher and repository tests (no graph, no runtime)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from engine.errors import ExecutionError, InputError


@dataclass(frozen=True)
class Spec:
    """Stands in for `engine.TensorSpec`."""

    name: str
    shape: tuple[int, ...] | None
    dtype: np.dtype


class FakeModel:
    """``out = data @ weight`` plus a per-row sum; records every batch shape it ran."""

    def __init__(self, width: int = 4, *, delay_s: float = 0.0, seed: int = 0,
                 fail_width: int | None = None) -> None:
        self.weight = np.random.default_rng(seed).normal(size=(64, 3)).astype(np.float32)
        self.width = width
        self.delay_s = delay_s
        self.fail_width = fail_width
        self.gate = threading.Event()
        self.gate.set()
        self.batches: list[tuple[tuple[int, ...], np.dtype]] = []
        self.rows_seen: list[np.ndarray] = []
        self.input_names = ["data"]
        self.output_names = ["out", "total"]
        self.inputs = [Spec("data", (-1, width), np.dtype(np.float32))]
        self.outputs = [Spec("out", (-1, 3), np.dtype(np.float32)),
                        Spec("total", (-1,), np.dtype(np.float32))]
        self.param_bytes = self.weight.nbytes

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch (blocks while `gate` is cleared)."""
        if set(inputs) != {"data"}:
            raise InputError(f"unknown inputs {sorted(inputs)}; expected ['data']")
        if not self.gate.wait(10):
            raise ExecutionError("fake model: gate never opened")
        data = np.asarray(inputs["data"])
        self.batches.append((data.shape, data.dtype))
        self.rows_seen.append(data.copy())
        if self.delay_s:
            time.sleep(self.delay_s)
        if data.shape[1] == self.fail_width:
            raise ExecutionError(f"fake model: width {self.fail_width} fails on purpose")
        out = data.astype(np.float32) @ self.weight[: data.shape[1]]
        return {"out": out, "total": data.sum(axis=1).astype(np.float32)}

    def activation_bytes(self, input_shapes: Mapping[str, tuple[int, ...]]) -> int:
        """Bytes of the output buffers for one input signature."""
        rows = input_shapes["data"][0]
        return rows * 4 * 4


def expected(model: FakeModel, data: np.ndarray) -> dict[str, np.ndarray]:
    """What `model` gives for `data` run alone."""
    return {"out": data.astype(np.float32) @ model.weight[: data.shape[1]],
            "total": data.sum(axis=1).astype(np.float32)}
