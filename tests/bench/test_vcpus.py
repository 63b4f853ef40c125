"""`bench/vcpus.py`: the cross-vCPU read probe the executor benchmark prints."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench import vcpus
from engine.cpu import spin_pool


def test_the_probe_reads_what_the_other_thread_wrote() -> None:
    if not spin_pool.available() or spin_pool.cores() < 2:
        pytest.skip("no spin pool or one core: nothing to compare")
    ratio = vcpus.cross_read_ratio(rounds=3)
    assert ratio is not None and math.isfinite(ratio) and ratio > 0
    first, second = vcpus._jobs["cross"].keep[1:3]
    count = vcpus.REGION_FLOATS
    # The last job copied each region, doubled, into the other's place in the second array.
    np.testing.assert_array_equal(second[:count], 2 * first[count:])
    np.testing.assert_array_equal(second[count:], 2 * first[:count])


def test_one_core_has_nothing_to_compare(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spin_pool, "cores", lambda: 1)
    assert vcpus.cross_read_ratio() is None
