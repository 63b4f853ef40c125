"""The memory a call touches, read from Linux's page tables: no hardware counters needed.

Writing ``1`` to ``/proc/self/clear_refs`` clears the accessed bit of every page the process
maps; ``/proc/self/smaps`` then says, mapping by mapping, how many bytes of pages were read or
written since (``Referenced``). A transparent huge page has one such bit for its 2 MB, so a
process that counts turns them off for itself first (`no_huge_pages`, before it allocates what
it counts): each page is then 4 KB. The kernel may clear a bit itself between the call and the
reading (DAMON's physical-address monitoring and its pageout scheme do, where a host runs
them), so a count is at least what a call touched less such pages, never more: `touched_by`
keeps the largest of a few. Used by
`bench/footprint.py` in the project's environment and by `bench/quantized_peers.py --footprint`
in the peers' (standard library only).
"""

from __future__ import annotations

import ctypes
import re
import time
from collections.abc import Callable

PR_SET_THP_DISABLE = 41  # prctl(2)
_MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) ")


def no_huge_pages() -> None:
    """No transparent huge page for this process's memory from now on (Linux's prctl), so
    that `referenced` counts 4 KB pages."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_THP_DISABLE) refused")


def forget() -> None:
    """Every page of this process marked not accessed."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("1")


def referenced() -> list[tuple[int, int, int]]:
    """(start, end, bytes accessed since `forget`) of each mapping of this process."""
    mappings: list[tuple[int, int, int]] = []
    start = end = 0
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            found = _MAPPING.match(line)
            if found:
                start, end = int(found.group(1), 16), int(found.group(2), 16)
            elif line.startswith("Referenced:"):
                mappings.append((start, end, int(line.split()[1]) * 1024))
    return mappings


def resident_bytes() -> int:
    """The process's resident memory now (``VmRSS``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmRSS in /proc/self/status")


def touched_by(call: Callable[[], object], tries: int = 5,
               apart_s: float = 0.05) -> list[tuple[int, int, int]]:
    """`referenced` over ``call``: what it read or wrote, mapping by mapping. The call is
    counted ``tries`` times, ``apart_s`` apart, and each mapping keeps its largest count: a
    bit the kernel cleared behind the process's back only ever shortens a count, and a pass
    that clears them lasts a while."""
    largest: dict[tuple[int, int], int] = {}
    for attempt in range(tries):
        if attempt:
            time.sleep(apart_s)
        forget()
        call()
        for start, end, bytes_ in referenced():
            largest[start, end] = max(bytes_, largest.get((start, end), 0))
    return [(start, end, bytes_) for (start, end), bytes_ in largest.items()]
