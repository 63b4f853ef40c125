"""A bf16 stem on the AVX-512 BF16 tile (no AMX), whose products already write its output a
band of rows at a time, with the max pooling after it run band by band
(`banded_pool.BandThenPool`): taken only where the pooling alone reads the stem, right after
it; the answers bit for bit those of the stem and pooling run apart."""

from __future__ import annotations

import numpy as np
import pytest

from bench import nets
from engine.cpu import spin_pool
from engine.kernels import banded_pool, gemm_kernel
from tests.engine.kernels.test_banded_pool import (
    answers,
    assert_pools_only_where_alone,
    pooled_in_the_stem,
)

pytestmark = pytest.mark.skipif(not gemm_kernel.available(gemm_kernel.BF16),
                                reason="needs the AVX-512 BF16 tile")


@pytest.fixture(autouse=True)
def without_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host as one with the AVX-512 BF16 tile alone (an AMX host has it too)."""
    monkeypatch.setattr(gemm_kernel, "available", lambda kernel=None: kernel != gemm_kernel.AMX)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 2])
def test_resnet18s_stem_pools_each_band_after_it(batch: int, threads: int) -> None:
    """ResNet-18's stem at 224×224 (its products 8 bands an image) and its max pooling: the
    pooling's step left empty, each band's product writing its rows into the band buffer
    (every image's the same), the band before's last rows copied above them, and its step
    pooling the rows it finishes, the answer the same bits as apart."""
    symbol = nets.resnet18_v1(classes=10)
    shape = (batch, 3, 224, 224)
    params = nets.random_params(symbol, shape, seed=11)
    feed = {"data": np.random.default_rng(batch).standard_normal(shape).astype(np.float32)}
    got, calls = answers(symbol, params, feed, "bf16", threads)
    assert pooled_in_the_stem(calls) == 1
    bands = [call for call in calls
             if isinstance(getattr(call, "product", None), banded_pool.BandThenPool)]
    assert len(bands) == 8 * batch and all(band.product.pooling.jobs for band in bands)
    buffer = bands[0].product.pooling.band
    c = gemm_kernel.CONTEXT_FIELDS["c"]
    for band in bands:
        tile = band.product
        assert tile.pooling.band is buffer
        assert gemm_kernel.residual_fits(int(tile.banded.context[c]), 4, buffer)
        assert (tile.pooling.copies[tile.index] is None) == (tile.index == 0)
    want, apart = answers(symbol, params, feed, "bf16", threads, banded=False)
    assert pooled_in_the_stem(apart) == 0
    np.testing.assert_array_equal(got, want)
    assert ([spin_pool.quiet_for_blas(call) for call in calls]
            == [spin_pool.quiet_for_blas(call) for call in apart])


@pytest.mark.parametrize("readers,taken", [("one", True), ("two", False),
                                           ("sigmoid", False)])
def test_the_tile_stem_pools_only_where_the_pooling_alone_reads_its_final_output(
        readers: str, taken: bool) -> None:
    """As on AMX (`assert_pools_only_where_alone`), over images whose stem runs in bands."""
    assert_pools_only_where_alone(readers, taken, (2, 3, 224, 160))
