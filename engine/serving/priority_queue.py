"""Priority levels of a batcher's queue, as Triton's ``priority_levels`` and queue policies.

A request joins one priority level (1 is served first; 0 when the model has no levels). Each
level has its own policy: a queue bound, and a timeout after which a waiting request is
rejected (REJECT) or moved behind the level's requests still within theirs (DELAY). A
`PriorityGroup` holds one batch group's requests in the order batches take them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from engine.errors import InputError
from engine.serving.config import DynamicBatchingConfig, QueuePolicyConfig


@dataclass(frozen=True)
class Scheduling:
    """A request's own scheduling parameters (Triton's ``priority`` and ``timeout``): its
    priority level (0: the model's default) and its ``timeout`` in seconds (None: none)."""

    priority: int = 0
    timeout_s: float | None = None


@dataclass(frozen=True)
class LevelPolicy:
    """One level's queue policy; times in seconds, None and 0 meaning no bound."""

    reject: bool = True  # timeout action REJECT; False: DELAY
    timeout_s: float | None = None
    allow_override: bool = False
    max_queue_size: int = 0

    @classmethod
    def from_config(cls, policy: QueuePolicyConfig) -> LevelPolicy:
        """The policy of a config's ``ModelQueuePolicy`` (microseconds to seconds)."""
        timeout = policy.default_timeout_microseconds
        return cls(policy.timeout_action == "REJECT", timeout / 1e6 if timeout else None,
                   policy.allow_timeout_override, policy.max_queue_size)

    def timeout_for(self, requested_s: float | None) -> float | None:
        """A request's queue timeout: the level's, shortened by the request's own where the
        policy allows it (never lengthened, as in Triton)."""
        if requested_s is None or not self.allow_override:
            return self.timeout_s
        return requested_s if self.timeout_s is None else min(requested_s, self.timeout_s)


@dataclass(frozen=True)
class PriorityPolicy:
    """A batcher's priority levels and their policies. With `enabled` False (a model that
    sets no priority field), there is one level, 0, and a request's ``timeout`` is a deadline
    for the whole request instead of a queue timeout."""

    levels: int = 0
    default_level: int = 0
    policies: Mapping[int, LevelPolicy] = field(default_factory=dict)
    default: LevelPolicy = LevelPolicy()
    enabled: bool = False

    @classmethod
    def from_config(cls, batching: DynamicBatchingConfig) -> PriorityPolicy:
        """The levels and policies a model's ``dynamic_batching`` sets."""
        return cls(batching.priority_levels, batching.default_priority_level,
                   {level: LevelPolicy.from_config(policy)
                    for level, policy in batching.priority_queue_policy.items()},
                   LevelPolicy.from_config(batching.queue_policy(0)), batching.has_queue_policy)

    def level_of(self, priority: int, name: str) -> int:
        """The level a request of `priority` joins: 0, or a priority past the model's levels,
        joins the default level, as Triton places it (a client's priority scheme need not
        match every model's).

        Raises:
            InputError: the priority is negative (naming the model).
        """
        if priority < 0:
            raise InputError(f"{name}: priority {priority} is negative; priorities count from "
                             "1 (the highest), and 0 or none means the default level")
        if priority == 0 or priority > self.levels:
            return self.default_level
        return priority

    def policy(self, level: int) -> LevelPolicy:
        """The queue policy of `level`."""
        return self.policies.get(level, self.default)


def queue_name(level: int) -> str:
    """How error messages name a level's queue."""
    return f"priority level {level} queue" if level else "queue"


class Queued(Protocol):
    """What a `PriorityGroup` reads of a queued request."""

    level: int
    delayed: bool
    enqueued: float


RequestT = TypeVar("RequestT", bound=Queued)


class PriorityGroup(Generic[RequestT]):
    """One batch group's requests in the order batches take them: by level, 1 first; within
    a level, those still within their queue timeout before the DELAYed ones; each in arrival
    order. Only non-empty queues are kept (one, for a model without priorities)."""

    __slots__ = ("_queues", "_size")

    def __init__(self) -> None:
        # (level, delayed) -> requests, the keys kept in ascending order.
        self._queues: dict[tuple[int, bool], deque[RequestT]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[RequestT]:
        for queue in self._queues.values():
            yield from queue

    def append(self, request: RequestT) -> None:
        """Queue `request` last in its level (and delayed state)."""
        key = (request.level, request.delayed)
        queue = self._queues.get(key)
        if queue is None:
            last = next(reversed(self._queues), None)
            queue = self._queues[key] = deque()
            if last is not None and last > key:
                self._queues = dict(sorted(self._queues.items()))
        queue.append(request)
        self._size += 1

    def front(self) -> RequestT:
        """The request the next batch takes first."""
        return next(iter(self._queues.values()))[0]

    def popleft(self) -> RequestT:
        """Take the front request."""
        key, queue = next(iter(self._queues.items()))
        request = queue.popleft()
        self._size -= 1
        if not queue:
            del self._queues[key]
        return request

    def remove(self, request: RequestT) -> bool:
        """Drop `request`; False where it is not queued here (taken into a batch)."""
        key = (request.level, request.delayed)
        queue = self._queues.get(key)
        if queue is None:
            return False
        try:
            queue.remove(request)
        except ValueError:
            return False
        self._size -= 1
        if not queue:
            del self._queues[key]
        return True

    def delay(self, request: RequestT) -> bool:
        """Move `request` behind its level's requests still within their timeout (DELAY);
        False where it is not queued here."""
        if not self.remove(request):
            return False
        request.delayed = True
        self.append(request)
        return True

    def oldest(self) -> float:
        """The earliest `enqueued` time of the requests here (the group is not empty)."""
        # A level's DELAYed requests are in the order they timed out, not the order they came.
        return min(min(request.enqueued for request in queue) if delayed else queue[0].enqueued
                   for (_, delayed), queue in self._queues.items())
