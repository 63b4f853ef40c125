"""`bench/idle_memory.py`: a page's first read after an idle pause, on 4 KB and huge pages."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import idle_memory
from engine.kernels.workspace import address

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc/self/smaps")


def mapping_flags(array: np.ndarray) -> list[str]:
    """The VmFlags of the mapping that holds ``array``'s first byte."""
    start, inside = address(array), False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        bounds = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if bounds:
            inside = int(bounds[1], 16) <= start < int(bounds[2], 16)
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError("no mapping holds the array")


@linux_only
def test_the_rows_lie_on_the_pages_they_name() -> None:
    # NumPy asks huge pages for arrays this large itself, so the 4 KB row refuses them.
    small, huge = idle_memory.memory(8, huge_pages=False), idle_memory.memory(8, huge_pages=True)
    assert small.nbytes == huge.nbytes == 8 << 20
    assert "nh" in mapping_flags(small) and "hg" not in mapping_flags(small)
    assert "hg" in mapping_flags(huge)
    assert small.min() == small.max() == huge.min() == huge.max() == 1.0  # written once


def test_a_read_costs_a_positive_time_a_page() -> None:
    first, second = idle_memory.touch_cost(idle_memory.memory(8, huge_pages=False), 0.0, 2)
    assert 0 < first < 1e3 and 0 < second < 1e3  # microseconds a page
