"""One CPU `Model.infer` batch cut into runs of rows, run on several cores at once.

A CPU plan gets more than one core only inside BLAS's GEMMs; its copies, transforms, compiled
kernels and epilogues run on the calling thread. A batch of n rows whose rows are computed
independently can instead run as k contiguous parts (k = min(n, `threads()`, cores)), each
through its own compiled plan, on a small persistent pool: plans release the GIL inside BLAS,
the nogil numba kernels and NumPy's loops, so the parts' steps run in parallel, all but the
Python between them.

Each part calls BLAS with one thread. OpenBLAS's ``openblas_set_num_threads_local`` would say
that per thread, but in numpy's pthreads build it sets the process-wide count (measured: after
a worker thread called it with 1, the main thread's 1024² GEMMs ran on one core), so while any
split call runs, BLAS is set to one thread for the whole process and restored when the last
one ends (`engine.cpu.blas_threads.one_thread`): an unsplit call on another thread meanwhile
gets one BLAS thread.
Where that BLAS cannot be found (not numpy's OpenBLAS) nothing is split, since parts with
multi-threaded GEMMs would oversubscribe the cores.

Only models whose rows are independent are split (`split_blocker`, `rows_follow`), and only
when each part has enough work to repay the hand-off (`MIN_PART_WORK`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from engine.cpu import blas_threads, denormals, parallel, thread_share
from engine.graph.ir import Graph

# Work (`work`: multiply-adds outside dense GEMMs, estimated) a run of rows must have for a
# split to pay for its hand-off (tens of µs on the busy 2-core benchmark machine). Measured
# there against the batch left whole with BLAS on every core (docs/benchmarks.md, "One infer
# batch over the cores"): ResNet-18 (1.8 G per row) gains at batch 4; a small CNN
# on 32×32 images (1.7 M per row) loses at batch 2 (runs of one row) and gains at batch 8
# (6.6 M per run); the seed MLP, all dense GEMMs, gains at no batch size.
MIN_PART_WORK = 2_000_000
# Attributes naming an axis an op works along (softmax, cumsum, sort, the sequence ops): on
# the batch axis such an op mixes rows without changing any shape.
AXIS_ATTRIBUTES = ("axis", "dim")
# Ops that read axis 0 as time with no attribute saying so: MXNet's fused RNN is always TNC.
TIME_MAJOR_OPS = frozenset({"RNN"})

_settings: dict[str, Any] = {"threads": None, "pool": None}
_watchers: weakref.WeakSet = weakref.WeakSet()
_pool_lock = threading.Lock()


def threads() -> int:
    """Cores one CPU `Model.infer` may use: `set_threads`'s count, else BLAS's own thread
    count (numpy's OpenBLAS: every core, unless ``OPENBLAS_NUM_THREADS`` or threadpoolctl
    set fewer), so that a process told to run BLAS on one thread does not split either."""
    configured = _settings["threads"]
    share = thread_share.cores()  # a served instance's share, BLAS held to one meanwhile
    if share is not None:
        return share if configured is None else min(share, configured)
    return blas_threads.threads() if configured is None else configured


def set_threads(count: int | None) -> None:
    """Let one CPU `Model.infer` use up to ``count`` cores (1: never split; None: as many as
    BLAS's thread count, every core by default).

    Applies to calls made from now on, by every model of the process. A caller that runs
    several batches at once on threads of its own sets 1 (the server leaves it at None and
    sets BLAS's thread count instead, docs/threads.md).
    """
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                              or count < 1):
        raise ValueError(f"threads must be a positive integer or None; got {count!r}")
    _settings["threads"] = count
    for watcher in list(_watchers):
        watcher.threads_changed()


def parts(rows: int) -> int:
    """How many runs a batch of ``rows`` rows may be cut into: at most one per row, per core
    and per `threads()`; 1 where BLAS's threads cannot be set (see the module docstring)."""
    if rows < 2 or not blas_controllable():
        return 1
    return min(rows, threads(), parallel.cores())


def fixed(rows: int) -> bool:
    """Whether `parts` for ``rows`` rows changes only through `set_threads`: not where it
    follows BLAS's thread count, which threadpoolctl may change at any time."""
    return rows < 2 or (_settings["threads"] is not None and thread_share.cores() is None) \
        or not blas_controllable() or parallel.cores() < 2


def watch(owner: Any) -> None:
    """Call ``owner.threads_changed()`` on every `set_threads` (a model's skipped checks may
    have decided not to split); held weakly."""
    _watchers.add(owner)


def part_bounds(rows: int, count: int) -> list[tuple[int, int]]:
    """``count`` contiguous (start, stop) runs covering ``rows`` rows, sizes within one."""
    edges = [rows * part // count for part in range(count + 1)]
    return list(zip(edges[:-1], edges[1:]))


def run_parts(calls: list[Callable[[], Any]]) -> list[Any]:
    """Each call's result in order: the first run on the calling thread, the rest on the pool;
    every call has finished before any error is raised."""
    pending = [_pool(len(calls) - 1).submit(call) for call in calls[1:]]
    try:
        first = calls[0]()
    finally:
        for future in pending:
            future.exception()  # waits; a part's error is raised by `result` below
    return [first, *(future.result() for future in pending)]


def _pool(workers: int) -> ThreadPoolExecutor:
    """The shared pool, grown (replaced) when a call needs more workers than it has."""
    pool = _settings["pool"]
    if pool is None or pool._max_workers < workers:
        with _pool_lock:
            pool = _settings["pool"]
            if pool is None or pool._max_workers < workers:
                if pool is not None:
                    pool.shutdown(wait=False)  # its queued parts still run
                size = max(workers, parallel.cores() - 1)
                pool = _settings["pool"] = ThreadPoolExecutor(
                    size, thread_name_prefix="engine-rows", initializer=denormals.flush_here)
    return pool


def blas_controllable() -> bool:
    """Whether BLAS's thread count can be read and set here (else nothing is split)."""
    return blas_threads.numpy_openblas() is not None


def input_dependent(graph: Graph, inputs: set[str]) -> list[bool]:
    """For each node of ``graph``, whether it reads (through any path) a variable in
    ``inputs``: the nodes whose outputs carry the batch."""
    dependent = [False] * len(graph.nodes)
    for index, node in enumerate(graph.nodes):
        if node.is_variable:
            dependent[index] = node.name in inputs
        else:
            dependent[index] = any(dependent[entry.node] for entry in node.inputs)
    return dependent


def split_blocker(graph: Graph, dependent: list[bool]) -> str | None:
    """Why rows of ``graph``'s batch may depend on one another whatever the shapes (a
    time-major RNN, a loop, an op reading values on the host, one writing fixed positions of
    axis 0), or None. Axis attributes and
    shapes are checked per signature, by `rows_follow`."""
    for index, node in enumerate(graph.nodes):
        if not dependent[index] or node.is_variable:
            continue
        if node.op in TIME_MAJOR_OPS:
            return f"{node.describe()} reads axis 0 as time"
        if any(not op.capturable for op in node.opdef.components(node.params)):
            return f"{node.describe()} loops or reads values on the host"
        if positions := node.opdef.reads_batch_positions(node.params):
            return f"{node.describe()} {positions}"
    return None


def rows_follow(graph: Graph, dependent: list[bool], whole: list, rows: int, part: list,
                part_rows: int) -> bool:
    """Whether every value carrying the batch has it on axis 0 with the same other axes at
    ``rows`` (shapes ``whole``) and ``part_rows`` (shapes ``part``), and no node works along
    that axis: a reduction over the batch, a reshape folding it, a concatenation along it or
    a softmax across it would all make a row's result depend on the other rows. Every output
    must carry the batch too: one computed from the parameters alone has no rows to join."""
    if not all(dependent[entry.node] for entry in graph.heads):
        return False
    for index, node in enumerate(graph.nodes):
        if not dependent[index]:
            continue
        for big, small in zip(whole[index], part[index]):
            if not big or big[0] != rows or small[0] != part_rows or big[1:] != small[1:]:
                return False
        if not node.is_variable and _works_along_batch(node, whole):
            return False
    return True


def _works_along_batch(node: Any, shapes: list) -> bool:
    """Whether an axis attribute of ``node`` (softmax's, cumsum's, the sequence ops') names
    axis 0 of its first input, counting negative axes from that input's rank."""
    first = node.inputs[0]
    rank = len(shapes[first.node][first.index] or ())
    for name in AXIS_ATTRIBUTES:
        value = node.params.get(name)
        for axis in value if isinstance(value, tuple) else (value,):
            if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool) \
                    and (axis == 0 or axis == -rank):
                return True
    return False


def work(graph: Graph, dependent: list[bool], shapes: list) -> int:
    """The work of one run that BLAS does not already spread over the cores, estimated: each
    value carrying the batch costs its elements, times the kernel's fan-in where its node has
    a convolution's ``weight`` (rank 3 or more: im2col and Winograd copies, compiled depthwise
    kernels, and GEMMs too small to thread well). A dense layer's GEMM (a rank-2 weight) is
    left out: BLAS runs it on every core already, which is why the seed MLP never splits."""
    total = 0
    for index, node in enumerate(graph.nodes):
        if not dependent[index] or node.is_variable:
            continue
        fan_in = 1
        for slot, entry in zip(node.opdef.input_names(node.params), node.inputs):
            weight = shapes[entry.node][entry.index]
            if slot == "weight" and weight and len(weight) >= 3:
                fan_in = max(1, int(np.prod(weight[1:])))
        total += fan_in * sum(int(np.prod(shape)) for shape in shapes[index] if shape)
    return total
