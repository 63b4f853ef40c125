"""A bf16 stem on the AVX-512 BF16 tile (no AMX), whose products already write its output a
band of rows at a time, with the max pooling after it run band by band
(`banded_pool.BandThenPool`): taken only where the pooling alone reads the stem, right after
it; the answers bit for bit those of the stem and pooling run apart."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bench import nets
from engine import sym
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


def preactivation_stem() -> Any:
    """ResNet-50 v2's head: a BatchNorm on the input (so that the stem reads a buffer of the
    plan's), the 7×7 stride-2 stem, its BatchNorm and ReLU, and the 3×3 stride-2 max pooling."""
    data = sym.BatchNorm(sym.var("data"), fix_gamma=True, eps=1e-5, name="data_bn")
    net = sym.Convolution(data, num_filter=64, kernel=(7, 7), stride=(2, 2), pad=(3, 3),
                          no_bias=True, name="stem_conv")
    net = sym.Activation(sym.BatchNorm(net, fix_gamma=False, eps=1e-5, name="stem_bn"),
                         act_type="relu")
    return sym.Pooling(net, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="max")


@pytest.mark.parametrize("batch", [1, 3])
def test_a_stem_reading_a_buffer_of_the_plan_pools_no_image_onto_a_later_ones_input(
        batch: int) -> None:
    """Where the stem reads a buffer of the plan's (ResNet v2's input BatchNorm), the
    pooling's output may lie on it, as the plan lays it out for a pooling run after the whole
    stem: pooled band by band, an image's rows would overwrite the next images' inputs before
    the stem reads them (at batch 3 the second and third images came out wrong). Every
    image's answer is the same bits as with the stem and pooling apart, and near fp32."""
    symbol = preactivation_stem()
    shape = (batch, 3, 224, 224)
    params = nets.random_params(symbol, shape, seed=5)
    feed = {"data": np.random.default_rng(batch).standard_normal(shape).astype(np.float32)}
    got, _ = answers(symbol, params, feed, "bf16", 1)
    want, _ = answers(symbol, params, feed, "bf16", 1, banded=False)
    np.testing.assert_array_equal(got, want)
    reference, _ = answers(symbol, params, feed, "fp32", 1)
    assert np.abs(got - reference).max() <= 0.03 * np.abs(reference).max()


def test_an_images_pooled_rows_may_lie_on_its_own_input_but_not_a_later_ones() -> None:
    """`banded_pool.pools_onto_later_input`: an image's own input is read before its bands
    pool; a later image's is read after."""
    memory = np.zeros(4 * 100, np.float32)
    data = memory.reshape(4, 100)
    # image 0's pooled rows on image 1's input
    assert banded_pool.pools_onto_later_input(memory[100:].reshape(4, 75), data)
    # each image's rows on its own input only, or one image
    assert not banded_pool.pools_onto_later_input(data[:, :25], data)
    assert not banded_pool.pools_onto_later_input(memory[:100].reshape(1, 100), data[:1])
    assert not banded_pool.pools_onto_later_input(np.zeros((4, 25), np.float32), data)
