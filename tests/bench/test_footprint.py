"""`bench/footprint.py` and `bench/touched_memory.py`: the memory a run touches, by the page."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest

from bench import footprint, touched_memory

MB = 1 << 20

needs_clear_refs = pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(),
                                      reason="Linux's per-page accessed bits are not here")


@needs_clear_refs
def test_a_call_is_counted_by_the_pages_it_reads_or_writes() -> None:
    """Of a fresh 8 MB mapping, a call writing its first MB and one reading its last MB touch
    those MB (a 2 MB huge page at most where the system backs it with them), and nothing of a
    mapping neither touches."""
    touched = mmap.mmap(-1, 8 * MB)
    untouched = mmap.mmap(-1, 8 * MB)
    pages = np.frombuffer(touched, np.uint8)
    pages[:] = 1  # every page in memory: none is touched for the first time below
    np.frombuffer(untouched, np.uint8)[:] = 1
    start = pages.ctypes.data
    other = np.frombuffer(untouched, np.uint8).ctypes.data

    def call() -> None:
        pages[:MB:4096] = 2
        assert int(pages[-MB::4096].sum()) == MB // 4096

    # A host may clear accessed bits behind the process's back (DAMON's physical-address
    # monitor samples pages so, its pageout scheme walks whole regions): `touched_by` keeps the
    # largest of its tries' counts, spread over a second here.
    mappings = touched_memory.touched_by(call, tries=20)
    counted = [bytes_ for low, high, bytes_ in mappings if low <= start < high]
    assert len(counted) == 1 and 2 * MB <= counted[0] <= 6 * MB
    assert [bytes_ for low, high, bytes_ in mappings if low <= other < high] == [0]


def test_touched_bytes_go_to_the_part_whose_arena_mapped_them() -> None:
    mappings = [(0x1000, 0x5000, 300), (0x8000, 0x9000, 20), (0x9000, 0xA000, 1),
                (0x20000, 0x30000, 4000)]
    spans = {"derived": [(0x8040, 100)], "plan": [(0x1000, 0x4000), (0x9000, 10)]}
    assert footprint.attribute(mappings, spans) == {"weights": 20, "plan": 301, "elsewhere": 4000}
    assert footprint.attribute(mappings, {"derived": [], "plan": []}) == {
        "weights": 0, "plan": 0, "elsewhere": 4321}
