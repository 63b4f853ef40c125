"""Warm-up's promise, checked by what a first request has left to do rather than by its time:
with ``model_warmup`` for a batch size, the first request of that size after READY compiles
no plan, runs no plan for the first time and makes no kernel job; without it, the first
request of a size the load did not run does one of those.

A plan still pays on its first run (kernels loaded, kernel jobs made, working memory
touched), so "no plan's first run after READY" is what makes the first request as fast as
the next ones. How much faster that makes it is a measurement, on a quiet machine:
``bench/warmup.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import nd
from engine.cpu import spin_pool
from engine.gluon.model_zoo.vision import get_model
from engine.runtime.plan import Plan
from engine.serving.manifest import PARAMS_NAME, SYMBOL_NAME
from engine.serving.repository import ModelRepository
from tests.engine.serving.helpers import run

SIDE = 48  # pixels: a real ResNet-18's plans, small enough to compile quickly
MAX_BATCH = 8  # the load compiles batch sizes 1, 2, 4 and 8 (powers of two) without samples


class FirstTimes:
    """What the process compiles and runs from now on: plans made (their input shapes),
    plans run (by identity) and kernel jobs made (`spin_pool.WhenArmed`'s)."""

    def __init__(self) -> None:
        self.compiled: list[dict[str, tuple[int, ...]]] = []
        self.ran: set[int] = set()
        self.jobs_made = 0

    def since(self, mark: tuple[int, set[int], int]) -> tuple[list, set[int], int]:
        """(plans compiled, plans run for the first time, jobs made) since ``mark``."""
        compiled, ran, jobs = mark
        return self.compiled[compiled:], self.ran - ran, self.jobs_made - jobs

    def mark(self) -> tuple[int, set[int], int]:
        return len(self.compiled), set(self.ran), self.jobs_made


@pytest.fixture
def first_times(monkeypatch: pytest.MonkeyPatch) -> Iterator[FirstTimes]:
    seen = FirstTimes()
    plan_init, plan_run = Plan.__init__, Plan.run
    armed_init = spin_pool.WhenArmed.__init__

    def compiling(self: Plan, graph: Any, input_shapes: Any, *args: Any, **kwargs: Any) -> None:
        seen.compiled.append(dict(input_shapes))
        plan_init(self, graph, input_shapes, *args, **kwargs)

    def running(self: Plan, *args: Any, **kwargs: Any) -> Any:
        seen.ran.add(id(self))
        return plan_run(self, *args, **kwargs)

    def counting_jobs(self: Any, make_job: Any, alone: Any) -> None:
        def make() -> Any:
            seen.jobs_made += 1
            return make_job()
        armed_init(self, make, alone)

    monkeypatch.setattr(Plan, "__init__", compiling)
    monkeypatch.setattr(Plan, "run", running)
    monkeypatch.setattr(spin_pool.WhenArmed, "__init__", counting_jobs)
    yield seen


@pytest.fixture(scope="module")
def resnet_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """ResNet-18 v1 (random weights) exported at SIDE x SIDE: symbol and parameter bytes."""
    folder = tmp_path_factory.mktemp("resnet18")
    net = get_model("resnet18_v1", classes=10)
    net.initialize()
    net.hybridize()
    net(nd.zeros((1, 3, SIDE, SIDE)))
    net.export(str(folder / "resnet"))
    return ((folder / "resnet-symbol.json").read_bytes(),
            (folder / "resnet-0000.params").read_bytes())


def repository(root: Path, files: tuple[bytes, bytes], warmup_sizes: tuple[int, ...]) -> Path:
    version = root / "resnet" / "1"
    version.mkdir(parents=True)
    (version / SYMBOL_NAME).write_bytes(files[0])
    (version / PARAMS_NAME).write_bytes(files[1])
    config = {"max_batch_size": MAX_BATCH,
              "inputs": [{"name": "data", "datatype": "FP32", "shape": [-1, 3, SIDE, SIDE]}],
              "dynamic_batching": {"max_queue_delay_us": 0},
              "model_warmup": [{"name": f"batch {rows}", "batch_size": rows,
                                "inputs": {"data": {"random_data": True}}}
                               for rows in warmup_sizes]}
    (root / "resnet" / "config.json").write_text(json.dumps(config))
    return root


def first_requests(root: Path, sizes: tuple[int, ...],
                   seen: FirstTimes) -> dict[int, tuple[list, set[int], int]]:
    """For each batch size in turn, what its first request after READY compiled, ran for the
    first time and made (`FirstTimes.since`)."""
    rng = np.random.default_rng(0)

    async def main() -> dict[int, tuple[list, set[int], int]]:
        repo = ModelRepository(root, require_manifest=False)
        await repo.start()  # returns once the version is READY
        try:
            assert [status.state for status in repo.index()] == ["READY"]
            found = {}
            for rows in sizes:
                mark = seen.mark()
                outputs = await repo.infer(
                    "resnet", {"data": rng.random((rows, 3, SIDE, SIDE), dtype=np.float32)})
                assert next(iter(outputs.values())).shape == (rows, 10)
                found[rows] = seen.since(mark)
            return found
        finally:
            await repo.close()

    return run(main(), timeout=600)


def test_after_warmup_a_first_request_compiles_runs_and_makes_nothing_for_the_first_time(
        tmp_path: Path, resnet_files: tuple[bytes, bytes], first_times: FirstTimes) -> None:
    # 3 and 6 are sizes the load compiles nothing for by itself; 4 it compiles anyway.
    sizes = (3, 4, 6)
    found = first_requests(repository(tmp_path, resnet_files, sizes), sizes, first_times)
    assert first_times.ran, "no plan ran: the counting saw nothing"
    for rows, (compiled, ran_first, jobs) in found.items():
        assert (compiled, ran_first, jobs) == ([], set(), 0), (
            f"batch {rows}'s first request after a warm-up of it compiled {compiled}, ran "
            f"{len(ran_first)} plan(s) for the first time and made {jobs} kernel job(s)")


def test_without_warmup_a_first_request_compiles_or_first_runs_a_plan(
        tmp_path: Path, resnet_files: tuple[bytes, bytes], first_times: FirstTimes) -> None:
    # The load compiles the plans of batch sizes 1, 2, 4 and 8 (and a split batch's parts)
    # and runs one row: sizes 3 and 4 are left a plan to compile or to run for the first time.
    sizes = (3, 4)
    found = first_requests(repository(tmp_path, resnet_files, ()), sizes, first_times)
    for rows, (compiled, ran_first, _) in found.items():
        assert compiled or ran_first, (
            f"batch {rows}'s first request without warm-up found every plan compiled and "
            "already run: the other test's check would hold without warm-up too")
