"""Products over column panels cut along K where A would not stay in a small L2."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cpu import cache_sizes, host_features, spin_pool
from engine.kernels import depth_split, gemm_bind, gemm_kernel

RNG = np.random.default_rng(5)
ZEN3_L2 = 512 << 10

needs_kernel = pytest.mark.skipif(not gemm_kernel.available(),
                                  reason="llvmlite cannot compile for this CPU")


class ScratchWorkspace:
    def derived(self, constant, tag, make):
        return make(constant)

    def zeroed(self, shape, dtype, tag):
        return np.zeros(shape, dtype)


def random(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape, dtype=np.float32)


@pytest.mark.parametrize(("depth", "count"), [(1152, 1), (1024, 1), (2048, 2), (2304, 2),
                                              (4608, 4)])
def test_a_small_l2_cuts_k_in_runs_whose_share_of_a_fits_half_of_it(depth: int,
                                                                    count: int) -> None:
    runs = depth_split.runs(49, depth, l2_bytes=ZEN3_L2, avx512=False)
    assert len(runs) == count
    assert runs[0][0] == 0 and runs[-1][1] == depth
    assert all(end == start for (_, end), (start, _) in zip(runs, runs[1:]))
    assert all(first % depth_split.STEP == 0 for first, _ in runs)
    assert all(49 * (end - first) * 4 <= ZEN3_L2 * depth_split.L2_SHARE + 49 * 4 * 16
               for first, end in runs)


@pytest.mark.parametrize(("l2_bytes", "avx512"), [(ZEN3_L2, True), (2 << 20, False)])
def test_avx512_hosts_and_large_l2s_keep_the_whole_product(l2_bytes: int,
                                                           avx512: bool) -> None:
    assert depth_split.runs(49, 4608, l2_bytes=l2_bytes, avx512=avx512) == [(0, 4608)]


def test_a_host_whose_l2_is_unknown_keeps_the_whole_product(monkeypatch) -> None:
    monkeypatch.setattr(cache_sizes, "l2_bytes", lambda: None)
    assert depth_split.runs(49, 4608, avx512=False) == [(0, 4608)]


def test_the_host_is_read_where_not_given(monkeypatch) -> None:
    monkeypatch.setattr(cache_sizes, "l2_bytes", lambda: ZEN3_L2)
    monkeypatch.setattr(host_features, "has", lambda flag: False)
    assert len(depth_split.runs(49, 4608)) == 4
    monkeypatch.setattr(host_features, "has", lambda flag: flag == "avx512f")
    assert depth_split.runs(49, 4608) == [(0, 4608)]


@needs_kernel
@pytest.mark.parametrize("depth", [2048, 4608])
def test_runs_of_k_sum_to_the_product_with_its_epilogue_after_the_sum(depth: int) -> None:
    a_source, b = random(depth, 49), random(depth, 96)
    a = a_source.T  # A as the transposed products read it: a view of the activation
    panels = gemm_kernel.pack_columns(b)
    frame, spare = np.full((49, 112), np.nan, np.float32), np.zeros((49, 112), np.float32)
    runs = depth_split.runs(49, depth, l2_bytes=ZEN3_L2, avx512=False)
    product = depth_split.bind(a, panels, frame, spare, 96, runs)
    assert isinstance(product, depth_split.DepthSplit) and len(product.parts) == len(runs)
    bias = random(96)
    product.with_epilogue(bias_columns=bias, low=0.0, high=3.0)()
    want = np.clip(a.astype(np.float64) @ b.astype(np.float64) + bias, 0.0, 3.0)
    np.testing.assert_allclose(frame[:, :96], want, rtol=1e-4, atol=2e-3)
    assert np.isnan(frame[:, 96:]).all()  # past C's columns: left alone


@pytest.mark.parametrize(("filters", "avx512", "row"), [(2048, False, 2064), (512, False, 528),
                                                        (128, False, 144), (960, False, 960),
                                                        (160, False, 160), (2048, True, 2048)])
def test_a_scratch_row_of_a_multiple_of_512_bytes_is_a_line_longer_on_avx2(
        monkeypatch, filters: int, avx512: bool, row: int) -> None:
    monkeypatch.setattr(host_features, "has", lambda flag: avx512 and flag == "avx512f")
    assert gemm_bind.scratch_row(filters) == row


@needs_kernel
@pytest.mark.parametrize("filters", [128, 96])  # 512-byte rows of scratch: made longer
def test_a_transposed_layer_on_a_small_l2_matches_the_reference(monkeypatch,
                                                                filters: int) -> None:
    monkeypatch.setattr(cache_sizes, "l2_bytes", lambda: ZEN3_L2)
    monkeypatch.setattr(host_features, "has", lambda flag: False)
    weight, data = random(filters, 2048), random(2048, 57)  # 57 columns: run transposed
    weight.flags.writeable = False
    out = np.full((filters, 57), np.nan, np.float32)
    call = gemm_bind.weight_product(np, weight, data, out, ScratchWorkspace())
    assert isinstance(call, gemm_bind.Transposed)
    assert isinstance(call.product, depth_split.DepthSplit)
    bias, other = random(filters), random(filters, 57)
    call = gemm_bind.with_bias([call], bias_rows=bias)[0].with_residual(out, other)
    call = gemm_bind.clamped([call], 0.0, 4.0)[0]
    call()
    want = weight.astype(np.float64) @ data.astype(np.float64) + bias[:, None] + other
    np.testing.assert_allclose(out, np.clip(want, 0.0, 4.0), rtol=1e-4, atol=2e-3)


@needs_kernel
@pytest.mark.parametrize("run", [(0, 0), (16, 8), (0, 65), (-16, 32)])
def test_a_run_of_k_must_lie_within_k(run: tuple[int, int]) -> None:
    panels = gemm_kernel.pack_columns(random(64, 16))
    with pytest.raises(ValueError, match="within 0..64"):
        gemm_kernel.bind_packed_columns(random(6, 64), panels, np.zeros((6, 16), np.float32),
                                        depths=run)


@needs_kernel
@pytest.mark.skipif(not spin_pool.available(), reason="llvmlite cannot compile for this CPU")
def test_armed_a_transposed_layer_copies_from_the_longer_scratch_rows(monkeypatch) -> None:
    monkeypatch.setattr(host_features, "has", lambda flag: False)
    weight, data = random(128, 40), random(40, 57)
    weight.flags.writeable = False
    out = np.full((128, 57), np.nan, np.float32)
    call = gemm_bind.weight_product(np, weight, data, out, ScratchWorkspace())
    assert call.source.strides == (4, (128 + 16) * 4)  # 512-byte rows made a line longer
    other = random(128, 57)
    call = call.with_residual(out, other)
    with spin_pool.armed(2):
        call()
        call()  # the fused job is made at the first armed run
    assert type(call.run._job) is spin_pool.Job
    want = weight.astype(np.float64) @ data.astype(np.float64) + other
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@needs_kernel
@pytest.mark.skipif(not spin_pool.available(), reason="llvmlite cannot compile for this CPU")
def test_armed_a_product_in_runs_of_k_spreads_each_run_and_matches(monkeypatch) -> None:
    monkeypatch.setattr(cache_sizes, "l2_bytes", lambda: ZEN3_L2)
    monkeypatch.setattr(host_features, "has", lambda flag: False)
    # ResNet-18's stride-2 layer into 7² (K 2304), over 57 columns: run transposed
    weight, data = random(256, 2304), random(2304, 57)
    weight.flags.writeable = False
    out = np.full((256, 57), np.nan, np.float32)
    call = gemm_bind.weight_product(np, weight, data, out, ScratchWorkspace())
    assert len(call.product.parts) >= 2
    bias = random(256)
    call = gemm_bind.clamped(gemm_bind.with_bias([call], bias_rows=bias), 0.0, 5.0)[0]
    with spin_pool.armed(2):
        call()
        call()
    want = np.clip(weight.astype(np.float64) @ data.astype(np.float64) + bias[:, None], 0, 5)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=2e-3)
