"""The cores one thread's CPU runs may use, where several batches compute at once.

A served model with several instances runs that many batches at once, each on its share of
the cores (`engine.serving.cores`). BLAS's thread count cannot be one batch's alone (numpy's
OpenBLAS has one count per process, docs/threads.md), so such a batch holds BLAS to one thread
and says here, for its own thread only, how many cores its runs may spread over: the row
splitter cuts its rows into at most that many runs (`engine.runtime.batch_split.threads`) and
the spin pool arms at most that many threads (`engine.cpu.spin_pool.threads`). It also says
which instance the batch is, so that its runs of rows take plan copies no other instance's
batch takes at once. Outside `sharing`, nothing is set and both follow BLAS's count.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


def cores() -> int | None:
    """The cores this thread's runs may use now, or None where no share is set."""
    return getattr(_local, "cores", None)


def instance() -> int:
    """Which of its model's instances this thread's batch is (0 where no share is set)."""
    return getattr(_local, "instance", 0)


@contextmanager
def sharing(cores_: int, instance_: int = 0) -> Iterator[None]:
    """Runs on this thread use at most ``cores_`` cores, as instance ``instance_``, inside."""
    if cores_ < 1 or instance_ < 0:
        raise ValueError(f"a share is at least one core of instance 0 or more; got {cores_} "
                         f"cores of instance {instance_}")
    saved = cores(), instance()
    _local.cores, _local.instance = cores_, instance_
    try:
        yield
    finally:
        _local.cores, _local.instance = saved
