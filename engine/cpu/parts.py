"""What the CPU runtime asks of a bound step: the protocol kernels offer so that the thread
pool, the batch splitter and the plan never ask which kernel they hold.

A plan's step is a zero-argument call. Most are ``functools.partial``s of NumPy functions,
which `parallel.split` and `spin_pool` understand by themselves. A compiled kernel's bound call
is a `PartedCall`, a ``partial`` that also answers:

- ``as_job(workspace)``: the same work as a `spin_pool` job of parts (or None to stay whole);
- ``slabs(count)``: the same work as about ``count`` calls writing disjoint parts of the output,
  for threads of their own (or None);
- ``leaves_blas_alone``: whether it never lets BLAS spread over threads, so that a plan made of
  such steps needs no BLAS held to one thread (`spin_pool.quiet_for_blas`).

A new kernel subclasses `PartedCall` in its own module; nothing here changes.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any


class PartedCall(partial):
    """A bound call of a compiled kernel: it runs as it is, and says how it can be cut."""

    leaves_blas_alone = False

    def as_job(self, workspace: Any) -> Callable[[], Any] | None:
        """This call as a job of parts on the spin pool; None where it runs as it is."""
        return None

    def slabs(self, count: int) -> list[Callable[[], Any]] | None:
        """This call as up to ``count`` calls over disjoint parts of its output; None where it
        is not worth cutting."""
        return None


def as_job(call: Any, workspace: Any) -> Callable[[], Any] | None:
    """``call.as_job(workspace)`` where ``call`` offers it, else None."""
    make = getattr(call, "as_job", None)
    return None if make is None else make(workspace)


def leaves_blas_alone(call: Any) -> bool:
    """Whether ``call`` says it never spreads BLAS over threads."""
    return getattr(call, "leaves_blas_alone", False)


class DoneByItsWriter:
    """The step of a node whose work its writer's step does (a pooling or a shortcut run
    there while the data is in cache): nothing left to do, and no BLAS. Each kind of hand-over
    keeps an instance of its own, so that a plan's steps say which took place."""

    leaves_blas_alone = True

    def __call__(self) -> None:
        return None

    def replayable(self) -> bool:
        """Nothing to replay (`steady_walk`)."""
        return True

