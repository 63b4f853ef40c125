"""numba for the CPU kernels: whether it is there, compiling without the GIL, compiling a
module's kernels once (numba's, or anything else a module makes once: `made_once`), and setting
up its compiler ahead of the first kernel (`prepare`).

numba is imported on first use; `available()` is False where it is not installed, and callers
keep their NumPy binding then. Compiled code is cached under `cache.cache_dir`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from engine.cpu import cache

COMPILED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # numba has no float16
_compiling = threading.Lock()
_making = threading.RLock()  # `made_once`'s: one make may ask for another's
_preparing = threading.Lock()
_prepared = False


def available() -> bool:
    """Whether numba can be imported (kernels are compiled on their first call)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def prepare() -> bool:
    """Set up numba's compiler now, as the first compile of a process otherwise does in the
    middle of whatever asked for a kernel: the import and the typing and target registries, a
    second of CPU, about 90,000 objects and 120 MiB kept for the life of the process. A caller
    that then freezes what lives on (`gc.freeze`) keeps them out of every later full pass of
    the garbage collector. Returns whether numba is there; after the first call, at once.
    """
    global _prepared
    if _prepared:
        return True
    if not available():
        return False
    with _preparing:
        if not _prepared:
            from numba import njit

            njit(nogil=True)(_next_integer)(0)  # not cached: the point is the compile itself
            _prepared = True
    return True


def _next_integer(value: int) -> int:
    return value + 1


def compiled_once(kernels: dict[str, Any], build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``kernels``, filled with what ``build`` returns on first use, all at once and under
    one lock for every module's kernels: plans run on several threads (a split batch's runs),
    and a helper put in a module's namespace twice would be jitted twice (numba refuses)."""
    if not kernels:
        with _compiling:
            if not kernels:
                kernels.update(build())
    return kernels


def made_once(made: dict, key: Any, make: Callable[[], Any]) -> Any:
    """``made[key]``, set to ``make()`` the first time any thread asks: plans bind on several
    threads at once (a split batch's runs), and a kernel compiled twice costs its compile
    time twice (seconds, for an LLVM module of tile functions)."""
    if key not in made:
        with _making:
            if key not in made:
                _every_made.setdefault(id(made), made)
                made[key] = make()
    return made[key]


def make_anew() -> None:
    """Everything `made_once` made so far made again on its next use, what was made kept
    alive: a plan bound before runs the machine code it bound (a kernel whose address a call
    looks up as it runs takes the new one). For a benchmark binding a plan of a kernel's
    variant beside one of the kernel as it was, in one process (`bench/variants.py`)."""
    with _making:
        for made in _every_made.values():
            _set_aside(made)


@contextmanager
def remade(*made: dict) -> Iterator[None]:
    """Within, each of the dicts ``made`` (filled by `made_once`) starts empty, so what it
    held is made again on its next use; after, it holds what it held before, what was made
    within kept alive as `make_anew` keeps it. For a test comparing a plan bound to a kernel's
    variant with one bound to the kernel as it is, without making every other kernel again."""
    with _making:
        before = [dict(each) for each in made]
        for each in made:
            each.clear()
    try:
        yield
    finally:
        with _making:
            for each, held in zip(made, before, strict=True):
                _set_aside(each)
                each.update(held)


def _set_aside(made: dict) -> None:
    """``made`` emptied, what it held kept alive for the plans bound to it (`_retired`)."""
    _retired.append(dict(made))
    made.clear()


_every_made: dict[int, dict] = {}  # each dict `made_once` has filled, by id
_retired: list[dict] = []  # what `make_anew` cleared, alive for the plans bound to it


def compile_kernel(function: Any, **options: Any) -> Any:
    """``function`` compiled by numba without the GIL, cached on disk under the cache directory
    where it can be written; else compiled in each process."""
    from numba import njit

    if cache.point_numba_here():
        try:
            return njit(cache=True, nogil=True, **options)(function)
        except RuntimeError:  # "cannot cache ... no locator available"
            pass
    return njit(nogil=True, **options)(function)
