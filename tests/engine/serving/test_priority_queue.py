"""Priority levels and queue policies of the batcher (Triton's priority_levels, REJECT/DELAY)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
import pytest

from engine.errors import InputError
from engine.serving.batcher import BatchingPolicy, DynamicBatcher
from engine.serving.config import ModelConfig, parse_config
from engine.serving.errors import InvalidModel, Overloaded, QueueTimedOut, TimedOut
from engine.serving.priority_queue import LevelPolicy, PriorityPolicy, Scheduling
from tests.engine.serving.fakes import FakeModel


def run(coroutine: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, timeout))


def tagged(tag: int) -> dict[str, np.ndarray]:
    """One row whose values name the request, so the model's log shows the run order."""
    return {"data": np.full((1, 4), tag, np.float32)}


def run_order(model: FakeModel) -> list[int]:
    return [int(value) for batch in model.rows_seen for value in batch[:, 0]]


def policy(**levels: LevelPolicy) -> BatchingPolicy:
    """Batches of one row, two priority levels (2 by default), the given level policies."""
    policies = {int(name.removeprefix("level")): level for name, level in levels.items()}
    return BatchingPolicy(max_batch_size=1, max_queue_delay_s=0.0, priorities=PriorityPolicy(
        levels=2, default_level=2, policies=policies, enabled=True))


async def wait_until(condition: Callable[[], bool], bound_s: float = 20.0) -> None:
    deadline = time.monotonic() + bound_s
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.005)


async def blocked(batcher: DynamicBatcher, model: FakeModel) -> asyncio.Task[Any]:
    """A request holding the only batch slot until the test opens the model's gate."""
    model.gate.clear()
    task = asyncio.create_task(batcher.submit(tagged(0)))
    await wait_until(lambda: batcher.computing == 1)
    return task


def test_batches_take_the_highest_priority_level_first() -> None:
    model = FakeModel()

    async def main() -> None:
        async with DynamicBatcher(model.infer, policy(), name="fake") as batcher:
            first = await blocked(batcher, model)
            low = [asyncio.create_task(batcher.submit(tagged(100 + i),
                                                      scheduling=Scheduling(priority=2)))
                   for i in range(6)]
            high = [asyncio.create_task(batcher.submit(tagged(200 + i),
                                                       scheduling=Scheduling(priority=1)))
                    for i in range(3)]
            default = asyncio.create_task(batcher.submit(tagged(300)))
            await wait_until(lambda: batcher.queue_depth == 10)
            model.gate.set()
            await asyncio.gather(first, *low, *high, default)

    run(main())
    # After the running request: level 1 in arrival order, then level 2 (the default level).
    assert run_order(model) == [0, 200, 201, 202, 100, 101, 102, 103, 104, 105, 300]


def test_high_priority_p99_is_under_a_third_of_low_priority_under_load() -> None:
    model = FakeModel(delay_s=0.01)  # each batch takes at least 10 ms

    async def timed(batcher: DynamicBatcher, tag: int, priority: int) -> float:
        start = time.monotonic()
        await batcher.submit(tagged(tag), scheduling=Scheduling(priority=priority))
        return time.monotonic() - start

    async def main() -> tuple[list[float], list[float]]:
        batching = BatchingPolicy(max_batch_size=2, max_queue_delay_s=0.0,
                                  priorities=PriorityPolicy(levels=2, default_level=2,
                                                            enabled=True))
        async with DynamicBatcher(model.infer, batching, name="fake") as batcher:
            low = [asyncio.create_task(timed(batcher, 1000 + i, 2)) for i in range(80)]
            high = []
            for index in range(12):  # high-priority requests arrive while low ones queue
                await asyncio.sleep(0.015)
                high.append(asyncio.create_task(timed(batcher, 2000 + index, 1)))
            return list(await asyncio.gather(*high)), list(await asyncio.gather(*low))

    high, low = run(main())
    high_p99, low_p99 = np.percentile(high, 99), np.percentile(low, 99)
    assert high_p99 <= low_p99 / 3, (high_p99, low_p99)


