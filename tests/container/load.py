"""A light, bounded load of /predict requests, with a disruption fired part-way through.

A fixed number of requests, spread over a few threads that pause between requests, so the load
outlasts the disruption and whatever nginx does after it (its resolver re-reads the replica
list every few seconds). A request counts as lost unless it gets 200 with the expected outputs.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

LOST_SHOWN = 5  # lost requests described in full


@dataclass
class LoadResult:
    """Outcomes of one load run."""

    sent: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def lost_count(self) -> int:
        """Requests that did not get a 200 with the expected outputs."""
        return self.sent - self.outcomes["200"]


@dataclass
class PacedLoad:
    """`total` POSTs of `body` to `url` from `workers` threads, each pausing `pause_s`."""

    url: str
    body: dict[str, Any]
    check: Callable[[dict[str, Any]], bool]
    total: int
    workers: int = 4
    pause_s: float = 0.25
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _result: LoadResult = field(default_factory=LoadResult, init=False)
    _done: int = field(default=0, init=False)

    def run(self, disrupt_after: int, disrupt: Callable[[], None]) -> LoadResult:
        """Send the load; call `disrupt()` once `disrupt_after` requests have completed."""
        reached = threading.Event()
        threads = [threading.Thread(target=self._worker, args=(disrupt_after, reached),
                                    daemon=True) for _ in range(self.workers)]
        start = time.monotonic()
        for thread in threads:
            thread.start()
        reached.wait(timeout=120)
        disrupt()
        for thread in threads:
            thread.join(timeout=300)
        self._result.seconds = time.monotonic() - start
        return self._result

    def _take_ticket(self) -> bool:
        with self._lock:
            if self._result.sent >= self.total:
                return False
            self._result.sent += 1
            return True

    def _worker(self, disrupt_after: int, reached: threading.Event) -> None:
        with httpx.Client(timeout=60) as client:
            while self._take_ticket():
                outcome, detail = self._one(client)
                with self._lock:
                    self._result.outcomes[outcome] += 1
                    if outcome != "200" and len(self._result.lost) < LOST_SHOWN:
                        self._result.lost.append(detail)
                    self._done += 1
                    if self._done >= disrupt_after:
                        reached.set()
                time.sleep(self.pause_s)

    def _one(self, client: httpx.Client) -> tuple[str, str]:
        """(outcome, detail) of one request: the status, or the transport error's name."""
        try:
            response = client.post(self.url, json=self.body)
        except httpx.HTTPError as error:
            return type(error).__name__, f"{type(error).__name__}: {error}"
        if response.status_code != 200:
            return str(response.status_code), f"{response.status_code}: {response.text[:300]}"
        if not self.check(response.json()):
            return "wrong outputs", f"200 with unexpected outputs: {response.text[:300]}"
        return "200", ""
