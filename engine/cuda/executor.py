"""Running a compiled `Plan` on the GPU: pinned-buffer I/O, one stream, CUDA graph replay."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from engine.buffers import fill_rows
from engine.cuda.graphs import CapturedGraph, capture
from engine.device import Device

# Eager runs before capture: the first compiles kernels and grows the pool, the second checks
# that steady state allocates nothing new.
WARMUP_RUNS = 2


class GpuExecutor:
    """Moves a plan's inputs in and outputs out through pinned host buffers on the plan's stream.

    The copies and the plan's steps run eagerly for the first `WARMUP_RUNS` runs, then (when the
    device allows CUDA graphs and ``capture_blocker`` names no op that cannot run inside
    capture) are captured once and replayed as one graph launch per run: the copies from and to
    the pinned buffers are nodes of the graph too, so a warm run is one host copy into the
    pinned inputs, one launch and one synchronisation. The copies go through
    ``cudaMemcpyAsync`` itself, since CuPy's ``set``/``get`` refuse to run while a stream
    captures.
    """

    def __init__(self, device: Device, inputs: Mapping[str, Any], heads: list[Any],
                 run_steps: Callable[[], None], stream: Any,
                 convolutions: Any = None, capture_blocker: str | None = None) -> None:
        self.device = device
        self._cupy = device.xp
        self._inputs = dict(inputs)
        self._heads = heads
        self._run_steps = run_steps
        self.stream = stream
        self._convolutions = convolutions
        self._staged_inputs = {name: device.pinned_empty(array.shape, array.dtype)
                               for name, array in inputs.items()}
        self._staged_outputs = [device.pinned_empty(head.shape, head.dtype) for head in heads]
        self.graph: CapturedGraph | None = None
        # A plan with an op that reads its inputs on the host is never captured (not even tried).
        self.graph_error = capture_blocker if device.cuda_graphs else "disabled"
        self.eager_runs = 0

    def run(self, feed: Mapping[str, np.ndarray], copy_outputs: bool) -> list[np.ndarray]:
        """Upload ``feed``, compute, download the outputs; returns host arrays."""
        with self.device.activate(), self.stream:
            for name, staged in self._staged_inputs.items():
                fill_rows(staged, feed[name], _copy_same_kind)
            self._compute()
            self.stream.synchronize()
        outputs = self._staged_outputs
        return [output.copy() for output in outputs] if copy_outputs else list(outputs)

    def _compute(self) -> None:
        if self.graph is not None:
            self.graph.replay()
            return
        self._copies_and_steps()
        self.eager_runs += 1
        if self.graph_error is None and self.eager_runs >= WARMUP_RUNS:
            try:
                self.graph = capture(self._copies_and_steps, self.stream, self._cupy)
            except Exception as error:  # a step cannot be captured: stay eager, say why
                self.graph_error = f"{type(error).__name__}: {error}"

    def _copies_and_steps(self) -> None:
        """Pinned inputs to the device, the plan's steps, the outputs to pinned memory."""
        runtime = self._cupy.cuda.runtime
        for name, buffer in self._inputs.items():
            if buffer.size:
                runtime.memcpyAsync(buffer.data.ptr, self._staged_inputs[name].ctypes.data,
                                    buffer.nbytes, runtime.memcpyHostToDevice, self.stream.ptr)
        self._run_steps()
        for head, host in zip(self._heads, self._staged_outputs):
            if head.size:
                source = head if head.flags.c_contiguous else self._cupy.ascontiguousarray(head)
                runtime.memcpyAsync(host.ctypes.data, source.data.ptr, host.nbytes,
                                    runtime.memcpyDeviceToHost, self.stream.ptr)

    def stats(self) -> dict[str, Any]:
        """Whether the plan replays as a CUDA graph, and why not when it does not."""
        stats = {"device": self.device.name, "cuda_graph": self.graph is not None,
                 "cuda_graph_error": self.graph_error, "eager_runs": self.eager_runs}
        if self._convolutions is not None:
            stats.update(self._convolutions.stats())
        return stats


def _copy_same_kind(target: np.ndarray, source: np.ndarray) -> None:
    np.copyto(target, source, casting="same_kind")
