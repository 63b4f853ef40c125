"""Where an int8 plan's packed weights and its layers' per-thread buffers lie: on transparent
huge pages (`workspace.HugePageArena`) by the rule a plan's own arrays follow
(`workspace.ARENA_FROM_BYTES`), else NumPy's memory.

A quantized layer packs its weights at its first run, once it knows its data's range, not
while the plan allocates its buffers; and an int8 plan's buffers are small (ResNet-18 at batch
1: 1.2 MB of activations, below `ARENA_FROM_BYTES`, against 11.7 MB of packed weights). So
each layer says at bind how many bytes its weights come to (`PlanMemory.expect`), and the
plan's packings take their arrays from one arena of its own (`PlanMemory.empty`) where those
bytes, or the plan's own arrays, reach the rule's threshold. All of a plan's layers bind
before any runs, so the first packing knows the total.

A layer's scratch (the channels-last copy, the sums: `Scratch`) is shared by every layer that
runs on one thread, whatever its plan; it is carved from that thread's arena on huge pages
for a layer whose plan is on huge pages.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from engine.kernels.workspace import ARENA_FROM_BYTES, HugePageArena, empty_aligned

# the tag of a plan's `PlanMemory` among the objects its workspace shares
TAG = "int8 plan memory"


class PlanMemory:
    """One plan's int8 weights: how many bytes its layers said they pack, and the arena
    their packings take memory from once that is `ARENA_FROM_BYTES` or more (or
    ``on_huge_pages`` from the start: the plan's own arrays are)."""

    def __init__(self, on_huge_pages: bool = False) -> None:
        self._plan_on_huge_pages = on_huge_pages
        self.expected = 0
        self._arena: HugePageArena | None = None

    def expect(self, nbytes: int) -> None:
        """Count ``nbytes`` more of weights a layer of the plan will pack (said at bind)."""
        self.expected += int(nbytes)

    @property
    def huge_pages(self) -> bool:
        """Whether the plan's packed weights and its layers' scratch lie on huge pages."""
        return self._plan_on_huge_pages or self.expected >= ARENA_FROM_BYTES

    @property
    def spans(self) -> list[tuple[int, int]]:
        """(address, bytes) of each mapping its arena made (none on NumPy's memory)."""
        return [] if self._arena is None else list(self._arena.spans)

    def empty(self, shape: int | tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array from a cache line's start for the plan's
        packed weights: from its arena where `huge_pages`, else NumPy's memory."""
        if not self.huge_pages:
            return empty_aligned(np, shape, dtype)
        if self._arena is None:
            self._arena = HugePageArena()
        return self._arena.empty(shape, dtype)


def of(workspace: Any) -> PlanMemory:
    """The `PlanMemory` of the plan ``workspace`` belongs to (one a plan, made on the first
    ask); a memory of its own, on NumPy's, without a workspace (a layer bound alone)."""
    if workspace is None or not hasattr(workspace, "shared"):
        return PlanMemory()
    on_huge_pages = getattr(workspace, "arena", None) is not None
    return workspace.shared(None, TAG, lambda: PlanMemory(on_huge_pages))


def packed_bytes(shape: tuple[int, ...]) -> int:
    """About what a layer's weights of ``shape`` take packed: a byte a weight (K's and the
    columns' padding left out)."""
    return math.prod(shape)


class Scratch:
    """Buffers by name, grown as needed (a job bound to an older, smaller one keeps it): a
    thread's, shared by the layers it runs one at a time. A buffer asked for on huge pages
    is carved from the thread's `HugePageArena`; one on NumPy's memory is kept apart, so a
    plan on huge pages never runs on another's NumPy buffer, nor the other way round."""

    def __init__(self) -> None:
        self.buffers: dict[tuple[str, bool], np.ndarray] = {}
        self._arena: HugePageArena | None = None

    def take(self, name: str, size: int, dtype: Any, huge_pages: bool = False) -> np.ndarray:
        """``size`` values of ``dtype`` of the buffer ``name`` (grown to hold them)."""
        nbytes = max(1, size * np.dtype(dtype).itemsize)
        key = (name, bool(huge_pages))
        buffer = self.buffers.get(key)
        if buffer is None or buffer.size < nbytes:
            if huge_pages:
                if self._arena is None:
                    self._arena = HugePageArena()
                buffer = self._arena.empty(nbytes, np.uint8)
            else:
                buffer = empty_aligned(np, nbytes, np.uint8)
            self.buffers[key] = buffer
        return buffer[:nbytes].view(dtype)


_scratch = threading.local()


def scratch() -> Scratch:
    """The calling thread's `Scratch`."""
    found = getattr(_scratch, "scratch", None)
    if found is None:
        found = _scratch.scratch = Scratch()
    return found