def test_reject_answers_a_request_past_its_queue_timeout_naming_the_queue() -> None:
    model = FakeModel()
    reject = LevelPolicy(reject=True, timeout_s=0.05)

    async def main() -> None:
        async with DynamicBatcher(model.infer, policy(level2=reject), name="model 'm'") as batcher:
            first = await blocked(batcher, model)
            started = time.monotonic()
            with pytest.raises(QueueTimedOut) as caught:
                await batcher.submit(tagged(1), scheduling=Scheduling(priority=2))
            assert time.monotonic() - started >= 0.05
            # Level 1 has no timeout: it waits as long as the slot is busy.
            waiting = asyncio.create_task(batcher.submit(tagged(2),
                                                         scheduling=Scheduling(priority=1)))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            assert batcher.queue_depth == 1
            model.gate.set()
            await asyncio.gather(first, waiting)
            assert isinstance(caught.value, Overloaded)  # answered 503, as a full queue
            assert "model 'm'" in str(caught.value)
            assert "priority level 2 queue" in str(caught.value)
            assert batcher.stats.timed_out == 1

    run(main())
    assert run_order(model) == [0, 2]


def test_delay_keeps_a_timed_out_request_behind_its_levels_waiting_ones() -> None:
    model = FakeModel()
    delay = LevelPolicy(reject=False, timeout_s=None, allow_override=True)

    async def main() -> None:
        async with DynamicBatcher(model.infer, policy(level1=delay), name="fake") as batcher:
            first = await blocked(batcher, model)
            late = asyncio.create_task(batcher.submit(
                tagged(1), scheduling=Scheduling(priority=1, timeout_s=0.02)))
            await wait_until(lambda: batcher.queue_depth == 1)
            group = next(iter(batcher._groups.values()))
            await wait_until(lambda: any(request.delayed for request in group))
            fresh = asyncio.create_task(batcher.submit(tagged(2),
                                                       scheduling=Scheduling(priority=1)))
            low = asyncio.create_task(batcher.submit(tagged(3),
                                                     scheduling=Scheduling(priority=2)))
            await wait_until(lambda: batcher.queue_depth == 3)
            model.gate.set()
            await asyncio.gather(first, late, fresh, low)  # the delayed one is answered too

    run(main())
    # Within level 1 the delayed request follows the fresh one; it still beats level 2.
    assert run_order(model) == [0, 2, 1, 3]


@pytest.mark.parametrize("allowed", [True, False])
def test_a_request_shortens_its_queue_timeout_only_where_the_policy_allows(allowed: bool) -> None:
    model = FakeModel()
    level = LevelPolicy(reject=True, timeout_s=None, allow_override=allowed)

    async def main() -> None:
        async with DynamicBatcher(model.infer, policy(level2=level), name="fake") as batcher:
            first = await blocked(batcher, model)
            request = asyncio.create_task(batcher.submit(
                tagged(1), scheduling=Scheduling(priority=2, timeout_s=0.02)))
            await asyncio.wait((request,), timeout=0.5)
            assert request.done() is allowed
            model.gate.set()
            await first
            if allowed:
                with pytest.raises(QueueTimedOut):
                    request.result()
            else:
                await request  # the request's own timeout was ignored: it ran

    run(main())


def test_a_request_timeout_does_not_lengthen_the_levels() -> None:
    level = LevelPolicy(reject=True, timeout_s=0.05, allow_override=True)
    assert level.timeout_for(10.0) == 0.05
    assert level.timeout_for(0.01) == 0.01
    assert level.timeout_for(None) == 0.05
    assert LevelPolicy(timeout_s=0.05).timeout_for(0.01) == 0.05


def test_each_level_is_bounded_by_its_own_max_queue_size() -> None:
    model = FakeModel()

    async def main() -> None:
        bounded = LevelPolicy(max_queue_size=2)
        async with DynamicBatcher(model.infer, policy(level2=bounded), name="fake") as batcher:
            first = await blocked(batcher, model)
            queued = [asyncio.create_task(batcher.submit(tagged(i),
                                                         scheduling=Scheduling(priority=2)))
                      for i in range(2)]
            await wait_until(lambda: batcher.queue_depth == 2)
            with pytest.raises(Overloaded, match="priority level 2 queue is full"):
                await batcher.submit(tagged(9), scheduling=Scheduling(priority=2))
            other = asyncio.create_task(batcher.submit(tagged(3),
                                                       scheduling=Scheduling(priority=1)))
            await wait_until(lambda: batcher.queue_depth == 3)
            model.gate.set()
            await asyncio.gather(first, *queued, other)

    run(main())


