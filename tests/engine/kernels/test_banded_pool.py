"""A bf16 stem's product in bands with the max pooling after it run band by band
(`engine.kernels.banded_pool`): taken only where the pooling alone reads the stem, right
after it; the answers bit for bit those of the stem and pooling run apart, and near fp32."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import engine
from bench import nets
from engine import sym
from engine.cpu import parallel, spin_pool
from engine.kernels import banded_pool, gemm_kernel, max_pool_vector

pytestmark = pytest.mark.skipif(not gemm_kernel.available(gemm_kernel.AMX),
                                reason="needs AMX")


def answers(symbol: Any, params: dict, feed: dict, precision: str, threads: int,
            banded: bool = True) -> tuple[np.ndarray, list[Any]]:
    """The plan's answer on ``threads`` threads (run twice: the second run as the first)
    and its steps' calls; ``banded`` False: every pooling refuses the stem's offer."""
    before, take = parallel.threads(), banded_pool.take
    parallel.set_threads(threads)
    if not banded:
        banded_pool.take = lambda *_: False
    try:
        model = engine.load_model(symbol, params, optimize=True, precision=precision)
        plan = model.plan_for(feed)
    finally:
        parallel.set_threads(before)
        banded_pool.take = take
    first = np.array(plan.run(feed)[0])
    second = np.array(plan.run(feed)[0])
    np.testing.assert_array_equal(first, second)
    return first, [step.call for step in plan.steps]


def pooled_in_the_stem(calls: list[Any]) -> int:
    return sum(call is banded_pool.pooled_by_writer for call in calls)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 3])
def test_resnet18s_stem_pools_its_bands_as_the_pooling_pass_does(batch: int,
                                                                 threads: int) -> None:
    """ResNet-18's stem and max pooling at 112×112 (the stem's 56 rows: three whole bands
    and a short one): the pooling's step left empty, the answer the same bits as apart."""
    symbol = nets.resnet18_v1(classes=10)
    shape = (batch, 3, 112, 112)
    params = nets.random_params(symbol, shape, seed=11)
    feed = {"data": np.random.default_rng(batch).standard_normal(shape).astype(np.float32)}
    got, calls = answers(symbol, params, feed, "bf16", threads)
    assert pooled_in_the_stem(calls) == 1
    want, apart = answers(symbol, params, feed, "bf16", threads, banded=False)
    assert pooled_in_the_stem(apart) == 0
    np.testing.assert_array_equal(got, want)
    # the empty step keeps the plan one of steps that leave BLAS alone, as it was
    assert ([spin_pool.quiet_for_blas(call) for call in calls]
            == [spin_pool.quiet_for_blas(call) for call in apart])


def test_armed_the_stem_runs_whole_and_then_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run armed over the cores runs the stem's whole product and its pooling's whole job,
    as the two steps did apart: the same answer."""
    symbol = nets.resnet18_v1(classes=10)
    shape = (2, 3, 112, 112)
    params = nets.random_params(symbol, shape, seed=12)
    feed = {"data": np.random.default_rng(9).standard_normal(shape).astype(np.float32)}
    want, _ = answers(symbol, params, feed, "bf16", 1, banded=False)
    pooled: list[int] = []
    job = max_pool_vector.job

    def counted(data: np.ndarray, out: np.ndarray) -> Any:
        made = job(data, out)
        return lambda: (pooled.append(1), made())

    monkeypatch.setattr(spin_pool, "spinning", lambda: True)
    monkeypatch.setattr(max_pool_vector, "job", counted)
    got, calls = answers(symbol, params, feed, "bf16", 1)
    assert pooled_in_the_stem(calls) == 1
    assert len(pooled) == 2 * shape[0]  # two runs, each image's whole pooling
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_resnet18_with_its_stem_pooled_in_bands_stays_near_fp32(batch: int,
                                                                threads: int) -> None:
    symbol = nets.resnet18_v1(classes=100)
    shape = (batch, 3, 224, 224)
    params = nets.random_params(symbol, shape, seed=13)
    feed = {"data": np.random.default_rng(batch + 20).standard_normal(shape).astype(
        np.float32)}
    got, calls = answers(symbol, params, feed, "bf16", threads)
    assert pooled_in_the_stem(calls) == 1
    want, _ = answers(symbol, params, feed, "fp32", threads)
    assert np.abs(got - want).max() <= 0.03 * np.abs(want).max()


def stem(readers: str) -> Any:
    """A 7×7 stride-2 stem with its ReLU, read by a 3×3 stride-2 max pooling, and besides
    by an average pooling too (``two``) or by a sigmoid the stem's epilogue cannot take
    before the pooling (``sigmoid``)."""
    data = sym.Convolution(sym.var("data"), num_filter=64, kernel=(7, 7), stride=(2, 2),
                           pad=(3, 3), name="stem")
    data = sym.Activation(data, act_type="relu")
    if readers == "sigmoid":
        data = sym.Activation(data, act_type="sigmoid")
    pooled = sym.Pooling(data, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="max")
    if readers != "two":
        return pooled
    return pooled + sym.Pooling(data, kernel=(3, 3), stride=(2, 2), pad=(1, 1),
                                pool_type="avg")


@pytest.mark.parametrize("readers,taken", [("one", True), ("two", False),
                                           ("sigmoid", False)])
def test_the_stem_pools_only_where_the_pooling_alone_reads_its_final_output(
        readers: str, taken: bool) -> None:
    assert_pools_only_where_alone(readers, taken, (2, 3, 64, 80))


def assert_pools_only_where_alone(readers: str, taken: bool, shape: tuple[int, ...]) -> None:
    """`stem` with ``readers`` over ``shape``: the pooling taken into the stem's step as
    ``taken`` says, the answer the same bits as apart, and near fp32's."""
    symbol = stem(readers)
    params = nets.random_params(symbol, shape, seed=3)
    feed = {"data": np.random.default_rng(8).standard_normal(shape).astype(np.float32)}
    got, calls = answers(symbol, params, feed, "bf16", 1)
    assert pooled_in_the_stem(calls) == int(taken)
    want, _ = answers(symbol, params, feed, "bf16", 1, banded=False)
    np.testing.assert_array_equal(got, want)
    reference, _ = answers(symbol, params, feed, "fp32", 1)
    assert np.abs(got - reference).max() <= 0.03 * np.abs(reference).max()
