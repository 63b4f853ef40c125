"""Batches joined straight into a GPU plan's pinned input buffers (`Model.batch_buffers`).

Each test runs on the CPU through the CuPy stand-in and, marked ``gpu``, on a real GPU. Results
are compared with the CPU executor on the same requests joined by ``np.concatenate``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine
from engine.cuda.executor import WARMUP_RUNS
from engine.errors import InputError
from engine.runtime.buffers import HostBatch, PlanBatch, join_rows
from engine.runtime.model import Model
from engine.runtime.signature import Signature
from engine.serving.batcher import BatchingPolicy, DynamicBatcher
from engine.serving.repository import ModelRepository
from tests.conformance.fixtures import model_files
from tests.engine.gpu import fake_cupy
from tests.engine.serving.helpers import SEED_MLP_CONFIG, seed_mlp

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
BUCKETS = (1, 2, 4, 8)


@pytest.fixture(params=["simulated", pytest.param("real", marks=pytest.mark.gpu)])
def gpu_model(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Model:
    """The seed MLP on the GPU (the stand-in or a real one), batched into `BUCKETS`."""
    if request.param == "simulated":
        fake_cupy.install(monkeypatch)
    model = engine.load_model(*model_files("seed_mlp"), device="gpu")
    model.batch_buckets = BUCKETS
    return model


@pytest.fixture(scope="module")
def cpu_model() -> Model:
    return engine.load_model(*model_files("seed_mlp"), device="cpu")


def requests_of(sizes: Sequence[int], seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"data": rng.normal(size=(rows, 512)).astype(np.float32)} for rows in sizes]


def run_joined(model: Model, requests: Sequence[dict[str, np.ndarray]]) -> dict[str, Any]:
    rows = sum(len(request["data"]) for request in requests)
    with model.batch_buffers(requests[0], rows) as batch:
        join_rows(batch.buffers["data"], [request["data"] for request in requests])
        return dict(batch.run())


def expected(cpu_model: Model, requests: Sequence[dict[str, np.ndarray]]) -> np.ndarray:
    joined = np.concatenate([request["data"] for request in requests])
    return next(iter(cpu_model.infer({"data": joined}).values()))


def plan_of(model: Model, rows: int, spare: bool = False) -> Any:
    entry = model._plans.get(Signature.of({"data": np.zeros((rows, 512), np.float32)}))
    return entry.spare if spare else entry.plan


def within(seconds: float, call: Any) -> Any:
    """``call()``'s result, failing (rather than hanging) when it blocks past ``seconds``."""
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert result, f"blocked for more than {seconds} s"
    return result[0]


# Sizes per batch, falling and rising so that a short batch follows a longer one in a bucket.
GROUPS = [[2, 3, 1, 2], [1, 2], [3], [1, 1, 1], [4, 4], [5], [2, 1, 1], [1, 1]]


def test_joined_batches_match_the_cpu_executor(gpu_model: Model, cpu_model: Model) -> None:
    for round_ in range(WARMUP_RUNS + 2):  # warm-up runs, capture, replays for every bucket
        for index, sizes in enumerate(GROUPS):
            requests = requests_of(sizes, seed=100 * round_ + index)
            outputs = run_joined(gpu_model, requests)
            (name, actual), = outputs.items()
            assert actual.shape == (sum(sizes), 2) and type(actual) is np.ndarray
            np.testing.assert_allclose(actual, expected(cpu_model, requests), **TOLERANCE)
    for rows in (2, 4, 8):
        assert plan_of(gpu_model, rows).execution_stats()["cuda_graph"] is True


def test_rows_are_written_into_the_plans_pinned_buffers_and_the_tail_zeroed(
        gpu_model: Model) -> None:
    run_joined(gpu_model, requests_of([4, 4], seed=1))  # fills all 8 rows of the bucket
    requests = requests_of([2, 3], seed=2)
    pinned = plan_of(gpu_model, 8)._gpu.pinned_inputs["data"]
    with gpu_model.batch_buffers(requests[0], 5) as batch:
        assert isinstance(batch, PlanBatch)
        buffer = batch.buffers["data"]
        assert buffer.shape == (5, 512) and np.shares_memory(buffer, pinned)
        join_rows(buffer, [request["data"] for request in requests])
        batch.run()
    np.testing.assert_array_equal(pinned[:5], np.concatenate([r["data"] for r in requests]))
    assert not pinned[5:].any(), "rows a longer batch left behind are zeroed before the run"


