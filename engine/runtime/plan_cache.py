"""`PlanCache`: a model's compiled plans, one entry per input `Signature`.

Each entry holds the signature's plan and its spare plans (a GPU runs two batches at once, a
CPU batch cut into runs of rows runs each in its own copy). Batches are padded up to the
smallest batch bucket holding their rows, so that few plans serve every batch size. The cache
is an LRU bounded per model, so that clients sending ever new shapes cannot exhaust memory;
plans compile on first use, or ahead of it in the compile step (`engine.runtime.compile`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from engine.device import Device
from engine.graph.ir import Graph
from engine.runtime import batch_split
from engine.runtime.lru import LRUCache
from engine.runtime.plan import Plan
from engine.runtime.signature import Signature
from engine.runtime.staged import StagedPlan, dynamic_nodes


class SignaturePlans:
    """What a model keeps for one input signature: its plan, spare plans (the first compiled
    when a call finds the plan busy and `PlanCache.concurrent_runs` allows two runs, more for
    the runs of rows of one size in a split batch), and whether inputs with exactly this
    signature were checked once (later ones then skip the checks, some only while BLAS keeps
    to one thread: `still_whole`)."""

    __slots__ = ("signature", "plan", "spares", "checked", "whole_while_blas_alone")

    def __init__(self, signature: Signature, plan: Plan | StagedPlan) -> None:
        self.signature = signature
        self.plan = plan
        self.spares: list[Plan | StagedPlan] = []
        self.checked = False
        self.whole_while_blas_alone = False

    def still_whole(self) -> bool:
        """Whether a checked batch still runs whole: always, or for a batch that would be
        cut into runs of rows on more BLAS threads, while BLAS keeps to one (0.2 µs to read;
        threadpoolctl may change it at any time)."""
        return not self.whole_while_blas_alone or batch_split.threads() == 1

    @property
    def spare(self) -> Plan | StagedPlan | None:
        """The first spare plan, or None before one is compiled."""
        return self.spares[0] if self.spares else None


class PlanCache:
    """The plans of one optimised graph (None: the model runs the interpreter and has none).

    ``passes`` are the compiler passes the graph went through (``plan_memory`` among them
    makes plans reuse buffers); ``data_dependent`` (`shape_blocker`'s reason, or None) makes
    plans staged and never padded to a bucket, since padded rows would change the results.
    """

    def __init__(self, graph: Graph | None, *, passes: Iterable[str], backend: Device,
                 capacity: int, data_dependent: str | None,
                 buckets: Iterable[int] | None = None, precision: str = "fp32") -> None:
        self.graph = graph
        self.precision = precision
        self.backend = backend
        self.capacity = capacity
        self.data_dependent = data_dependent
        self.plans: LRUCache[Signature, SignaturePlans] = LRUCache(capacity)
        self._reuse_memory = "plan_memory" in passes
        self._buckets = checked_buckets(buckets)
        # With n >= 2, a call finding its signature's plan running on another thread runs one
        # of n - 1 spare plans instead: on a GPU one batch's host copies and the next batch's
        # arrival then overlap the other's kernels (each plan has its own stream); on the CPU
        # a model's instances run their batches at once, each in its own buffers.
        self.concurrent_runs = 1
        self.device_constants: dict[str, Any] = {}  # parameters on the GPU, shared by plans
        self.derived: dict = {}  # values ops derive from parameters (`Workspace.derived`)
        self._lock = threading.Lock()

    @property
    def buckets(self) -> tuple[int, ...] | None:
        """Batch sizes a batch is padded up to; None runs each batch size exactly."""
        return self._buckets

    @buckets.setter
    def buckets(self, buckets: Iterable[int] | None) -> None:
        self._buckets = checked_buckets(buckets)
        self.uncheck(0)  # the exact plans of bucketed sizes now go unused

    def uncheck(self, min_rows: int) -> None:
        """Make calls with the cached signatures of at least ``min_rows`` rows go through the
        checks again (where a bucket or a split is decided)."""
        for signature, entry in self.plans.items():
            if (signature.rows() or 0) >= min_rows:
                entry.checked = False

    def bucketed(self, signature: Signature) -> Signature:
        """The signature of the plan that runs inputs of ``signature``: padded to the
        smallest batch bucket holding their rows, or the signature itself."""
        if self.data_dependent is not None:
            return signature
        size = bucket(self._buckets, signature.rows())
        return signature if size is None else signature.with_rows(size)

    def entry(self, signature: Signature) -> SignaturePlans:
        """The cached plans of ``signature``, compiling its plan on first use."""
        entry = self.plans.get(signature)
        if entry is None:
            with self._lock:
                entry = self.plans.get(signature)
                if entry is None:
                    entry = SignaturePlans(signature, self.compile(signature))
                    self.plans.put(signature, entry)
        return entry

    def free(self, entry: SignaturePlans) -> Plan | StagedPlan:
        """The entry's plan, or, when another thread runs it, the first of its
        ``concurrent_runs - 1`` spares that none runs (the plan itself, to wait for, when all
        are busy)."""
        if self.concurrent_runs < 2 or not entry.plan.busy:
            return entry.plan
        for index in range(1, self.concurrent_runs):
            replica = self.replica(entry, index)
            if not replica.busy:
                return replica
        return entry.plan

    def spare(self, entry: SignaturePlans) -> Plan | StagedPlan:
        """The entry's first spare plan, compiled on first use."""
        return self.replica(entry, 1)

    def replica(self, entry: SignaturePlans, index: int) -> Plan | StagedPlan:
        """The entry's plan (0), its spare (1) or a further copy, compiled on first use: runs
        of rows of one size in a split batch each take their own."""
        if index == 0:
            return entry.plan
        if len(entry.spares) < index:
            with self._lock:
                while len(entry.spares) < index:
                    entry.spares.append(self.compile(entry.signature))
        return entry.spares[index - 1]

    def compile(self, signature: Signature) -> Plan | StagedPlan:
        """A new plan of the graph for ``signature`` (not cached: `entry` and `replica` do)."""
        assert self.graph is not None
        return self._compile_graph(self.graph, signature)

    def _compile_graph(self, graph: Graph, signature: Signature) -> Plan | StagedPlan:
        """A plan of ``graph`` for ``signature``: staged when some of its shapes depend on the
        data (each stage compiled here again, with the same options)."""
        if dynamic_nodes(graph):
            return StagedPlan(graph, signature, self._compile_graph, self.capacity,
                              self.backend.name)
        return Plan(graph, signature.shapes(), signature.dtypes(),
                    reuse_memory=self._reuse_memory, device=self.backend,
                    constants=self.device_constants, derived=self.derived,
                    precision=self.precision)

    def release(self) -> None:
        """Forget every plan and derived value one at a time, letting another thread take the
        GIL after each: freed at once, a retired ResNet-18's plans held it 21-35 ms in one
        stretch (the server's event loop waits that long), plan by plan 5-14 ms. A later call
        compiles its plans again."""
        for signature in self.plans.keys():
            entry = self.plans.pop(signature)
            del entry  # its plans and buffers are freed here, outside the cache's lock
            time.sleep(0)
        for key in list(self.derived):
            self.derived.pop(key, None)
            time.sleep(0)

    def signatures(self) -> list[tuple[tuple[str, tuple[int, ...]], ...]]:
        """Input shapes of the plans cached now, each as sorted (name, shape) pairs."""
        return [tuple(sorted(signature.shapes().items())) for signature in self.plans.keys()]

    @property
    def derived_bytes(self) -> int:
        """Bytes of values derived from parameters when plans bind (Winograd's weights)."""
        return sum(int(value.nbytes) for _, value in list(self.derived.values()))


def bucket(buckets: tuple[int, ...] | None, rows: int | None) -> int | None:
    """The smallest configured batch bucket holding ``rows`` (None: run the exact shape)."""
    if not buckets or rows is None:
        return None
    return next((size for size in buckets if size >= rows), None)


def checked_buckets(buckets: Iterable[int] | None) -> tuple[int, ...] | None:
    """``buckets`` sorted, refused unless they are positive integers; None for none."""
    if buckets is None:
        return None
    sizes = tuple(buckets)
    wrong = [size for size in sizes
             if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1]
    if wrong:
        raise ValueError(f"batch_buckets must be positive integers; got {wrong[0]!r} in "
                         f"{list(sizes)}")
    return tuple(sorted({int(size) for size in sizes})) or None


def run_bucketed(plan: Plan | StagedPlan, feed: Mapping[str, np.ndarray], exact: Signature,
                 signature: Signature) -> list[np.ndarray]:
    """``feed`` (of signature ``exact``) through ``plan``, compiled for ``signature``: the
    same, or padded to a batch bucket, whose rows past the feed's are dropped."""
    if signature == exact:
        return plan.run(feed)
    # The plan for the bucket takes the rows as they are and zeroes the rest of its buffers.
    rows, size = exact.rows(), signature.rows()
    outputs = plan.run(feed, copy_outputs=False)
    return [out[:rows].copy() if out.ndim and out.shape[0] == size else out.copy()
            for out in outputs]
