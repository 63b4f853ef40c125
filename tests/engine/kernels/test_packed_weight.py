"""A dense weight held only as our GEMM's panels (`engine.kernels.packed_weight`): what is
packed, the weight rebuilt from the panels, and its products on one thread and spread."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cpu import spin_pool
from engine.kernels import gemm_bind, gemm_kernel, packed_weight
from engine.ops.registry import get_op

pytestmark = pytest.mark.skipif(not gemm_kernel.available(),
                                reason="llvmlite cannot compile for this CPU")

RNG = np.random.default_rng(11)


def random(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape, dtype=np.float32)


def test_the_weight_comes_back_exactly_from_its_panels() -> None:
    width = gemm_kernel.tile().columns
    weight = np.asfortranarray(random(2 * width + 5, 33))  # the last panel part zeros
    packed = packed_weight.pack(weight)
    assert packed.shape == weight.shape and packed.dtype == np.float32 and packed.ndim == 2
    assert packed.panels.shape == (3, 33, width)
    assert packed.nbytes == packed.panels.nbytes == 3 * 33 * width * 4
    again = packed.unpacked()
    assert np.array_equal(again, weight) and again.flags.f_contiguous
    assert again is not packed.unpacked()  # rebuilt on each call: nothing kept
    assert np.array_equal(np.asarray(packed), weight)
    assert np.asarray(packed, np.float64).dtype == np.float64


def test_what_is_packed() -> None:
    assert packed_weight.packs(random(256, 512))
    assert packed_weight.packs(np.asfortranarray(random(256, 512)))
    assert not packed_weight.packs(random(2, 512))  # 2 units fill no vector: BLAS's
    assert not packed_weight.packs(random(256, 512).astype(np.float64))
    assert not packed_weight.packs(random(256, 0))
    assert not packed_weight.packs(random(256))


def test_weights_over_the_limit_stay_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    weight = random(256, 512)
    monkeypatch.setattr(gemm_bind, "PACK_LIMIT_BYTES", weight.nbytes - 1)
    assert not packed_weight.packs(weight)


def test_a_product_is_ours_and_spread_where_blas_would_spread_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    weight, bias = random(256, 512), random(256)
    packed = packed_weight.pack(weight)
    small = random(16, 512)
    out = np.empty((16, 256), np.float32)
    call = packed_weight.product(small, packed, out)
    assert isinstance(call, gemm_kernel.Product)
    call()
    np.testing.assert_allclose(out, small.astype(np.float64) @ weight.T, rtol=1e-4, atol=1e-4)
    # 64 × 512 × 256: BLAS would take it on its threads; with the weight held packed, ours
    # takes them, armed around the product.
    left = random(64, 512)
    out = np.empty((64, 256), np.float32)
    call = packed_weight.product(left, packed, out)
    assert isinstance(call, gemm_bind.Spread)
    call = call.with_epilogue(bias_columns=bias).with_epilogue(low=0.0)
    want = np.maximum(left.astype(np.float64) @ weight.T + bias, 0)
    armed = []

    class Recording(spin_pool.armed):
        def __enter__(self) -> int:
            armed.append(True)
            return super().__enter__()

    monkeypatch.setattr(spin_pool, "armed", Recording)
    for threads, arms in ((2, [True]), (1, [])):
        monkeypatch.setattr(gemm_bind, "blas_threads", lambda threads=threads: threads)
        armed.clear()
        out[:] = np.nan
        call()
        assert armed == arms
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_operands_the_kernel_cannot_take_multiply_the_rebuilt_weight() -> None:
    weight, bias = random(256, 512), random(256)
    packed = packed_weight.pack(weight)
    data = random(3, 512).astype(np.float64)
    out = np.empty((3, 256), np.float64)
    assert packed_weight.product(data, packed, out) is None
    dense = get_op("FullyConnected")
    attrs = dense.parse_attrs({"num_hidden": "256"})
    calls = dense.bind_calls(np, attrs, [data, packed, bias], out)
    for call in calls:
        call()
    np.testing.assert_allclose(out, data @ weight.T.astype(np.float64) + bias, rtol=1e-6)
