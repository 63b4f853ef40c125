"""`bench/steps_in_order.py`: a plan's steps timed in the order a run takes them."""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
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


def test_the_report_lists_nodes_slowest_first_or_in_the_order_a_run_reaches_them(
        capsys: pytest.CaptureFixture[str]) -> None:
    import engine

    graph, constants = conv_bn_relu()
    model = engine.load_model(graph, constants)
    feed = {"data": np.zeros((1, 2, 5, 5), np.float32)}
    model.infer(feed)
    plan = model.plan_for(feed)
    steps = len(plan.steps)
    names = list(dict.fromkeys(step.node.name for step in plan.steps))
    # each step slower than all before it together: the later a node's last step, the slower
    per_run = [[2.0 ** index for index in range(steps)]] * 3
    listed = {}
    for in_order in (False, True):
        options = argparse.Namespace(net="n", batch=1, threads=1, runs=3, statistic="median",
                                     warm=0, top=len(names), node=[], in_order=in_order)
        steps_in_order.report("", plan, per_run, [1.0], options)
        rows = [line.split()[2] for line in capsys.readouterr().out.splitlines()
                if " ms  " in line]
        listed[in_order] = rows
    assert listed[True] == names
    last_step = {step.node.name: index for index, step in enumerate(plan.steps)}
    assert listed[False] == sorted(names, key=lambda name: -last_step[name])
    assert len(names) > 1
