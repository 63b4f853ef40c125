"""``instance_group``: a served model's batches run that many at once, each on its share."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.cpu import blas_threads, thread_share
from engine.serving.cores import CoreBudget
from engine.serving.repository import ModelRepository
from tests.engine.serving.fakes import FakeModel, expected
from tests.engine.serving.helpers import fake_loader, fake_symbol, run


class Meeting(FakeModel):
    """A model whose batches, once `meeting` is set, each wait inside `infer` until two
    batches are inside at once (a barrier): they finish only if the server runs two side by
    side. (Unset while the load's own test runs go through.)"""

    def __init__(self, width: int) -> None:
        super().__init__(width)
        self.meeting: threading.Barrier | None = None
        self.seen: list[tuple[int | None, int, int]] = []

    def infer(self, inputs: Any) -> dict[str, np.ndarray]:
        if self.meeting is not None:
            self.seen.append((thread_share.cores(), thread_share.instance(),
                              blas_threads.threads()))
            self.meeting.wait()  # BrokenBarrierError once it waited its timeout alone
        return super().infer(inputs)


def serve_two_batches(tmp_path: Path, instances: int | None, wait_s: float) -> Meeting:
    """Two single-row requests at once (max_batch_size 1: two batches) to a model served with
    ``instances``; each answer checked."""
    models: list[Meeting] = []

    def loader(symbol: Path, params: Path, *, device: str = "cpu") -> Meeting:
        models.append(Meeting(fake_loader(symbol, params, device=device).width))
        return models[-1]

    config: dict[str, Any] = {"max_batch_size": 1}
    if instances is not None:
        config["instance_group"] = [{"count": instances, "kind": "KIND_CPU"}]

    async def main() -> None:
        repo = ModelRepository(tmp_path, loader=loader, stale_tmp_age_s=0)
        await repo.start()
        try:
            await repo.add_version("m", fake_symbol(width=4), b"weights", config=config)
            model = models[-1]
            model.meeting = threading.Barrier(2, timeout=wait_s)
            rows = [np.full((1, 4), value, np.float32) for value in (1.0, 2.0)]
            answers = await asyncio.gather(*(repo.infer("m", {"data": row}) for row in rows))
            for row, answer in zip(rows, answers):
                np.testing.assert_allclose(answer["out"], expected(model, row)["out"],
                                           rtol=1e-5)
        finally:
            await repo.close()

    run(main())
    return models[-1]


def test_two_instances_run_two_batches_of_one_model_at_once(tmp_path: Path) -> None:
    model = serve_two_batches(tmp_path, 2, wait_s=60)
    # Each batch as its own instance, on half the cores BLAS would use (at least one), BLAS
    # held to one thread (its count is the process's) while they overlap.
    share = max(1, min(blas_threads.threads(), CoreBudget().cores) // 2)
    held = 1 if blas_threads.numpy_openblas() is not None else blas_threads.threads()
    assert sorted(model.seen) == [(share, 0, held), (share, 1, held)]


def test_one_instance_runs_one_batch_at_a_time(tmp_path: Path) -> None:
    """The same two batches with the default of one instance never meet: the first waits
    alone until its barrier breaks (however long it waited, the second could not join)."""
    with pytest.raises(threading.BrokenBarrierError):
        serve_two_batches(tmp_path, None, wait_s=1)
