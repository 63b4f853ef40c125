"""`LRUCache`: a bounded mapping that forgets its least recently used entry when full.

A model compiles a plan and infers shapes once per input signature; clients choosing shapes
freely (an image model with variable height and width) would otherwise grow those caches
without limit. Reads take no lock: ``OrderedDict.get`` and ``move_to_end`` are atomic under the
GIL, and a key evicted between the two is simply not moved. Writes take the cache's lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

DEFAULT_CAPACITY = 64


class LRUCache(Generic[K, V]):
    """At most `capacity` entries; `put` past that evicts the least recently used one.

    Args:
        capacity: the most entries kept (at least 1).
        on_evict: called with (key, value) of each evicted entry, under the cache's lock.

    Example:
        >>> cache = LRUCache(2)
        >>> cache.put("a", 1)
        >>> cache.put("b", 2)
        >>> cache.get("a")
        1
        >>> cache.put("c", 3)
        >>> cache.keys()
        ['a', 'c']
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY,
                 on_evict: Callable[[K, V], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"cache capacity must be at least 1; got {capacity}")
        self.capacity = capacity
        self.evictions = 0
        self._items: OrderedDict[K, V] = OrderedDict()
        self._on_evict = on_evict
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value for `key` (marked as just used), or None."""
        value = self._items.get(key)
        if value is not None:
            try:
                self._items.move_to_end(key)
            except KeyError:  # evicted by another thread since the read
                pass
        return value

    def put(self, key: K, value: V) -> None:
        """Store `value`, evicting the least recently used entries past `capacity`."""
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                old_key, old_value = self._items.popitem(last=False)
                self.evictions += 1
                if self._on_evict is not None:
                    self._on_evict(old_key, old_value)

    def pop(self, key: K) -> V | None:
        """Remove `key` and give its value (None when it is not cached); not an eviction."""
        with self._lock:
            return self._items.pop(key, None)

    def touch(self, key: K) -> bool:
        """Mark `key` as just used; False when it is not (or no longer) cached."""
        try:
            self._items.move_to_end(key)
        except KeyError:
            return False
        return True

    def keys(self) -> list[K]:
        """A snapshot of the keys, least recently used first."""
        with self._lock:
            return list(self._items)

    def items(self) -> list[tuple[K, V]]:
        """A snapshot of the entries, least recently used first."""
        with self._lock:
            return list(self._items.items())

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items
