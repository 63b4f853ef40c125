"""`RowSplitter`: a model's CPU batches cut into runs of rows over several cores.

`engine.runtime.batch_split` decides, for any graph, whether its rows are independent and how
many runs a batch may take; this class applies that to one model: the nodes carrying its
batch, why it never splits (a GPU, the interpreter, data-dependent shapes, rows that mix), the
estimated work of each signature's batch (cached, LRU), and the run itself, each run of rows
through a plan copy of its own from the `PlanCache` (docs/threads.md).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from engine.cpu import blas_threads, thread_share
from engine.errors import InputError
from engine.graph.ir import Graph
from engine.runtime import batch_split
from engine.runtime.inputs import InputChecker
from engine.runtime.lru import LRUCache
from engine.runtime.plan_cache import PlanCache, run_bucketed
from engine.runtime.signature import Signature


class RowSplitter:
    """Where and how one model's CPU batches run as runs of rows (`blocker` None: they may)."""

    def __init__(self, graph: Graph, input_names: list[str], checker: InputChecker,
                 cache: PlanCache) -> None:
        self.graph = graph
        self._checker = checker
        self._cache = cache
        # The nodes carrying the batch, why this model never splits (None: it may), and per
        # signature the batch's estimated work, 0 where its rows do not split.
        self.batch_nodes = batch_split.input_dependent(graph, set(input_names))
        self.blocker: str | None = self._find_blocker()
        self._work: LRUCache[Signature, int] = LRUCache(cache.capacity)
        batch_split.watch(self)

    def _find_blocker(self) -> str | None:
        """Why this model never runs a batch as runs of rows (see `batch_split`), or None."""
        cache = self._cache
        if cache.backend.is_gpu:
            return "it runs on a GPU"
        if cache.graph is None:
            return "it runs the reference interpreter (optimize=False)"
        if cache.data_dependent is not None:
            return f"its shapes depend on the data: {cache.data_dependent}"
        return batch_split.split_blocker(self.graph, self.batch_nodes)

    def threads_changed(self) -> None:
        """`batch_split.set_threads` was called: batches of two rows or more go through the
        checks again, where whether they split is decided."""
        self._cache.uncheck(2)

    def row_runs(self, feed: dict[str, np.ndarray]) -> tuple[list[tuple[int, int]] | None,
                                                             bool]:
        """The runs of rows to cut this CPU batch into (`batch_split`), or None to run it
        whole (rows not independent, one core allowed, too little work for each run); and
        whether a whole run stays whole only while BLAS keeps to one thread. Otherwise it
        stays whole until `batch_split.set_threads` is called (which makes a model check
        again), so later calls may skip the checks."""
        if self.blocker is not None:
            return None, False
        signature = Signature.of(feed)
        rows = signature.rows() or 0
        count = batch_split.parts(rows)
        if count < 2:  # where the count is not fixed, it follows BLAS's, now one
            return None, not batch_split.fixed(rows)
        work = self._work.get(signature)
        if work is None:
            work = self._estimate_work(signature, rows)
            self._work.put(signature, work)
        count = min(count, work // max(1, batch_split.MIN_PART_WORK))
        return (batch_split.part_bounds(rows, count) if count >= 2 else None), False

    def _estimate_work(self, signature: Signature, rows: int) -> int:
        """The work of a batch of ``signature`` that a split spreads (`batch_split.work`); 0
        when its rows do not split (shapes at one row do not follow the batch: `rows_follow`)."""
        whole = self._checker.signature_shapes(signature)
        try:
            single = self._checker.signature_shapes(signature.with_rows(1))
        except InputError:
            return 0
        if not batch_split.rows_follow(self.graph, self.batch_nodes, whole, rows, single, 1):
            return 0
        return batch_split.work(self.graph, self.batch_nodes, whole)

    def part_plans(self, feed: dict[str, np.ndarray], bounds: list[tuple[int, int]]
                   ) -> tuple[list[dict[str, np.ndarray]], list[Signature], list[Signature],
                              list[int]]:
        """The runs of rows of ``feed``: each one's feed, exact signature, the signature of
        the plan it runs (its batch bucket) and which copy of that plan it takes (runs whose
        plans have one signature each take another copy)."""
        feeds = [{name: array[start:stop] for name, array in feed.items()}
                 for start, stop in bounds]
        exact = [Signature.of(part) for part in feeds]
        planned = [self._cache.bucketed(signature) for signature in exact]
        # A served instance's runs take copies past the other instances' (`thread_share`).
        first = thread_share.instance() * len(bounds)
        copies = [first + planned[:index].count(plan) for index, plan in enumerate(planned)]
        return feeds, exact, planned, copies

    def run_rows(self, feed: dict[str, np.ndarray],
                 bounds: list[tuple[int, int]]) -> list[np.ndarray]:
        """Each run of rows through a plan of its own, all at once with one BLAS thread each;
        the outputs joined in row order."""
        calls = [partial(self._run_part, *part) for part in zip(*self.part_plans(feed, bounds))]
        with blas_threads.one_thread():
            results = batch_split.run_parts(calls)
        return [np.concatenate(column) for column in zip(*results)]

    def _run_part(self, feed: dict[str, np.ndarray], exact: Signature, signature: Signature,
                  replica: int) -> list[np.ndarray]:
        """``feed`` (a run of rows, of signature ``exact``) through copy ``replica`` of the
        plan for ``signature`` (``exact`` or its batch bucket)."""
        cache = self._cache
        return run_bucketed(cache.replica(cache.entry(signature), replica), feed, exact,
                            signature)
