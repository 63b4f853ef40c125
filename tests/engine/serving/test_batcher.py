"""DynamicBatcher: pure asyncio tests against a fake model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

import numpy as np
import pytest

from engine.errors import ExecutionError, InputError
from engine.serving.batcher import BatchingPolicy, DynamicBatcher
from engine.serving.config import ModelConfig
from engine.serving.errors import ModelNotReady, Overloaded, TimedOut
from tests.engine.serving.fakes import FakeModel, expected


def run(coroutine: Coroutine[Any, Any, Any], timeout: float = 30.0) -> Any:
    """Run a coroutine on a fresh event loop, bounded in time."""
    return asyncio.run(asyncio.wait_for(coroutine, timeout))


def rows(count: int, width: int = 4, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(count, width)).astype(np.float32)


def assert_rows(result: dict[str, np.ndarray], model: FakeModel, data: np.ndarray) -> None:
    want = expected(model, data)
    assert set(result) == set(want)
    for name in want:
        assert result[name].shape == want[name].shape
        np.testing.assert_allclose(result[name], want[name], rtol=1e-5, atol=1e-6)


def test_500_concurrent_single_rows_get_their_own_rows() -> None:
    model = FakeModel(delay_s=0.002)
    data = rows(500)

    async def main() -> list[dict[str, np.ndarray]]:
        policy = BatchingPolicy(max_batch_size=32, max_queue_delay_s=0.005)
        async with DynamicBatcher(model.infer, policy, name="fake") as batcher:
            results = await asyncio.gather(*(batcher.submit({"data": data[i:i + 1]})
                                             for i in range(500)))
            assert batcher.stats.succeeded == 500
            assert batcher.stats.batch_rows.count == len(model.batches)
        return results

    results = run(main())
    for index, result in enumerate(results):
        assert_rows(result, model, data[index:index + 1])
    sizes = [shape[0] for shape, _ in model.batches]
    assert sum(sizes) == 500
    assert max(sizes) > 1 and max(sizes) <= 32
    assert len(model.batches) < 100


def test_requests_of_several_rows_are_split_back_exactly() -> None:
    model = FakeModel()
    counts = [1, 3, 2, 5, 1, 4, 7, 2]
    datas = [rows(count, seed=index) for index, count in enumerate(counts)]

    async def main() -> list[dict[str, np.ndarray]]:
        policy = BatchingPolicy(max_batch_size=8, max_queue_delay_s=0.01)
        async with DynamicBatcher(model.infer, policy) as batcher:
            return await asyncio.gather(*(batcher.submit({"data": d}) for d in datas))

    for result, data in zip(run(main()), datas):
        assert_rows(result, model, data)
    assert all(shape[0] <= 8 for shape, _ in model.batches)


def test_lone_request_completes_within_queue_delay_plus_compute() -> None:
    model = FakeModel(delay_s=0.01)
    delay = 0.05

    async def main(when_idle: bool) -> float:
        policy = BatchingPolicy(max_batch_size=16, max_queue_delay_s=delay,
                                dispatch_when_idle=when_idle)
        async with DynamicBatcher(model.infer, policy) as batcher:
            started = time.monotonic()
            await batcher.submit({"data": rows(1)})
            return time.monotonic() - started

    waited = run(main(when_idle=False))
    assert delay <= waited < delay + model.delay_s + 0.25  # slack for a loaded CI machine
    immediate = run(main(when_idle=True))  # nothing was computing: no reason to wait
    assert model.delay_s <= immediate < delay

def test_idle_dispatch_waits_for_the_company_the_last_batch_had() -> None:
    model = FakeModel(delay_s=0.005)
    delay = 0.05

    async def main() -> tuple[float, float]:
        policy = BatchingPolicy(max_batch_size=16, max_queue_delay_s=delay)
        async with DynamicBatcher(model.infer, policy) as batcher:
            # Three callers queue before the dispatcher runs: one batch of 3. Three callers
            # again: as many rows as the last batch, so they go at once; then one caller alone
            # waits for the usual company.
            await asyncio.gather(*(batcher.submit({"data": rows(1, seed=i)}) for i in range(3)))
            started = time.monotonic()
            await asyncio.gather(*(batcher.submit({"data": rows(1, seed=i)}) for i in range(3)))
            three = time.monotonic() - started
            started = time.monotonic()
            await batcher.submit({"data": rows(1)})
            return three, time.monotonic() - started

    three, alone = run(main())
    assert [shape[0] for shape, _ in model.batches] == [3, 3, 1]
    assert three < delay
    assert delay <= alone < delay + model.delay_s + 0.25  # slack for a loaded CI machine


def test_waiting_for_a_busy_slot_does_not_use_up_the_queue_delay() -> None:
    # A caller that queues behind a long batch still gets its window to be joined once the
    # batch ends: the callers of that batch come back and run with it, not after it alone.
    model = FakeModel(delay_s=0.1)
    delay = 0.05

    async def main() -> None:
        policy = BatchingPolicy(max_batch_size=16, max_queue_delay_s=delay)
        async with DynamicBatcher(model.infer, policy) as batcher:
            first = asyncio.gather(*(batcher.submit({"data": rows(1, seed=i)}) for i in range(2)))
            await asyncio.sleep(0.01)
            behind = asyncio.ensure_future(batcher.submit({"data": rows(1, seed=2)}))
            await first  # `behind` has waited 90 ms, beyond its delay, for the slot
            await batcher.submit({"data": rows(1, seed=3)})
            await behind

    run(main())
    assert [shape[0] for shape, _ in model.batches] == [2, 2]


def test_preferred_size_dispatches_without_waiting_for_the_delay() -> None:
    model = FakeModel()

    async def main() -> float:
        policy = BatchingPolicy(max_batch_size=16, max_queue_delay_s=10.0,
                                preferred_batch_sizes=(4,))
        async with DynamicBatcher(model.infer, policy) as batcher:
            started = time.monotonic()
            await asyncio.gather(*(batcher.submit({"data": rows(1, seed=i)}) for i in range(4)))
            return time.monotonic() - started

    assert run(main()) < 1.0
    assert [shape[0] for shape, _ in model.batches] == [4]


def test_full_queue_raises_overloaded_with_retry_hint() -> None:
    model = FakeModel()
    model.gate.clear()

    async def main() -> None:
        policy = BatchingPolicy(max_batch_size=1, max_queue_delay_s=0.0, max_queue_size=2)
        async with DynamicBatcher(model.infer, policy) as batcher:
            first = asyncio.create_task(batcher.submit({"data": rows(1)}))
            while not batcher.stats.batches:
                await asyncio.sleep(0.001)  # the first request is running (blocked on the gate)
            queued = [asyncio.create_task(batcher.submit({"data": rows(1, seed=i)}))
                      for i in range(2)]
            await asyncio.sleep(0.01)
            assert batcher.queue_depth == 2
            with pytest.raises(Overloaded) as caught:
                await batcher.submit({"data": rows(1)})
            assert caught.value.retry_after > 0
            assert "max_queue_size 2" in str(caught.value)
            model.gate.set()
            await asyncio.gather(first, *queued)
            assert batcher.stats.rejected == 1 and batcher.stats.succeeded == 3

    run(main())


def test_deadline_raises_timed_out_and_the_request_never_runs() -> None:
    model = FakeModel()
    model.gate.clear()

    async def main() -> None:
        policy = BatchingPolicy(max_batch_size=1, max_queue_delay_s=0.0, default_timeout_s=0.05)
        async with DynamicBatcher(model.infer, policy) as batcher:
            first = asyncio.create_task(batcher.submit({"data": rows(1)}, timeout_s=5.0))
            while not batcher.stats.batches:
                await asyncio.sleep(0.001)
            started = time.monotonic()
            with pytest.raises(TimedOut):
                await batcher.submit({"data": np.full((1, 4), 7.0, np.float32)})
            assert 0.05 <= time.monotonic() - started < 1.0
            assert batcher.queue_depth == 0
            model.gate.set()
            await first
            assert batcher.stats.timed_out == 1

    run(main())
    assert not any((seen == 7.0).all() for seen in model.rows_seen)


def test_cancelled_request_is_removed_before_it_runs() -> None:
    model = FakeModel()
    model.gate.clear()

    async def main() -> None:
        policy = BatchingPolicy(max_batch_size=1, max_queue_delay_s=0.0)
        async with DynamicBatcher(model.infer, policy) as batcher:
            first = asyncio.create_task(batcher.submit({"data": rows(1)}))
            while not batcher.stats.batches:
                await asyncio.sleep(0.001)
            doomed = asyncio.create_task(
                batcher.submit({"data": np.full((1, 4), 9.0, np.float32)}))
            await asyncio.sleep(0.01)
            assert batcher.queue_depth == 1
            doomed.cancel()
            with pytest.raises(asyncio.CancelledError):
                await doomed
            assert batcher.queue_depth == 0
            model.gate.set()
            await first
            assert batcher.stats.cancelled == 1

    run(main())
    assert len(model.batches) == 1
    assert not any((seen == 9.0).all() for seen in model.rows_seen)


def test_differing_shapes_and_dtypes_are_never_combined() -> None:
    model = FakeModel()
    kinds = [(4, np.float32), (6, np.float32), (4, np.float64)]
    datas = [rows(1, width, seed=i).astype(dtype) for i, (width, dtype) in
             enumerate(kinds * 20)]

    async def main() -> list[dict[str, np.ndarray]]:
        policy = BatchingPolicy(max_batch_size=64, max_queue_delay_s=0.02)
        async with DynamicBatcher(model.infer, policy) as batcher:
            return await asyncio.gather(*(batcher.submit({"data": d}) for d in datas))

    for result, data in zip(run(main()), datas):
        assert_rows(result, model, data)
    assert {(shape[1:], dtype) for shape, dtype in model.batches} == {
        ((4,), np.dtype(np.float32)), ((6,), np.dtype(np.float32)), ((4,), np.dtype(np.float64))}
    assert len(model.batches) == 3


def test_error_in_one_batch_reaches_only_its_callers() -> None:
    model = FakeModel(fail_width=3)

    async def main() -> list[Any]:
        policy = BatchingPolicy(max_batch_size=16, max_queue_delay_s=0.01)
        async with DynamicBatcher(model.infer, policy) as batcher:
            calls = [batcher.submit({"data": rows(1, 3 if i % 2 else 4, seed=i)})
                     for i in range(10)]
            results = await asyncio.gather(*calls, return_exceptions=True)
            assert batcher.stats.failed == 5 and batcher.stats.succeeded == 5
            return results

    for index, result in enumerate(run(main())):
        if index % 2:
            assert isinstance(result, ExecutionError) and "fails on purpose" in str(result)
        else:
            assert isinstance(result, dict)


def test_outputs_that_lose_the_batch_dimension_fail_the_batch() -> None:
    async def main() -> None:
        def bad(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {"out": np.zeros((1, 2), np.float32)}

        policy = BatchingPolicy(max_batch_size=8, max_queue_delay_s=0.01)
        async with DynamicBatcher(bad, policy, name="bad") as batcher:
            results = await asyncio.gather(*(batcher.submit({"data": rows(1)}) for _ in range(3)),
                                           return_exceptions=True)
        assert all(isinstance(result, ExecutionError) for result in results)
        assert "batch dimension 1 for a batch of 3 rows" in str(results[0])

    run(main())


@pytest.mark.parametrize("inputs, message", [
    ({"data": np.zeros((9, 4), np.float32)}, "outside 1..max_batch_size 8"),
    ({"data": np.zeros((0, 4), np.float32)}, "outside 1..max_batch_size 8"),
    ({"data": np.float32(1.0)}, "is a scalar"),
    ({"a": np.zeros((2, 4)), "b": np.zeros((3, 4))}, "disagree on the batch size"),
    ({}, "non-empty mapping"),
])
def test_bad_requests_raise_input_error(inputs: dict[str, Any], message: str) -> None:
    async def main() -> None:
        async with DynamicBatcher(FakeModel().infer, BatchingPolicy(max_batch_size=8)) as batcher:
            with pytest.raises(InputError, match=message):
                await batcher.submit(inputs)

    run(main())


def test_inputs_a_caller_checked_are_taken_as_they_are() -> None:
    """With ``rows`` the caller vouches for its inputs (a server checked them against the
    config): the batcher neither checks nor copies them, and still batches and splits."""
    seen: list[Any] = []
    model = FakeModel()

    def infer(joined: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append(joined)
        return model.infer(joined)

    async def main() -> None:
        policy = BatchingPolicy(max_batch_size=8, max_queue_delay_s=10.0,
                                preferred_batch_sizes=(5,), dispatch_when_idle=False)
        async with DynamicBatcher(infer, policy) as batcher:
            first, second = {"data": rows(2, seed=2)}, {"data": rows(3, seed=3)}
            results = await asyncio.gather(batcher.submit(first, rows=2),
                                           batcher.submit(second, rows=3))
            assert_rows(results[0], model, first["data"])
            assert_rows(results[1], model, second["data"])
            assert seen[0]["data"].shape == (5, 4)
            single = {"data": rows(5, seed=4)}
            await batcher.submit(single, rows=5)
            assert seen[1] is single  # one request: its own mapping, not a checked copy

    run(main())


def test_close_drains_queued_requests_then_refuses_new_ones() -> None:
    model = FakeModel()

    async def main() -> None:
        policy = BatchingPolicy(max_batch_size=4, max_queue_delay_s=10.0)
        batcher = DynamicBatcher(model.infer, policy)
        batcher.start()
        pending = [asyncio.create_task(batcher.submit({"data": rows(1, seed=i)}))
                   for i in range(3)]
        await asyncio.sleep(0.01)
        await batcher.close()
        assert all(task.done() and not task.exception() for task in pending)
        with pytest.raises(ModelNotReady):
            await batcher.submit({"data": rows(1)})

    run(main())


def test_close_without_drain_refuses_what_is_queued() -> None:
    async def main() -> None:
        policy = BatchingPolicy(max_queue_delay_s=10.0, dispatch_when_idle=False)
        batcher = DynamicBatcher(FakeModel().infer, policy)
        batcher.start()
        pending = asyncio.create_task(batcher.submit({"data": rows(1)}))
        await asyncio.sleep(0.01)
        await batcher.close(drain=False)
        with pytest.raises(ModelNotReady):
            await pending

    run(main())


def test_stats_record_queue_and_compute_time_and_batch_sizes() -> None:
    model = FakeModel(delay_s=0.003)

    async def main() -> None:
        policy = BatchingPolicy(max_batch_size=8, max_queue_delay_s=0.002)
        async with DynamicBatcher(model.infer, policy) as batcher:
            await asyncio.gather(*(batcher.submit({"data": rows(1, seed=i)}) for i in range(40)))
            stats = batcher.stats.snapshot()
        assert stats.requests == stats.rows == stats.succeeded == 40
        assert stats.queue_time_s.count == 40
        assert stats.compute_time_s.count == stats.batches == len(model.batches)
        assert stats.compute_time_s.total >= 0.003 * stats.batches
        assert stats.batch_rows.total == 40
        assert stats.batch_rows.cumulative()[-1] == (float("inf"), stats.batches)

    run(main())


def test_policy_from_config_converts_microseconds() -> None:
    config = ModelConfig.model_validate({
        "max_batch_size": 16,
        "dynamic_batching": {"max_queue_delay_us": 2500, "preferred_batch_sizes": [8, 4],
                             "max_queue_size": 10, "timeout_us": 1_000_000}})
    policy = BatchingPolicy.from_config(config)
    assert policy == BatchingPolicy(16, 0.0025, (4, 8), 10, 1.0, 1)


class RecordingBuffers:
    """`BatchBuffers` that records what it was asked for and joins into its own arrays."""

    def __init__(self, model: FakeModel, log: list[Any], fail: bool = False) -> None:
        self.model, self.log, self.fail = model, log, fail
        self.released = 0

    def __call__(self, example: dict[str, np.ndarray], rows: int) -> RecordingBuffers:
        if self.fail:
            raise InputError("recording buffers: refused on purpose")
        self.log.append((example, rows))
        self.buffers = {name: np.full((rows, *array.shape[1:]), np.nan, array.dtype)
                        for name, array in example.items()}
        return self

    def run(self) -> dict[str, np.ndarray]:
        return self.model.infer(self.buffers)

    def __enter__(self) -> RecordingBuffers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.released += 1


def test_several_requests_are_joined_where_batch_buffers_says_and_a_lone_one_is_not() -> None:
    model = FakeModel()
    log: list[Any] = []
    buffers = RecordingBuffers(model, log)

    async def main() -> None:
        policy = BatchingPolicy(max_batch_size=8, max_queue_delay_s=10.0,
                                preferred_batch_sizes=(6,), dispatch_when_idle=False)
        async with DynamicBatcher(model.infer, policy, batch_buffers=buffers) as batcher:
            datas = [rows(count, seed=count) for count in (1, 3, 2)]
            results = await asyncio.gather(*(batcher.submit({"data": data}) for data in datas))
            for result, data in zip(results, datas):
                assert_rows(result, model, data)
            lone = rows(6, seed=9)
            assert_rows(await batcher.submit({"data": lone}), model, lone)

    run(main())
    assert len(log) == 1 and log[0][1] == 6 and log[0][0]["data"].shape == (1, 4)
    assert buffers.released == 1
    assert not np.isnan(model.rows_seen[0]).any()  # every row of the buffers was written
    assert [data.shape[0] for data in model.rows_seen] == [6, 6]


def test_batch_buffers_that_refuse_fail_only_that_batch() -> None:
    model = FakeModel()

    async def main() -> list[Any]:
        policy = BatchingPolicy(max_batch_size=8, max_queue_delay_s=10.0,
                                preferred_batch_sizes=(2,), dispatch_when_idle=False)
        async with DynamicBatcher(model.infer, policy,
                                  batch_buffers=RecordingBuffers(model, [], fail=True)) as batcher:
            return await asyncio.gather(*(batcher.submit({"data": rows(1, seed=i)})
                                          for i in range(2)), return_exceptions=True)

    results = run(main())
    assert all(isinstance(result, InputError) and "on purpose" in str(result)
               for result in results)
    assert not model.batches


def split_load(delay_s: float, rounds: int) -> list[int]:
    """The batch sizes of four callers that each come back 10 ms after their answer, two of
    them starting during the first batch (of 100 ms), so that the load starts split in two
    batches that take turns: each part's callers come back while the other part computes."""
    model = FakeModel(delay_s=0.1)

    async def caller(batcher: DynamicBatcher, index: int, start_after: float) -> None:
        await asyncio.sleep(start_after)
        for _ in range(rounds):
            await batcher.submit({"data": rows(1, seed=index)})
            await asyncio.sleep(0.01)

    async def main() -> None:
        policy = BatchingPolicy(max_batch_size=16, max_queue_delay_s=delay_s)
        async with DynamicBatcher(model.infer, policy) as batcher:
            await asyncio.gather(*(caller(batcher, index, 0.0 if index < 2 else 0.03)
                                   for index in range(4)))

    run(main())
    sizes = [shape[0] for shape, _ in model.batches]
    assert sum(sizes) == 4 * rounds
    return sizes


def test_a_load_split_in_two_joins_again_where_callers_come_back_after_the_delay() -> None:
    # With a 2 ms queue delay and one delay from the free slot, the queued part would go
    # alone for good (a batch per part per round); it waits for the part that comes back
    # instead, and the four run together.
    rounds = 10
    sizes = split_load(0.002, rounds)
    assert sizes[-1] == 4
    assert len(sizes) <= rounds + 3, sizes  # split for good: 2 * rounds


def test_a_zero_queue_delay_never_holds_a_request_for_company() -> None:
    rounds = 4
    assert split_load(0.0, rounds) == [2] * (2 * rounds)
