"""A new kernel's call plugs into the CPU runtime through `engine.cpu.parts` alone: the
batch splitter, the spin pool's BLAS check and the plan's job choice ask the call, never which
kernel it is."""

from __future__ import annotations

from functools import partial

import numpy as np

from engine.cpu import parallel, parts, spin_pool
from engine.kernels import jobs


def double_rows(source: np.ndarray, target: np.ndarray, first: int = 0,
                last: int | None = None) -> None:
    np.multiply(source[first:last], 2, out=target[first:last])


class DoubleRows(parts.PartedCall):
    """A kernel defined only here: rows cut for slabs, the whole as its "job"."""

    leaves_blas_alone = True

    def slabs(self, count: int) -> list:
        source, target = self.args
        bounds = np.linspace(0, len(source), count + 1).astype(int)
        return [partial(double_rows, source, target, int(low), int(high))
                for low, high in zip(bounds[:-1], bounds[1:], strict=True)]

    def as_job(self, workspace: object) -> partial:
        return partial(double_rows, *self.args)


def test_the_splitter_cuts_a_call_by_its_own_slabs() -> None:
    source, target = np.arange(12.0).reshape(6, 2), np.zeros((6, 2))
    split = parallel.split(DoubleRows(double_rows, source, target), 3)
    assert isinstance(split, parallel.SplitCall) and len(split.slabs) == 3
    split()
    np.testing.assert_array_equal(target, source * 2)


def test_a_call_that_declines_to_be_cut_stays_whole() -> None:
    call = parts.PartedCall(double_rows, np.ones((4, 2)), np.zeros((4, 2)))
    assert parallel.split(call, 4) is call
    assert jobs.pooled(call, workspace=None) is call
    assert not spin_pool.quiet_for_blas(call)  # says nothing: BLAS is held for it


def test_the_plan_takes_the_calls_job_and_keeps_the_call_as_its_source() -> None:
    source, target = np.ones((4, 2)), np.zeros((4, 2))
    call = DoubleRows(double_rows, source, target)
    job = jobs.pooled(call, workspace=None)
    assert job is not call and jobs.source(job) is call
    job()
    np.testing.assert_array_equal(target, 2)


def test_the_spin_pool_asks_the_call_whether_blas_may_spread() -> None:
    assert spin_pool.quiet_for_blas(DoubleRows(double_rows, np.ones(1), np.ones(1)))
    assert parts.leaves_blas_alone(spin_pool.job(0, np.zeros(1, np.int64), 1))
