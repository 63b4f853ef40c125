"""Shared by the plan tests: model pairs built from a symbol, and per-run allocation."""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np

import engine
from engine.kernels import jobs


def load_pair(symbol: Any, data_shape: tuple, rng: np.random.Generator) -> tuple:
    """(optimised, reference) models of ``symbol`` with the same random float32 parameters."""
    args, _, _ = symbol.infer_shape(data=data_shape)
    params = {name: rng.normal(size=shape).astype(np.float32)
              for name, shape in zip(symbol.list_arguments(), args) if name != "data"}
    return (engine.load_model(symbol, params, optimize=True),
            engine.load_model(symbol, params, optimize=False))


def run_allocation(plan: Any, feed: dict[str, np.ndarray], runs: int,
                   warm_runs: int = 8) -> tuple[int, int]:
    """(peak, kept) bytes Python allocated over ``runs`` runs of a plan run ``warm_runs``
    times first: by default past the runs that make each way of running's jobs and record
    them (armed and on one thread in turn at first, `spin_pool.Choice`; two recorded runs
    each before its steady runs replay, `engine.cpu.steady_walk`)."""
    for _ in range(warm_runs):
        plan.run(feed, copy_outputs=False)
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(runs):
            plan.run(feed, copy_outputs=False)
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - before, after - before


def step_funcs(plan: Any) -> list[Any]:
    """The function each step of ``plan`` binds (a job made of a kernel call: the kernel
    call's, see `jobs.source`), None for a step that is no bound function."""

    return [getattr(jobs.source(step.call), "func", None) for step in plan.steps]


def compiled_rows(monkeypatch: Any) -> list[int]:
    """The rows of every plan any model compiles from now on (spares and replicas too),
    recorded by a spy on `PlanCache.compile` that ``monkeypatch`` takes away afterwards."""
    from engine.runtime.plan_cache import PlanCache

    rows: list[int] = []
    compile_plan = PlanCache.compile

    def spy(cache: PlanCache, signature: Any) -> Any:
        rows.append(signature.rows())
        return compile_plan(cache, signature)

    monkeypatch.setattr(PlanCache, "compile", spy)
    return rows
