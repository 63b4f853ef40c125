"""Model control under a memory budget: which loaded model to unload first, the counts of
loads, unloads and evictions per model, and giving freed memory back to the system.

The repository (`repository.py`) decides when; this module holds the rules it applies:

- a model may be evicted only when every copy of it is idle (no request queued or running)
  and its config does not pin it (``"pinned": true``);
- among those, the least recently used goes first (its newest use across its versions).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from engine.serving.loaded import LoadedVersion

log = logging.getLogger(__name__)
Event = Literal["load", "unload", "eviction"]
# How long a load waits for a busy model to finish its requests, to unload it, before it
# fails for want of room: requests take milliseconds, a model's load seconds.
IDLE_WAIT_S = 10.0


@dataclass
class ControlCounts:
    """Loads, unloads and evictions per model since start (an eviction is also an unload);
    the metrics read them at scrape time."""

    counts: Counter[tuple[str, Event]] = field(default_factory=Counter)

    def add(self, name: str, event: Event) -> None:
        """Count one event of a model."""
        self.counts[(name, event)] += 1

    def of(self, event: Event) -> dict[str, int]:
        """Each model's count of `event`."""
        return {name: count for (name, kind), count in self.counts.items() if kind == event}


def evictable(copies: Iterable[LoadedVersion]) -> bool:
    """Whether a model whose serving copies are `copies` may be unloaded to make room: none
    pinned by its config, none with a request queued or running."""
    return all(not copy.config.pinned and copy.idle for copy in copies)


def least_recently_used(serving: Mapping[str, list[LoadedVersion]], *,
                        keep: str) -> str | None:
    """The evictable model (never `keep`, the one being loaded) used longest ago; None when
    none may go."""
    candidates = [(max(copy.last_used for copy in copies), name)
                  for name, copies in serving.items()
                  if name != keep and copies and evictable(copies)]
    return min(candidates)[1] if candidates else None


def busy_but_evictable(serving: Mapping[str, list[LoadedVersion]], *, keep: str) -> bool:
    """Whether some model (not `keep`) could make room once its requests finish: not
    pinned, but serving requests now."""
    return any(name != keep and copies and not any(copy.config.pinned for copy in copies)
               and not evictable(copies) for name, copies in serving.items())


def describe_holders(sizes: Iterable[tuple[LoadedVersion, int]]) -> str:
    """What holds memory, for an error message: each copy's bytes and why it stays."""
    parts = []
    for copy, size in sorted(sizes, key=lambda pair: -pair[1]):
        why = ("pinned" if copy.config.pinned else "busy" if not copy.idle else "idle")
        parts.append(f"{copy.name!r} version {copy.version} {size} bytes ({why})")
    return ", ".join(parts) or "nothing loaded"


def _malloc_trim() -> ctypes._CFuncPtr | None:
    """glibc's ``malloc_trim``, where the C library has it (not on musl or macOS)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def reclaim_memory() -> None:
    """After an unload: collect the cycles that may still hold its arrays, then hand the free
    pages of glibc's heaps back to the system. Arrays above glibc's mmap threshold go back
    when freed; the smaller ones (biases, plans' buffers, the loader's temporaries) leave free
    pages inside the arenas, which RSS keeps counting until trimmed (64 MiB after one 100 MB
    MLP). Runs on a worker thread: a trim of a large heap takes milliseconds."""
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)
