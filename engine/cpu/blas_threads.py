"""numpy's bundled OpenBLAS thread count, read and set through its own C functions.

numpy's wheels ship OpenBLAS as ``numpy.libs/libscipy_openblas64_*.so``, whose functions carry
a ``scipy_openblas_`` prefix and a ``64_`` suffix. Reading the count costs 0.2 µs, so callers
may ask at every call; threadpoolctl, ``OPENBLAS_NUM_THREADS`` and the server's
``--blas-threads`` all act on the same count. Another BLAS (a custom numpy build, macOS's
Accelerate) is not found: `numpy_openblas` is None there.

OpenBLAS counts the host's cores, not a container's CPU limit: found under a limit that pays
for fewer cores than its count, with no thread variable set, it is set to the limit
(`fit_to_limit`), so that its spinning threads do not spend the quota.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from engine.cpu import denormals, usable_cores

# Variables that set OpenBLAS's count as it loads; one set means someone chose the count.
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")

_found: list[Any] = []
_held = {"count": 0, "saved": 1}
_holding = threading.Lock()


class OpenBlas:
    """The thread count of one loaded OpenBLAS."""

    def __init__(self, library: ctypes.CDLL, prefix: str, suffix: str) -> None:
        self.library = library
        self._set = getattr(library, f"{prefix}set_num_threads{suffix}")
        self._set.argtypes = [ctypes.c_int]
        self._count = getattr(library, f"{prefix}get_num_threads{suffix}")
        self._count.restype = ctypes.c_int

    def count(self) -> int:
        """Threads it uses now."""
        return self._count()

    def set(self, threads: int) -> None:
        """Use ``threads`` threads from now on, process-wide."""
        self._set(threads)

    def restart_threads(self) -> bool:
        """Stop its worker threads and start them anew from this thread (OpenBLAS's own
        shutdown, as before a fork, and its start); False where it exports neither."""
        shutdown = getattr(self.library, "blas_thread_shutdown_", None)
        start = getattr(self.library, "blas_thread_init", None)
        if shutdown is None or start is None:
            return False
        shutdown()
        start()
        return True


def numpy_openblas() -> OpenBlas | None:
    """numpy's own OpenBLAS, found on first use; None where numpy uses another BLAS."""
    if not _found:
        blas = _find()
        if blas is not None:
            fit_to_limit(blas, usable_cores.limit_cores())
        _found.append(blas)
    return _found[0]


def fit_to_limit(blas: OpenBlas, limit: int | None) -> None:
    """``blas`` set to ``limit`` threads (a container's CPU limit, `usable_cores.limit_cores`)
    where it counts more and no thread variable chose its count. Under a limit of one CPU on
    two vCPUs, ResNet-18 fp32 at batch 1 on one thread took 80 ms a run with OpenBLAS's two
    threads beside it and 38 with one (docs/threads.md)."""
    if limit is None or blas.count() <= limit or any(map(os.environ.get, THREAD_VARIABLES)):
        return
    logging.getLogger(__name__).info(
        "OpenBLAS set from %d threads to %d: the container's CPU limit", blas.count(), limit)
    blas.set(limit)


def threads() -> int:
    """Threads numpy's BLAS uses now (1 where it is not numpy's OpenBLAS: unknown)."""
    blas = numpy_openblas()
    return 1 if blas is None else blas.count()


def unheld_threads() -> int:
    """BLAS's thread count as set, not held: the count `one_thread` saved while a caller holds
    BLAS to one thread, else `threads`."""
    with _holding:
        if _held["count"]:
            return _held["saved"]
    return threads()


def restart_flushed() -> bool:
    """numpy's OpenBLAS worker threads started anew from a thread that flushes denormals
    (`denormals`), so that they flush too: a thread inherits its creator's MXCSR, and
    OpenBLAS starts its threads when numpy loads. Only while no BLAS call runs on any thread
    (a server calls it as it starts, before any request). True where done."""
    blas = numpy_openblas()
    if blas is None or not denormals.available():
        return False
    done: list[bool] = []

    def restart() -> None:
        denormals.flush_here()
        done.append(blas.restart_threads())

    thread = threading.Thread(target=restart, name="blas-restart")
    thread.start()
    thread.join()
    return bool(done and done[0])


def _find() -> OpenBlas | None:
    folder = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in sorted(glob.glob(os.path.join(folder, "libscipy_openblas64_*.so"))):
        try:
            return OpenBlas(ctypes.CDLL(path), "scipy_openblas_", "64_")
        except (OSError, AttributeError):
            continue
    return None


@contextmanager
def one_thread() -> Iterator[None]:
    """numpy's OpenBLAS on one thread, process-wide, until the last caller inside this leaves
    (the count saved by the first one in is put back then). OpenBLAS has no per-thread count
    in numpy's pthreads build (``openblas_set_num_threads_local`` sets the process's, see
    docs/threads.md), so a BLAS call on another thread meanwhile also runs on one."""
    hold_one()
    try:
        yield
    finally:
        release_one()


def hold_one() -> None:
    """`one_thread`'s entry, for callers that cannot use a ``with`` block: each `hold_one`
    needs one `release_one`."""
    blas = numpy_openblas()
    if blas is None:
        return
    with _holding:
        if _held["count"] == 0:
            _held["saved"] = blas.count()
            blas.set(1)
        _held["count"] += 1


def release_one() -> None:
    """`one_thread`'s exit: the saved count is put back when the last holder releases."""
    blas = numpy_openblas()
    if blas is None:
        return
    with _holding:
        _held["count"] -= 1
        if _held["count"] == 0:
            blas.set(_held["saved"])