def test_a_held_plan_is_never_overwritten_and_the_next_batch_takes_its_spare(
        gpu_model: Model, cpu_model: Model) -> None:
    gpu_model.concurrent_runs = 2
    first, second = requests_of([3], seed=3), requests_of([1, 2], seed=4)
    with gpu_model.batch_buffers(first[0], 3) as held:
        join_rows(held.buffers["data"], [first[0]["data"]])
        assert plan_of(gpu_model, 4).busy
        with within(5.0, lambda: gpu_model.batch_buffers(second[0], 3)) as other:
            assert not np.shares_memory(other.buffers["data"], held.buffers["data"])
            assert plan_of(gpu_model, 4, spare=True).busy
            join_rows(other.buffers["data"], [request["data"] for request in second])
            np.testing.assert_allclose(next(iter(other.run().values())),
                                       expected(cpu_model, second), **TOLERANCE)
        np.testing.assert_allclose(next(iter(held.run().values())),
                                   expected(cpu_model, first), **TOLERANCE)
    assert not plan_of(gpu_model, 4).busy and not plan_of(gpu_model, 4, spare=True).busy


def test_three_instances_hold_three_plans_each_on_a_stream_of_its_own(
        gpu_model: Model, cpu_model: Model) -> None:
    """A model served with three instances: three batches joined at once each hold a copy of
    the plan (distinct pinned buffers, distinct streams) and give their own rows."""
    gpu_model.concurrent_runs = 3
    batches = [requests_of([3], seed=seed) for seed in (7, 8, 9)]
    with gpu_model.batch_buffers(batches[0][0], 3) as first, \
            within(5.0, lambda: gpu_model.batch_buffers(batches[1][0], 3)) as second, \
            within(5.0, lambda: gpu_model.batch_buffers(batches[2][0], 3)) as third:
        held = [first, second, third]
        entry = gpu_model._plans.get(Signature.of({"data": np.zeros((4, 512), np.float32)}))
        plans = [entry.plan, *entry.spares]
        assert len(plans) == 3 and all(plan.busy for plan in plans)
        assert len({id(plan._stream) for plan in plans}) == 3
        buffers = [batch.buffers["data"] for batch in held]
        assert not any(np.shares_memory(a, b) for i, a in enumerate(buffers)
                       for b in buffers[i + 1:])
        for batch, requests in zip(held, batches):
            join_rows(batch.buffers["data"], [requests[0]["data"]])
        for batch, requests in zip(held, batches):
            np.testing.assert_allclose(next(iter(batch.run().values())),
                                       expected(cpu_model, requests), **TOLERANCE)
    assert not any(plan.busy for plan in plans)


def test_a_run_waits_while_both_plans_are_held(gpu_model: Model, cpu_model: Model) -> None:
    gpu_model.concurrent_runs = 2
    requests = requests_of([1, 1], seed=5)
    lone = requests_of([2], seed=6)[0]
    results: list[np.ndarray] = []
    waiter = threading.Thread(
        target=lambda: results.append(next(iter(gpu_model.infer(lone).values()))))
    with gpu_model.batch_buffers(requests[0], 2) as held, \
            within(5.0, lambda: gpu_model.batch_buffers(requests[0], 2)):
        join_rows(held.buffers["data"], [request["data"] for request in requests])
        waiter.start()
        waiter.join(0.1)
        assert waiter.is_alive() and not results, "a run used a held plan's buffers"
        outputs = next(iter(held.run().values()))
    waiter.join(10)
    np.testing.assert_allclose(outputs, expected(cpu_model, requests), **TOLERANCE)
    np.testing.assert_allclose(results[0], expected(cpu_model, [lone]), **TOLERANCE)


def test_a_failed_join_releases_the_plan(gpu_model: Model) -> None:
    requests = requests_of([1, 2], seed=7)
    with pytest.raises(ValueError):
        with gpu_model.batch_buffers(requests[0], 4) as batch:  # 3 rows said to be 4
            join_rows(batch.buffers["data"], [request["data"] for request in requests])
    assert not plan_of(gpu_model, 4).busy


