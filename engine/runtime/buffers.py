"""Filling a plan's preallocated input buffers, on the CPU or in pinned host memory, and
joining a batch's requests into one set of input buffers (`BatchBuffers`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np


def fill_rows(buffer: Any, array: Any, copy: Callable[[Any, Any], Any] | None = None) -> None:
    """``array`` into ``buffer``; when it has fewer rows (a batch padded up to a bucket), into
    the first rows, with the others zeroed. ``copy(target, source)`` defaults to assignment."""
    if copy is None:
        copy = _assign
    if array.shape == buffer.shape or not getattr(array, "ndim", 0) \
            or array.shape[1:] != buffer.shape[1:]:
        copy(buffer, array)  # the usual case first: one tuple comparison on the batch-1 path
        return
    rows = array.shape[0]
    copy(buffer[:rows], array)
    buffer[rows:] = 0


def _assign(target: Any, source: Any) -> None:
    target[...] = source


def join_rows(buffer: np.ndarray, arrays: Sequence[np.ndarray]) -> None:
    """``arrays`` one after another along axis 0 into ``buffer``, which has exactly their rows
    (converted as ``same_kind`` casting allows)."""
    np.concatenate(arrays, out=buffer, casting="same_kind")


class BatchBuffers(Protocol):
    """Input buffers a batch's requests are joined into, and the run of what was joined.

    ``buffers`` holds one host array per input with exactly the batch's rows; write every row
    (`join_rows`), then call `run` once. Use it as a context manager: leaving it lets others use
    whatever it held (a plan on the GPU).
    """

    buffers: Mapping[str, np.ndarray]

    def run(self) -> Mapping[str, np.ndarray]:
        """The model's outputs for the joined rows, by name (arrays the caller may keep)."""
        ...

    def __enter__(self) -> BatchBuffers: ...

    def __exit__(self, *exc_info: object) -> None: ...


class HostBatch:
    """`BatchBuffers` as fresh host arrays run by ``infer``: the plain join (on the CPU a plan
    has no buffers worth writing into from outside)."""

    def __init__(self, example: Mapping[str, np.ndarray], rows: int,
                 infer: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]) -> None:
        self.buffers = {name: np.empty((rows, *array.shape[1:]), array.dtype)
                        for name, array in example.items()}
        self._infer = infer

    def run(self) -> Mapping[str, np.ndarray]:
        """``infer`` on the joined arrays."""
        return self._infer(self.buffers)

    def __enter__(self) -> HostBatch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


class HeldPlan(Protocol):
    """A plan held for one run with its input buffers open to the caller (`PinnedRun`)."""

    inputs: Mapping[str, np.ndarray]

    def run(self, rows: int) -> list[np.ndarray]: ...

    def release(self) -> None: ...


class PlanBatch:
    """`BatchBuffers` that are the first rows of a held plan's own input buffers (a GPU plan's
    pinned memory): the requests are copied once, straight to where the device reads them.

    The plan may be compiled for more rows (a bucket); the rest of its buffers are zeroed when
    it runs, and outputs with the bucket's rows are cut back to the batch's.
    """

    def __init__(self, held: HeldPlan, rows: int, output_names: Sequence[str]) -> None:
        self.buffers = {name: buffer[:rows] for name, buffer in held.inputs.items()}
        self._held = held
        self._rows = rows
        self._bucket = next((buffer.shape[0] for buffer in held.inputs.values() if buffer.ndim),
                            rows)
        self._output_names = output_names

    def run(self) -> dict[str, np.ndarray]:
        """Run the held plan; outputs are copied out of its buffers (kept past `release`)."""
        rows, bucket = self._rows, self._bucket
        return {name: output[:rows].copy() if output.ndim and output.shape[0] == bucket
                else output.copy()
                for name, output in zip(self._output_names, self._held.run(rows))}

    def __enter__(self) -> PlanBatch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._held.release()