def test_a_negative_priority_is_an_input_error() -> None:
    async def main() -> None:
        async with DynamicBatcher(FakeModel().infer, policy(), name="fake") as batcher:
            with pytest.raises(InputError, match="priority -1 is negative"):
                await batcher.submit(tagged(1), scheduling=Scheduling(priority=-1))

    run(main())


@pytest.mark.parametrize("priority", [0, 3, 7])
def test_a_priority_past_the_levels_joins_the_default_level(priority: int) -> None:
    """As Triton places it: 0, or more than priority_levels, is the default level."""
    levels = PriorityPolicy(levels=2, default_level=2)
    assert levels.level_of(priority, "fake") == 2
    assert levels.level_of(1, "fake") == 1


def test_without_queue_policies_a_request_timeout_is_a_deadline() -> None:
    model = FakeModel()

    async def main() -> None:
        async with DynamicBatcher(model.infer, BatchingPolicy(max_batch_size=1),
                                  name="fake") as batcher:
            first = await blocked(batcher, model)
            with pytest.raises(TimedOut):
                await batcher.submit(tagged(1), scheduling=Scheduling(timeout_s=0.02))
            # A model without levels serves every priority alike, as Triton does.
            prioritised = asyncio.create_task(
                batcher.submit(tagged(1), scheduling=Scheduling(priority=5)))
            await wait_until(lambda: batcher.queue_depth == 1)
            model.gate.set()
            await asyncio.gather(first, prioritised)

    run(main())


def test_the_oldest_wait_and_requests_computing_are_reported() -> None:
    model = FakeModel()

    async def main() -> None:
        async with DynamicBatcher(model.infer, policy(), name="fake") as batcher:
            assert batcher.oldest_wait_s() == 0.0
            first = await blocked(batcher, model)
            waiting = asyncio.create_task(batcher.submit(tagged(1)))
            await wait_until(lambda: batcher.queue_depth == 1)
            await asyncio.sleep(0.05)
            assert batcher.computing == 1
            assert 0.05 <= batcher.oldest_wait_s() < 20
            model.gate.set()
            await asyncio.gather(first, waiting)
            assert batcher.computing == 0 and batcher.oldest_wait_s() == 0.0

    run(main())


def test_config_sets_levels_and_policies_in_tritons_form() -> None:
    config = ModelConfig.model_validate({"dynamic_batching": {
        "priority_levels": 3, "default_priority_level": 2,
        "default_queue_policy": {"timeout_action": "DELAY",
                                 "default_timeout_microseconds": 5000},
        "priority_queue_policy": {"1": {"timeout_action": "REJECT",
                                        "default_timeout_microseconds": 1000,
                                        "allow_timeout_override": True,
                                        "max_queue_size": 8}}}})
    priorities = BatchingPolicy.from_config(config).priorities
    assert priorities.enabled and priorities.levels == 3 and priorities.default_level == 2
    assert priorities.policy(1) == LevelPolicy(True, 0.001, True, 8)
    assert priorities.policy(3) == LevelPolicy(False, 0.005, False, 0)
    assert not BatchingPolicy.from_config(ModelConfig()).priorities.enabled


@pytest.mark.parametrize(("batching", "message"), [
    ({"priority_levels": 2, "default_priority_level": 3}, "default_priority_level 3"),
    ({"priority_levels": 2}, "default_priority_level 0"),
    ({"default_priority_level": 1}, "needs priority_levels"),
    ({"priority_levels": 2, "default_priority_level": 1,
      "priority_queue_policy": {"5": {}}}, r"levels \[5\] are outside"),
    ({"default_queue_policy": {"timeout_action": "DROP"}}, "timeout_action"),
])
def test_bad_priority_settings_name_the_field(batching: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidModel, match=message) as caught:
        parse_config({"dynamic_batching": batching}, "m/config.json")
    assert "dynamic_batching" in str(caught.value)
