"""`DynamicBatcher`: queue concurrent requests, run them as batches off the event loop, split.

Requests whose inputs have the same names, non-batch shapes and dtypes form a group; a group is
dispatched when its rows reach `max_batch_size` or a preferred size, or when its oldest request
has waited `max_queue_delay` (a delay that ran out while every batch slot was busy starts again
when one frees); where the last batch's callers have lately come back for their next requests,
the next batch also waits for them, up to a share of that batch's time (`CallerReturns`). Each
caller gets exactly its own rows back. Rows are joined and split along each tensor's batch axis:
axis 0 unless `batch_axes` says otherwise (a time-major model's ``[steps, batch]`` along axis
1); with `batch_axes` None, tensors have no batch dimension and every request runs alone, as it
is.

With Triton's priority levels (`engine.serving.priority_queue`), batches take the highest
level first (1), each level queued and bounded by its own policy.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from engine.errors import ExecutionError, InputError
from engine.runtime.buffers import BatchBuffers, HostBatch, join_rows
from engine.serving.caller_returns import CallerReturns
from engine.serving.config import ModelConfig
from engine.serving.cores import CoreShare
from engine.serving.errors import ModelNotReady, Overloaded, QueueTimedOut, TimedOut
from engine.serving.priority_queue import PriorityGroup, PriorityPolicy, Scheduling, queue_name
from engine.serving.stats import BatcherStats

Arrays = dict[str, np.ndarray]
InferFn = Callable[[Arrays], Mapping[str, np.ndarray]]
# (one request's inputs, the batch's rows) -> where to join the batch, and its run.
BatchBuffersFn = Callable[[Mapping[str, np.ndarray], int], BatchBuffers]


@dataclass(frozen=True)
class BatchRun:
    """One finished batch as an observer (a tracer) sees it: per request, its context at
    `submit` (the `contextvars` where a tracer keeps the request's span), when it was queued
    and its rows; when the batch started and finished computing (`time.monotonic`), and the
    error it failed with."""

    contexts: tuple[contextvars.Context, ...]
    enqueued: tuple[float, ...]
    rows: tuple[int, ...]
    started: float
    finished: float
    error: Exception | None


BatchObserver = Callable[[BatchRun], None]


@dataclass(frozen=True)
class BatchingPolicy:
    """Limits of one batcher; times in seconds (`from_config` converts config microseconds)."""

    max_batch_size: int = 32
    max_queue_delay_s: float = 0.001
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_size: int = 1024
    default_timeout_s: float | None = None
    max_concurrent_batches: int = 1
    # With nothing computing, a group holding as many rows as the last batch had is dispatched
    # at once: waiting would only add latency, since the callers it could wait for are already
    # in it (one client: no delay at all). A smaller group waits up to `max_queue_delay_s` for
    # the rest of its usual company, as without this flag: dispatching it alone would split a
    # steady load into a small and a large batch per round.
    dispatch_when_idle: bool = True
    priorities: PriorityPolicy = PriorityPolicy()

    @classmethod
    def from_config(cls, config: ModelConfig, max_concurrent_batches: int = 1) -> BatchingPolicy:
        """The policy written in a model's config."""
        batching = config.dynamic_batching
        timeout = batching.timeout_us
        # A sequence model's steps are batched as its sequence_batching says.
        delay_us, preferred = ((config.sequence_batching.max_queue_delay_us,
                                config.sequence_batching.preferred_batch_sizes(config.max_batch_size))
                               if config.sequence_batching is not None else
                               (batching.max_queue_delay_us, batching.preferred_batch_sizes))
        # max_batch_size 0 (no batch dimension): each request is a batch of its own.
        # Triton's sequence batcher has no priorities: a sequence's steps keep one queue.
        priorities = (PriorityPolicy() if config.sequence_batching is not None
                      else PriorityPolicy.from_config(batching))
        return cls(max(1, config.max_batch_size), delay_us / 1e6, preferred,
                   batching.max_queue_size, None if timeout is None else timeout / 1e6,
                   max_concurrent_batches, priorities=priorities)


@dataclass(eq=False)
class _Request:
    inputs: Mapping[str, np.ndarray]
    rows: int
    key: Hashable
    future: asyncio.Future[Arrays]
    enqueued: float
    context: contextvars.Context | None = None  # the caller's, kept for an observer only
    level: int = 0  # priority level (0: the model has none)
    delayed: bool = False  # past its queue timeout under a DELAY policy


class DynamicBatcher:
    """Combine concurrent requests to one model along the batch dimension.

    Args:
        infer: the model's ``infer``; called from a worker thread with one batch.
        policy: sizes, delays, queue bound and default deadline.
        name: used in error messages (e.g. ``"mlp version 3"``).
        executor: where batches run; by default a private pool of
            ``policy.max_concurrent_batches`` threads, shut down by `close`.
        batch_buffers: where a batch of several requests is joined and how it runs (the
            model's `batch_buffers`: on a GPU, straight into a plan's pinned inputs); by
            default fresh arrays run by ``infer``. Used only where every batch axis is 0.
        batch_axes: each input's and output's batch axis by name (absent: 0); None: no batch
            dimension, so requests are never joined (Triton's ``max_batch_size`` 0).
        observer: called on the event loop with each finished batch (`BatchRun`); None (the
            default) keeps no context and calls nothing.
        core_share: a CPU model's: whether each batch runs on every core or on one
            (`CoreShare`); None: as ``infer`` runs it.

    Raises (from `submit`):
        InputError: inputs are not arrays with one common batch size in 1..max_batch_size,
            or the priority is negative.
        Overloaded: the queue holds `max_queue_size` requests already, or the request's
            priority level holds its own policy's `max_queue_size`.
        QueueTimedOut: the request waited past its level's queue timeout (REJECT policy).
        TimedOut: the deadline passed before the result was ready.
        ModelNotReady: the batcher is closed.

    Example:
        >>> batcher = DynamicBatcher(model.infer, BatchingPolicy(max_batch_size=16))
        >>> batcher.start()
        >>> outputs = await batcher.submit({"data": x}, timeout_s=1.0)
        >>> await batcher.close()
    """

    def __init__(self, infer: InferFn, policy: BatchingPolicy, *, name: str = "model",
                 executor: Executor | None = None,
                 batch_buffers: BatchBuffersFn | None = None,
                 batch_axes: Mapping[str, int] | None = MappingProxyType({}),
                 observer: BatchObserver | None = None,
                 core_share: CoreShare | None = None) -> None:
        self.infer = infer
        self._core_share = core_share
        self._observer = observer
        self.batch_axes = None if batch_axes is None else dict(batch_axes)
        self._first_axis = batch_axes is not None and not any(batch_axes.values())
        self._batch_buffers = (batch_buffers if batch_buffers and self._first_axis
                               else self._host_batch)
        self.policy = policy
        self.name = name
        self.stats = BatcherStats()
        self._preferred = frozenset(policy.preferred_batch_sizes)
        self._own_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(
            policy.max_concurrent_batches, thread_name_prefix=f"batcher-{name}")
        self._groups: dict[Hashable, PriorityGroup[_Request]] = {}
        self._queued = 0
        self._level_sizes: dict[int, int] = {}  # queued requests by priority level
        self._computing = 0  # requests in batches that are running
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(policy.max_concurrent_batches)
        self._running: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._last_rows = 1  # rows of the last batch dispatched: the load seen most recently
        self._slot_freed = 0.0  # monotonic time a running batch last finished
        self._returns = CallerReturns()  # whether a finished batch's callers come back

    @property
    def queue_depth(self) -> int:
        """Requests waiting in the queue now."""
        return self._queued

    @property
    def computing(self) -> int:
        """Requests taken into batches that are running now."""
        return self._computing

    def oldest_wait_s(self) -> float:
        """Seconds the longest-waiting queued request has waited (0 with none queued)."""
        groups = list(self._groups.values())
        if not groups:
            return 0.0
        return max(0.0, time.monotonic() - min(group.oldest() for group in groups))

    @property
    def closing(self) -> bool:
        """True once `close` was called: new requests are refused."""
        return self._closing

    def start(self) -> None:
        """Start the dispatch task on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._dispatch_loop())

    async def close(self, *, drain: bool = True) -> None:
        """Stop accepting requests; drain (or refuse) the queue; wait for running batches."""
        self._closing = True
        if not drain:
            for group in self._groups.values():
                for request in group:
                    if not request.future.done():
                        request.future.set_exception(ModelNotReady(f"{self.name} was unloaded"))
            self._groups.clear()
            self._queued = 0
            self._level_sizes.clear()
        self._wake.set()
        if self._task is not None:
            await self._task
        elif self._queued:
            await self._dispatch_loop()
        if self._own_executor:
            self._executor.shutdown(wait=False)

    async def __aenter__(self) -> DynamicBatcher:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def submit(self, inputs: Mapping[str, Any], *, timeout_s: float | None = None,
                     rows: int | None = None, scheduling: Scheduling | None = None) -> Arrays:
        """Queue one request and wait for its own rows of the batch outputs.

        ``rows`` is for a caller that has checked ``inputs`` itself (a server checks each
        request against the model's config): numpy arrays that agree on their batch size
        ``rows``, within 1..max_batch_size. The batcher then takes them as they are; without
        it, it checks them (see Raises above).

        ``timeout_s`` is a deadline for the whole request (a transport's, as gRPC's).
        ``scheduling`` is the request's own priority and ``timeout``: with the policy's
        priorities enabled, that timeout is a queue timeout, and only where the level's
        policy allows an override; without, it is one more deadline.
        """
        if self._closing:
            raise ModelNotReady(f"{self.name} is unloading; retry to reach the current version")
        request = self._make_request(inputs) if rows is None else self._checked_request(
            inputs, rows)
        priorities = self.policy.priorities
        level_policy = queue_timeout = None
        if scheduling is not None:
            request.level = priorities.level_of(scheduling.priority, self.name)
            if not priorities.enabled:
                timeout_s = _earliest(timeout_s, scheduling.timeout_s)
        elif priorities.enabled:
            request.level = priorities.default_level
        if priorities.enabled:
            level_policy = priorities.policy(request.level)
            queue_timeout = level_policy.timeout_for(
                None if scheduling is None else scheduling.timeout_s)
        if self._observer is not None:
            request.context = contextvars.copy_context()
        if self._queued >= self.policy.max_queue_size:
            self.stats.rejected += 1
            raise Overloaded(f"{self.name}: queue is full ({self._queued} requests waiting, "
                             f"max_queue_size {self.policy.max_queue_size})", self._retry_after())
        waiting = self._level_sizes.get(request.level, 0)
        if level_policy is not None and 0 < level_policy.max_queue_size <= waiting:
            self.stats.rejected += 1
            raise Overloaded(f"{self.name}: the {queue_name(request.level)} is full ({waiting} "
                             f"requests waiting, max_queue_size {level_policy.max_queue_size})",
                             self._retry_after())
        group = self._groups.get(request.key)
        if group is None:
            group = self._groups[request.key] = PriorityGroup()
        group.append(request)
        self._queued += 1
        self._level_sizes[request.level] = waiting + 1
        self._returns.arrived(request.enqueued)
        self.stats.requests += 1
        self.stats.rows += request.rows
        self._wake.set()
        timeout = self.policy.default_timeout_s if timeout_s is None else timeout_s
        try:
            if queue_timeout is not None:
                assert level_policy is not None
                return await self._wait_queued(request, queue_timeout, level_policy.reject,
                                               timeout)
            if timeout is None:
                return await request.future
            return await asyncio.wait_for(request.future, timeout)
        except TimeoutError:
            self._remove(request)
            self.stats.timed_out += 1
            raise TimedOut(f"{self.name}: no result within {timeout:.3f} s "
                           f"(queue depth {self._queued})") from None
        except asyncio.CancelledError:
            self._remove(request)
            self.stats.cancelled += 1
            raise

    async def _wait_queued(self, request: _Request, queue_timeout: float, reject: bool,
                           deadline: float | None) -> Arrays:
        """Wait for the result of a request whose level has a queue timeout: still queued
        after `queue_timeout` seconds, it is rejected (`reject`) or moved behind its level's
        requests still within theirs (DELAY). `deadline` bounds the whole wait."""
        if deadline is not None and deadline <= queue_timeout:
            return await asyncio.wait_for(request.future, deadline)
        # `asyncio.wait` leaves the future alone when the time runs out, unlike `wait_for`.
        await asyncio.wait((request.future,), timeout=queue_timeout)
        if not request.future.done():
            if reject and self._remove(request):
                self.stats.timed_out += 1
                raise QueueTimedOut(
                    f"{self.name}: the request timed out in the {queue_name(request.level)} "
                    f"after {queue_timeout:.3f} s (queue policy timeout_action REJECT; "
                    f"{self._queued} requests waiting)", self._retry_after())
            if not reject:
                group = self._groups.get(request.key)
                if group is not None:
                    group.delay(request)
        if deadline is None:
            return await request.future
        return await asyncio.wait_for(
            request.future, max(0.0, deadline - (time.monotonic() - request.enqueued)))

    def _make_request(self, inputs: Mapping[str, Any]) -> _Request:
        if not isinstance(inputs, Mapping) or not inputs:
            raise InputError(f"{self.name}: inputs must be a non-empty mapping of name to array")
        arrays = {name: np.asarray(value) for name, value in inputs.items()}
        if self.batch_axes is None:  # no batch dimension: one request is one run
            return self._checked_request(arrays, 1)
        rows = {name: array.shape[self._axis(name)] if array.ndim > self._axis(name) else None
                for name, array in arrays.items()}
        if None in rows.values():
            short = next(name for name, count in rows.items() if count is None)
            what = ("is a scalar" if not arrays[short].ndim
                    else f"has shape {list(arrays[short].shape)}")
            raise InputError(f"{self.name}: input {short!r} {what}; inputs need a batch "
                             f"dimension (axis {self._axis(short)})")
        sizes = set(rows.values())
        if len(sizes) != 1:
            raise InputError(f"{self.name}: inputs disagree on the batch size ("
                             f"{'first dimension' if self._first_axis else 'batch axes'}): "
                             + ", ".join(f"{name} {count}" for name, count in rows.items()))
        size = sizes.pop()
        if not 1 <= size <= self.policy.max_batch_size:
            raise InputError(f"{self.name}: batch size {size} is outside 1..max_batch_size "
                             f"{self.policy.max_batch_size}; split the request")
        return self._checked_request(arrays, size)

    def _axis(self, name: str) -> int:
        return 0 if not self.batch_axes else self.batch_axes.get(name, 0)

    def _checked_request(self, arrays: Mapping[str, np.ndarray], rows: int) -> _Request:
        """The queue entry of checked inputs; requests with equal keys can be joined (without
        a batch dimension, only a request's own key is equal to it)."""
        if self._first_axis:  # the usual case, on every request: no look-up per input
            key: Hashable = tuple(sorted((name, array.shape[1:], array.dtype.str)
                                         for name, array in arrays.items()))
        elif self.batch_axes is None:
            key = object()
        else:
            key = tuple(sorted((name, _without(array.shape, self._axis(name)), array.dtype.str)
                               for name, array in arrays.items()))
        future = asyncio.get_running_loop().create_future()
        return _Request(arrays, rows, key, future, time.monotonic())

    def _remove(self, request: _Request) -> bool:
        """Take `request` out of the queue; False where it was taken into a batch already
        (its result will be dropped)."""
        group = self._groups.get(request.key)
        if group is None or not group.remove(request):
            return False
        self._queued -= 1
        self._level_sizes[request.level] -= 1
        if not group:
            del self._groups[request.key]
        return True

    def _retry_after(self) -> float:
        batches_waiting = self._queued / self.policy.max_batch_size + 1
        per_batch = self.stats.compute_time_s.mean or self.policy.max_queue_delay_s
        return max(0.001, batches_waiting * per_batch / self.policy.max_concurrent_batches)

    async def _dispatch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._slots.acquire()
            batch = await self._next_batch()
            if batch is None:
                self._slots.release()
                break
            task = loop.create_task(self._execute(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    async def _next_batch(self) -> list[_Request] | None:
        """Wait until some group may be dispatched; pop and return its requests."""
        while True:
            now = time.monotonic()
            ready: list[tuple[tuple[int, bool, float], Hashable, int]] = []
            wake_at = None
            idle = self.policy.dispatch_when_idle and not self._running
            # Where the last batch's callers lately came back, its company is still to come
            # (`CallerReturns`): every group waits for it, up to a share of that batch's time
            # (not where the config asks for no delay at all).
            returned_by = (self._returns.wait_until(now, self._queued)
                           if self.policy.max_queue_delay_s > 0 else None)
            for key, group in self._groups.items():
                count, rows, full = self._plan(group)
                due = group.oldest() + self.policy.max_queue_delay_s
                if due < self._slot_freed:
                    # Its delay ran out while every slot was busy: that was no wait for
                    # company. Dispatching it the moment a long batch ends, before that batch's
                    # callers can come back, would settle a steady load into alternating
                    # small and large batches; it gets one delay from the free slot instead.
                    due = self._slot_freed + self.policy.max_queue_delay_s
                if returned_by is not None:
                    due = max(due, returned_by)
                if full or due <= now or self._closing or (
                        idle and rows >= self._last_rows and returned_by is None):
                    # The highest priority level first, then the request waiting longest.
                    front = group.front()
                    ready.append(((front.level, front.delayed, front.enqueued), key, count))
                elif wake_at is None or due < wake_at:
                    wake_at = due
            if ready:
                _, key, count = min(ready, key=lambda item: item[0])
                return self._pop(key, count)
            if self._closing:
                return None
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(),
                                       None if wake_at is None else max(0.0, wake_at - now))
            except TimeoutError:
                pass

    def _plan(self, group: PriorityGroup[_Request]) -> tuple[int, int, bool]:
        """How many requests (from the front) to take, their rows, and whether that batch is
        ready by size."""
        limit = self.policy.max_batch_size
        rows = count = preferred = preferred_rows = 0
        for request in group:
            if rows + request.rows > limit:
                return count, rows, True
            rows += request.rows
            count += 1
            if rows in self._preferred:
                preferred, preferred_rows = count, rows
        if rows == limit:
            return count, rows, True
        return (preferred, preferred_rows, True) if preferred else (count, rows, False)

    def _pop(self, key: Hashable, count: int) -> list[_Request]:
        group = self._groups[key]
        batch = [group.popleft() for _ in range(count)]
        self._queued -= count
        self._computing += count
        for request in batch:
            self._level_sizes[request.level] -= 1
        self._last_rows = sum(request.rows for request in batch)
        self._returns.dispatched()
        if not group:
            del self._groups[key]
        return batch

    async def _execute(self, batch: Sequence[_Request]) -> None:
        started = time.monotonic()
        try:
            live = [request for request in batch if not request.future.done()]
            if live:
                await self._run_batch(live)
        finally:
            self._computing -= len(batch)
            self._slot_freed = time.monotonic()
            self._returns.batch_finished(self._slot_freed, len(batch), self._queued,
                                         self._slot_freed - started)
            self._slots.release()

    async def _run_batch(self, batch: Sequence[_Request]) -> None:
        started = time.monotonic()
        for request in batch:
            self.stats.queue_time_s.observe(started - request.enqueued)
        rows = sum(request.rows for request in batch)
        self.stats.batches += 1
        self.stats.batch_rows.observe(rows)
        self.stats.batch_requests.observe(len(batch))
        try:
            outputs = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._join_and_infer, [request.inputs for request in batch],
                rows)
            self._check_outputs(outputs, rows)
        except Exception as error:  # noqa: BLE001 - reported to exactly this batch's callers
            self.stats.compute_time_s.observe(time.monotonic() - started)
            if self._observer is not None:
                self._observe(batch, started, error)
            self._fail(batch, error)
            return
        self.stats.compute_time_s.observe(time.monotonic() - started)
        if self._observer is not None:
            self._observe(batch, started, None)
        start = 0
        for request in batch:
            stop = start + request.rows
            if not request.future.done():
                request.future.set_result(outputs if len(batch) == 1 else {
                    name: array[_rows(array.ndim, self._axis(name), start, stop)]
                    for name, array in outputs.items()})
                self.stats.succeeded += 1
            start = stop

    def _observe(self, batch: Sequence[_Request], started: float,
                 error: Exception | None) -> None:
        assert self._observer is not None
        self._observer(BatchRun(
            tuple(contextvars.Context() if request.context is None else request.context
                  for request in batch),
            tuple(request.enqueued for request in batch),
            tuple(request.rows for request in batch), started, time.monotonic(), error))

    def _join_and_infer(self, inputs: Sequence[Mapping[str, np.ndarray]],
                        rows: int) -> Mapping[str, np.ndarray]:
        """The requests' rows joined into one batch and run, on a compute thread: a batch of
        images is tens of MB to copy, which would stall the event loop. A lone request runs
        as it is; several are joined where `batch_buffers` says (one copy of each)."""
        if self._core_share is None:
            return self._join_and_run(inputs, rows)
        with self._core_share.batch(len(inputs)):
            return self._join_and_run(inputs, rows)

    def _join_and_run(self, inputs: Sequence[Mapping[str, np.ndarray]],
                      rows: int) -> Mapping[str, np.ndarray]:
        if len(inputs) == 1:
            return self.infer(inputs[0])
        if not self._first_axis:
            return self.infer({name: np.concatenate([request[name] for request in inputs],
                                                    axis=self._axis(name))
                               for name in inputs[0]})
        with self._batch_buffers(inputs[0], rows) as batch:
            for name, buffer in batch.buffers.items():
                join_rows(buffer, [request[name] for request in inputs])
            return batch.run()

    def _host_batch(self, example: Mapping[str, np.ndarray], rows: int) -> BatchBuffers:
        return HostBatch(example, rows, self.infer)

    def _check_outputs(self, outputs: Mapping[str, np.ndarray], rows: int) -> None:
        if self.batch_axes is None:
            return
        for name, array in outputs.items():
            axis = self._axis(name)
            length = array.shape[axis] if getattr(array, "ndim", 0) > axis else None
            if length != rows:
                where = "first" if axis == 0 else f"at axis {axis}"
                raise ExecutionError(f"{self.name}: output {name!r} has batch dimension "
                                     f"{length} for a batch of {rows} rows; outputs must keep "
                                     f"the batch dimension {where}")

    def _fail(self, batch: Sequence[_Request], error: Exception) -> None:
        for request in batch:
            if not request.future.done():
                request.future.set_exception(error)
                self.stats.failed += 1


def _earliest(*timeouts: float | None) -> float | None:
    """The shortest of the given timeouts, or None where none is given."""
    given = [timeout for timeout in timeouts if timeout is not None]
    return min(given) if given else None


def _without(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    """`shape` less its batch dimension at `axis`."""
    return shape[:axis] + shape[axis + 1:]


def _rows(ndim: int, axis: int, start: int, stop: int) -> tuple[slice, ...]:
    """The index of rows `start` to `stop` along `axis` of an array of `ndim` dimensions."""
    return (*(slice(None),) * axis, slice(start, stop)) if ndim > axis else ()
