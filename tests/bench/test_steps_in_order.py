"""`bench/steps_in_order.py`: a plan's steps timed in the order a run takes them."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.testing import assert_allclose

from bench import steps_in_order
from tests.engine.compiler.graphs import conv_bn_relu


def test_walking_twice_calls_each_step_twice_and_leaves_the_plan_as_it_was() -> None:
    import engine

    graph, constants = conv_bn_relu()
    model = engine.load_model(graph, constants)
    feed = {"data": np.random.default_rng(3).standard_normal((1, 2, 5, 5), dtype=np.float32)}
    expected = model.infer(feed)
    plan = model.plan_for(feed)
    steps = list(plan.steps)
    calls: list[int] = []
    counted = [dataclasses.replace(step, call=_counting(step.call, index, calls))
               for index, step in enumerate(steps)]
    plan.steps[:] = counted

    first, second = steps_in_order.walk_twice(plan, feed, time.perf_counter)

    assert len(first) == len(second) == len(steps)
    assert all(seconds >= 0 for seconds in first + second)
    # each step twice, in the plan's order, the second call right after the first
    assert calls == [index for index in range(len(steps)) for _ in range(2)]
    assert plan.steps == counted  # put back as they were
    plan.steps[:] = steps
    for name, values in model.infer(feed).items():
        assert_allclose(values, expected[name], rtol=1e-6, atol=1e-6)


def _counting(call: Callable[[], Any], index: int, calls: list[int]) -> Callable[[], None]:
    def counted() -> None:
        calls.append(index)
        call()
    return counted
