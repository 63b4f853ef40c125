"""Pooling bound into plans (`engine.ops.nn.pool._pool_bind`) agrees with the reference kernel."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import sym
from engine.ops.nn import pool
from tests.engine.runtime.helpers import load_pair, run_allocation, step_funcs

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


@pytest.mark.parametrize("shape", [(1, 512, 7, 7), (3, 5, 9, 11), (8, 4, 1, 1)])
def test_global_average_binds_one_product_matching_the_mean(shape: tuple) -> None:
    symbol = sym.Pooling(sym.var("data"), name="pool", global_pool=True, pool_type="avg",
                         kernel=(1, 1))
    model = engine.load_model(symbol, {}, optimize=True)
    x = RNG.normal(size=shape).astype(np.float32)
    plan = model.plan_for({"data": x})
    # One call, the product itself: no pass through the interpreter's `_pooling` per run.
    assert step_funcs(plan) == [np.dot]
    for _ in range(2):  # a second run reads the fresh input
        x = RNG.normal(size=shape).astype(np.float32)
        got = model.infer({"data": x})["pool_output"]
        assert got.dtype == np.float32 and got.shape == (*shape[:2], 1, 1)
        want = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attrs", [{"pool_type": "max"}, {"pool_type": "avg", "layout": "NHWC"},
                                   {"pool_type": "sum"}], ids=["max", "avg-nhwc", "sum"])
def test_other_global_poolings_keep_the_reference_kernel(attrs: dict) -> None:
    symbol = sym.Pooling(sym.var("data"), name="pool", global_pool=True, kernel=(1, 1),
                         **attrs)
    model = engine.load_model(symbol, {}, optimize=True)
    x = RNG.normal(size=(2, 6, 5, 5)).astype(np.float32)
    axes = (1, 2) if attrs.get("layout") == "NHWC" else (2, 3)
    want = {"max": np.max, "avg": np.mean, "sum": np.sum}[attrs["pool_type"]](
        x, axis=axes, keepdims=True)
    np.testing.assert_allclose(model.infer({"data": x})["pool_output"], want, rtol=1e-5,
                               atol=1e-6)
    assert np.dot not in step_funcs(model.plan_for({"data": x}))
