"""`bench/dot_peak.py`: the register loop whose rate is the core's multiply-add ceiling."""

from __future__ import annotations

import pytest

from bench import dot_peak
from engine.cpu import host_features


@pytest.mark.parametrize("kind", ["fp32", "bf16"])
def test_the_loop_adds_each_product_to_every_accumulator(kind: str) -> None:
    """Four accumulators starting at 0..3, ten iterations of 1.5 × 2.5 each (in bf16, each
    float's upper half is 1.5 or 2.5 and its lower half zero): lane 0's sum is 6 + 4·10·3.75."""
    if kind == "bf16" and not host_features.bf16_dot_product():
        pytest.skip("the host has no AVX512_BF16")
    made = dot_peak.compiled(kind, 4)
    if made is None:
        pytest.skip("no LLVM JIT here")
    assert made[1](10, 0.5) == 156.0
    assert dot_peak.rate(kind, 4, 1000, rounds=1) > 0


def test_the_tile_loop_adds_each_weight_word_times_each_grid_vector() -> None:
    """Two rows by two vectors, ten steps of 1.5 × 2.5 (each float's upper half, its lower
    half zero): each of the four accumulators' lane 0 gains 3.75 a step, 150 in all; the
    rate of a longer loop is positive."""
    made = dot_peak.compiled_tile(2, 2)
    if made is None:
        pytest.skip("the host has no AVX512_BF16 or no LLVM JIT")
    a, b = dot_peak.tile_buffers(2, 2)
    assert made[1](10, a.ctypes.data, b.ctypes.data) == 150.0
    a, b = dot_peak.tile_buffers(2, 2, weight=0.0)
    assert made[1](10, a.ctypes.data, b.ctypes.data) == 0.0
    assert dot_peak.tile_rate(2, 2, 1000, rounds=1) > 0
