"""What touching memory costs after a process left it idle: microseconds per 4 KB page.

`bench/executor.py`'s runtimes take turns, so each turn's first calls read weights and
activations their process has not touched for a second or more. On some of the VMs this
project is measured on, that costs far more than refilling the caches: a read of one cache
line per page, after the process slept, takes microseconds a page where back to back it
takes tens of nanoseconds, whatever runtime does the reading. Then every runtime's first
calls of a turn run several times their steady time, and the turn-based ratios say more
about the host than about the runtimes. `bench/executor.py` prints this figure before its
cases, so that a reader can tell which kind of machine a table was measured on.

Usage: ``python bench/idle_memory.py [megabytes]`` prints the cost after pauses of 0, 0.1
and 0.3 s, for memory on 4 KB pages and on transparent huge pages where Linux grants them.
"""

from __future__ import annotations

import mmap
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.kernels.workspace import HugePageArena  # noqa: E402 - this checkout's engine

PAGE_BYTES = 4096
PAUSES = (0.0, 0.1, 0.3)


def touch_cost(pages: np.ndarray, pause: float, rounds: int = 6) -> tuple[float, float]:
    """Microseconds per page of reading one float a page, the first time after ``pause``
    seconds asleep and the time right after it (medians over ``rounds``), by thread CPU time."""
    stride = PAGE_BYTES // pages.itemsize
    count = pages.size // stride
    first, second = [], []
    for _ in range(rounds):
        time.sleep(pause)
        for times in (first, second):
            start = time.thread_time()
            pages[::stride].sum()
            times.append((time.thread_time() - start) / count * 1e6)
    return statistics.median(first), statistics.median(second)


def memory(megabytes: int, huge_pages: bool) -> np.ndarray:
    """``megabytes`` of float64 written once, on huge pages where asked and granted, else on
    4 KB pages (NumPy's own memory of this size may be on huge pages: it asks for them)."""
    floats = (megabytes << 20) // 8
    if huge_pages:
        array = HugePageArena().empty(floats, np.float64)
    else:
        mapping = mmap.mmap(-1, floats * 8, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        advice = getattr(mmap, "MADV_NOHUGEPAGE", None)
        if advice is not None:
            mapping.madvise(advice)
        array = np.frombuffer(mapping, np.float64)
    array.fill(1.0)
    return array


def idle_page_cost(megabytes: int = 16, pause: float = 0.1) -> float:
    """Microseconds per 4 KB page to read memory first after ``pause`` seconds idle."""
    return touch_cost(memory(megabytes, huge_pages=False), pause)[0]


def main() -> None:
    megabytes = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    print(f"{megabytes} MB, one float read a 4 KB page, µs per page by thread CPU time "
          "(median of 6): first read after the pause / the read right after it")
    for huge_pages in (False, True):
        pages = memory(megabytes, huge_pages)
        for pause in PAUSES:
            first, second = touch_cost(pages, pause)
            print(f"  {'huge pages' if huge_pages else '4 KB pages':10}  pause {pause:.1f} s: "
                  f"{first:7.3f} / {second:7.3f}")


if __name__ == "__main__":
    main()
