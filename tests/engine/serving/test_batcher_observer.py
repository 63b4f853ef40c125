"""`DynamicBatcher`'s observer: each finished batch with its requests' contexts and times."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Coroutine
from typing import Any

import numpy as np

from engine.errors import ExecutionError
from engine.serving.batcher import BatchingPolicy, BatchRun, DynamicBatcher
from tests.engine.serving.fakes import FakeModel

CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="none")


def run(coroutine: Coroutine[Any, Any, Any], timeout: float = 30.0) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, timeout))


def rows(count: int, width: int = 4, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(count, width)).astype(np.float32)


def test_each_batch_is_observed_with_its_callers_contexts_and_times() -> None:
    model = FakeModel(delay_s=0.01)
    runs: list[BatchRun] = []

    async def caller(batcher: DynamicBatcher, index: int, count: int) -> float:
        CALLER.set(f"caller {index}")  # in this caller's task only
        before = time.monotonic()
        await batcher.submit({"data": rows(count, seed=index)})
        return before

    async def main() -> list[float]:
        # Preferred size 3: the three requests (1 + 2 rows) go as one batch, at once.
        policy = BatchingPolicy(max_batch_size=8, max_queue_delay_s=10.0,
                                preferred_batch_sizes=(3,), dispatch_when_idle=False)
        async with DynamicBatcher(model.infer, policy, observer=runs.append) as batcher:
            return await asyncio.gather(caller(batcher, 0, 1), caller(batcher, 1, 2))

    submitted = run(main())
    assert len(runs) == 1
    batch = runs[0]
    assert [context.run(CALLER.get) for context in batch.contexts] == ["caller 0", "caller 1"]
    assert batch.rows == (1, 2)
    assert batch.error is None
    for before, enqueued in zip(submitted, batch.enqueued):
        assert before <= enqueued <= batch.started
    assert batch.finished - batch.started >= 0.01  # the model's own delay


def test_a_failed_batch_is_observed_with_its_error() -> None:
    model = FakeModel(fail_width=3)
    runs: list[BatchRun] = []

    async def main() -> None:
        policy = BatchingPolicy(max_batch_size=4, max_queue_delay_s=0.001)
        async with DynamicBatcher(model.infer, policy, observer=runs.append) as batcher:
            try:
                await batcher.submit({"data": rows(1, 3)})
            except ExecutionError:
                return
        raise AssertionError("the batch did not fail")

    run(main())
    assert len(runs) == 1 and isinstance(runs[0].error, ExecutionError)
    assert runs[0].rows == (1,)
