"""Running a compiled `Plan` on the GPU: pinned-buffer I/O, one stream, CUDA graph replay."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

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

    A caller holding the plan (`PinnedRun`) may write a batch straight into `pinned_inputs`
    and call `run_pinned`: no host copy at all on this side.
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
        self.pinned_inputs = {name: device.pinned_empty(array.shape, array.dtype)
                              for name, array in inputs.items()}
        self._pinned = [(name, array, _rows(array)) for name, array in self.pinned_inputs.items()]
        # Per input, the first row from which its pinned buffer is known to hold zeros (its
        # row count: nothing known), so a short batch zeroes only rows a longer one wrote.
        self._zero_from = {name: _rows(array) for name, array in self.pinned_inputs.items()}
        self._staged_outputs = [device.pinned_empty(head.shape, head.dtype) for head in heads]
        # One reusable context: runs of a plan are serialised, and building CuPy's `Device`
        # on every run costs the batch-1 path for nothing.
        self._device_context = device.activate()
        self.graph: CapturedGraph | None = None
        # A plan with an op that reads its inputs on the host is never captured (not even tried).
        self.graph_error = capture_blocker if device.cuda_graphs else "disabled"
        self.eager_runs = 0

    def run(self, feed: Mapping[str, np.ndarray], copy_outputs: bool) -> list[np.ndarray]:
        """Upload ``feed``, compute, download the outputs; returns host arrays.

        An input with fewer rows than the plan's (a batch padded up to a bucket) fills the
        first rows of its pinned buffer; the rest are zeroed.
        """
        for name, pinned, rows in self._pinned:
            source = feed[name]
            if source.shape == pinned.shape:  # the usual case first: the batch-1 path
                np.copyto(pinned, source, casting="same_kind")
                self._zero_from[name] = rows
            elif source.ndim and source.shape[1:] == pinned.shape[1:]:
                np.copyto(pinned[:source.shape[0]], source, casting="same_kind")
                self._clear_tail(name, pinned, source.shape[0])
            else:  # a broadcastable value, or a misfit that numpy names
                np.copyto(pinned, source, casting="same_kind")
                self._zero_from[name] = rows
        self._launch_and_wait()
        outputs = self._staged_outputs
        return [output.copy() for output in outputs] if copy_outputs else list(outputs)

    def run_pinned(self, rows: int) -> list[np.ndarray]:
        """Compute with the first ``rows`` rows of every pinned input as the caller wrote them
        (the rest zeroed here); returns the pinned output buffers themselves."""
        for name, pinned, _ in self._pinned:
            if pinned.ndim:
                self._clear_tail(name, pinned, rows)
        self._launch_and_wait()
        return list(self._staged_outputs)

    def _clear_tail(self, name: str, pinned: np.ndarray, rows: int) -> None:
        """Rows from ``rows`` on hold zeros afterwards (rows before it were just written)."""
        zero_from = self._zero_from[name]
        if rows < zero_from:
            pinned[rows:zero_from] = 0
        self._zero_from[name] = rows

    def _launch_and_wait(self) -> None:
        graph = self.graph
        if graph is not None:  # the warm path: no stream context, the stream is explicit
            with self._device_context:
                graph.replay()
                self.stream.synchronize()
            return
        with self.device.activate(), self.stream:
            self._copies_and_steps()
            self.eager_runs += 1
            if self.graph_error is None and self.eager_runs >= WARMUP_RUNS:
                try:
                    self.graph = capture(self._copies_and_steps, self.stream, self._cupy)
                except Exception as error:  # a step cannot be captured: stay eager, say why
                    self.graph_error = f"{type(error).__name__}: {error}"
            self.stream.synchronize()

    def _copies_and_steps(self) -> None:
        """Pinned inputs to the device, the plan's steps, the outputs to pinned memory."""
        runtime = self._cupy.cuda.runtime
        for name, buffer in self._inputs.items():
            if buffer.size:
                runtime.memcpyAsync(buffer.data.ptr, self.pinned_inputs[name].ctypes.data,
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


class PinnedRun:
    """A GPU plan held for one run whose inputs the caller writes into its pinned buffers.

    Made by `Plan.reserve` with the plan's lock already taken: until `release`, no other run of
    that plan can touch the buffers, so a batch can be joined straight into them (no batch
    array, no second copy). Use as a context manager, or call `release` once.

    Example:
        >>> with plan.reserve() as held:
        ...     held.inputs["data"][:3] = rows
        ...     first = held.run(3)[0][:3].copy()
    """

    def __init__(self, executor: GpuExecutor, lock: threading.Lock) -> None:
        self.inputs: dict[str, np.ndarray] = executor.pinned_inputs
        self._executor = executor
        self._lock: threading.Lock | None = lock

    def run(self, rows: int) -> list[np.ndarray]:
        """Run with the first ``rows`` rows of `inputs` as written; returns the plan's pinned
        output buffers, valid until `release` (copy what you keep)."""
        if self._lock is None:
            raise RuntimeError("this PinnedRun was released; reserve the plan again")
        return self._executor.run_pinned(rows)

    def release(self) -> None:
        """Let other runs use the plan (and overwrite its buffers) again."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def __enter__(self) -> PinnedRun:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _rows(array: np.ndarray) -> int:
    return array.shape[0] if array.ndim else 0