@pytest.mark.parametrize("example, message", [
    ({"pixels": np.zeros((1, 512), np.float32)}, "unknown input 'pixels'"),
    ({"data": np.zeros((1, 7), np.float32)}, "'data' shape \\[3, 7\\]"),
    ({"data": np.zeros((1, 512), object)}, "dtype object is not numeric"),
])
def test_requests_the_model_cannot_take_are_refused_by_name(
        gpu_model: Model, example: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(InputError, match=message):
        gpu_model.batch_buffers(example, 3)


def test_float64_requests_are_converted_while_joined(gpu_model: Model,
                                                     cpu_model: Model) -> None:
    requests = [{"data": request["data"].astype(np.float64)}
                for request in requests_of([1, 2], seed=8)]
    actual = next(iter(run_joined(gpu_model, requests).values()))
    np.testing.assert_allclose(actual, expected(cpu_model, requests), **TOLERANCE)


def test_the_batcher_joins_concurrent_requests_into_pinned_buffers(
        gpu_model: Model, cpu_model: Model) -> None:
    gpu_model.concurrent_runs = 2
    for rows in BUCKETS:  # as a server does at load: every plan and spare captured
        gpu_model.warm({"data": np.zeros((rows, 512), np.float32)})
    joined: list[int] = []
    original = gpu_model.batch_buffers

    def recording(example: dict[str, np.ndarray], rows: int) -> Any:
        batch = original(example, rows)
        assert isinstance(batch, PlanBatch)
        joined.append(rows)
        return batch

    sizes = [1, 3, 2, 1, 1, 4, 2, 1, 3, 1, 2, 2] * 3
    requests = requests_of(sizes, seed=9)
    policy = BatchingPolicy(max_batch_size=8, max_queue_delay_s=0.005,
                            max_concurrent_batches=2)

    async def serve() -> list[dict[str, np.ndarray]]:
        async with DynamicBatcher(gpu_model.infer, policy, batch_buffers=recording) as batcher:
            return await asyncio.gather(*(batcher.submit(request) for request in requests))

    results = asyncio.run(serve())
    assert joined, "several requests were joined at least once"
    assert all(plan_of(gpu_model, rows, spare).execution_stats()["cuda_graph"]
               for rows in BUCKETS for spare in (False, True))
    for request, result in zip(requests, results):
        np.testing.assert_allclose(next(iter(result.values())), expected(cpu_model, [request]),
                                   **TOLERANCE)


def test_the_cpu_path_joins_into_fresh_arrays_run_by_infer(cpu_model: Model) -> None:
    requests = requests_of([2, 1], seed=10)
    plan = cpu_model.plan_for({"data": np.zeros((3, 512), np.float32)})
    with cpu_model.batch_buffers(requests[0], 3) as batch:
        assert isinstance(batch, HostBatch) and not plan.busy
        assert all(not np.shares_memory(batch.buffers["data"], array)
                   for array in plan._inputs.values())
    assert plan.reserve() is None  # a CPU plan has no pinned buffers to hold
    joined = np.concatenate([request["data"] for request in requests])
    np.testing.assert_array_equal(next(iter(run_joined(cpu_model, requests).values())),
                                  next(iter(cpu_model.infer({"data": joined}).values())))



def test_a_served_gpu_model_joins_requests_into_pinned_buffers(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpu_model: Model) -> None:
    fake_cupy.install(monkeypatch)
    joined: list[int] = []
    run_plan_batch = PlanBatch.run

    def recording(batch: PlanBatch) -> dict[str, np.ndarray]:
        joined.append(batch._rows)
        return run_plan_batch(batch)

    monkeypatch.setattr(PlanBatch, "run", recording)
    requests = requests_of([1, 2, 1, 3, 1] * 4, seed=11)

    async def serve() -> list[dict[str, np.ndarray]]:
        repository = ModelRepository(tmp_path, device="gpu")
        await repository.start()
        try:
            await repository.add_version("mlp", *seed_mlp(), config={
                **SEED_MLP_CONFIG, "max_batch_size": 8,
                "dynamic_batching": {"max_queue_delay_us": 20000}})
            return await asyncio.gather(*(repository.infer("mlp", request)
                                          for request in requests))
        finally:
            await repository.close()

    results = asyncio.run(serve())
    assert joined and all(rows > 1 for rows in joined)
    for request, result in zip(requests, results):
        np.testing.assert_allclose(next(iter(result.values())), expected(cpu_model, [request]),
                                   **TOLERANCE)
