"""Pooling bound into plans (`engine.ops.nn.pool._pool_bind`) agrees with the reference kernel."""

from __future__ import annotations

import numpy as np
import pytest

from engine import sym
from engine.ops.nn import pool
from tests.engine.runtime.helpers import load_pair, run_allocation

RNG = np.random.default_rng(11)

CASES = [
    {"kernel": (3, 3), "stride": (2, 2), "pad": (1, 1), "pool_type": "max"},
    {"kernel": (3, 3), "stride": (2, 2), "pad": (1, 1), "pool_type": "avg"},
    {"kernel": (3, 3), "stride": (2, 2), "pad": (1, 1), "pool_type": "avg",
     "count_include_pad": False},
    {"kernel": (2, 2), "stride": (2, 2), "pool_type": "sum", "pooling_convention": "full"},
    {"kernel": (3,), "stride": (1,), "pad": (1,), "pool_type": "max"},
    {"kernel": (2, 3, 2), "stride": (1, 2, 1), "pad": (1, 0, 1), "pool_type": "max",
     "pooling_convention": "full"},
]


def negative_then_pool(**attrs):
    """Pooling of -relu(x): every value ≤ 0, so a zero border would wrongly win a max."""
    return sym.Pooling(sym.relu(sym.var("data")) * -1, name="pool", **attrs)


@pytest.mark.parametrize("attrs", CASES, ids=lambda attrs: "-".join(map(str, attrs.values())))
@pytest.mark.parametrize("chunk_bytes", [pool.CHUNK_BYTES, 1], ids=["whole", "per-sample"])
def test_bound_pooling_matches_reference(attrs: dict, chunk_bytes: int,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool, "CHUNK_BYTES", chunk_bytes)  # 1: three samples, three chunks
    shape = (3, 3, *(7, 8, 9)[:len(attrs["kernel"])])
    optimized, reference = load_pair(negative_then_pool(**attrs), shape, RNG)
    for _ in range(2):  # a second run: the border must still hold its fill value
        x = RNG.normal(size=shape).astype(np.float32)
        np.testing.assert_allclose(optimized.infer({"data": x})["pool_output"],
                                   reference.infer({"data": x})["pool_output"], rtol=1e-6)


def test_inputs_of_7_and_8_rows_keep_their_own_border() -> None:
    # A 2×2, stride-2 'full' pooling padded by 1 takes 10 rows for 8 rows (1 + 8 + 1) and for
    # 7 (1 + 7 + 2): one shared buffer would leave the 8-row input's last row in the 7-row
    # input's border.
    window = {"kernel": (2, 2), "stride": (2, 2), "pad": (1, 1), "pool_type": "max",
              "pooling_convention": "full"}
    data = sym.relu(sym.var("data")) * -1
    first = sym.Pooling(data, name="first", **window)
    shrink = sym.Pooling(data, kernel=(2, 2), stride=(1, 1), pool_type="max", name="shrink")
    second = sym.Pooling(shrink, name="second", **window)
    optimized, reference = load_pair(sym.Group([first, second]), (1, 2, 8, 8), RNG)
    for _ in range(3):
        x = RNG.normal(size=(1, 2, 8, 8)).astype(np.float32)
        for got, want in zip(optimized.infer({"data": x}).values(),
                             reference.infer({"data": x}).values()):
            np.testing.assert_allclose(got, want, rtol=1e-6)


def test_bound_pooling_allocates_nothing_per_run() -> None:
    optimized, _ = load_pair(negative_then_pool(**CASES[0]), (4, 16, 64, 64), RNG)
    feed = {"data": RNG.normal(size=(4, 16, 64, 64)).astype(np.float32)}
    peak, _ = run_allocation(optimized.plan_for(feed), feed, 10)
    # The padded input is 4 × 16 × 66 × 66 floats (1.1 MB) and the result between the two axes
    # half that: a run building either afresh would show here.
    assert peak < 128 * 1024, f"a run allocated up to {peak} bytes"
