"""`CallerReturns`: whether a finished batch's callers come back to form the next batch.

Clients that send a request as soon as the last one is answered (perf_analyzer, Triton's and
our own load tools, a pipeline calling a model in a loop) come back a few milliseconds after
their batch ends, not all at once. Where the last of them comes more than a queue delay after
the first, the batch goes without it; the late ones then queue while that batch runs and go
together once it ends, while the first batch's callers come back during the second's compute:
a steady load split into two batches that take turns for good, neither ever waiting for the
other. ResNet-18's 602 KB requests over gRPC come back 4.5–8 ms after their batch, and at
concurrency 4 with a 2 ms delay the server ran 2.1–2.3 requests a batch where HTTP's, back
within 2.5–4.5 ms, made 3.8 (docs/benchmarks.md, "Triton beside ours under perf_analyzer").

So when a batch ends, the requests it answered and those queued make the company the next
batch can expect, and the next batch waits until that many requests are queued, but no longer
than `WAIT_FRACTION` of the finished batch's compute time, so that waiting adds at most that
share to a request's latency. It waits only where, after most of the last `HISTORY` batches, as
many requests arrived within that bound as the batch answered (whether or not a batch waited
for them: a load already split shows its callers coming back too). Callers that do not come
back (independent clients, a caller that has left) are misses, and a batcher that sees mostly
misses dispatches as it would without this.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

# A queued request waits for the company at most this share of the last batch's compute time.
WAIT_FRACTION = 0.25
# Batches whose callers came back (or did not) remembered: waiting needs most of them to have.
HISTORY = 8


@dataclass
class _Watch:
    """After one batch: the requests expected queued, and until when."""

    answered: int  # the batch's requests: as many arrivals by `until` are its callers back
    company: int  # the requests it answered and those queued when it ended
    until: float  # monotonic seconds
    arrived: int = 0
    settled: bool = False  # its callers came back, or its time is up: in the history
    open: bool = True  # no batch has gone since: the next one may wait for the company


class CallerReturns:
    """The company expected after the last finished batch, and whether batches' callers come
    back (times in seconds, `time.monotonic`)."""

    def __init__(self) -> None:
        self._watch: _Watch | None = None
        self._returned: deque[bool] = deque(maxlen=HISTORY)

    def batch_finished(self, now: float, answered: int, queued: int, compute_s: float) -> None:
        """A batch that answered ``answered`` requests and computed for ``compute_s`` ended
        at ``now``, with ``queued`` requests waiting."""
        self._settle(now)
        self._watch = _Watch(answered, answered + queued, now + WAIT_FRACTION * compute_s)

    def arrived(self, now: float) -> None:
        """A request was queued at ``now``."""
        self._settle(now)
        watch = self._watch
        if watch is not None and not watch.settled:
            watch.arrived += 1
            if watch.arrived >= watch.answered:
                watch.settled = True
                self._returned.append(True)

    def dispatched(self) -> None:
        """A batch went: the next waits for no company until another batch ends (its
        callers' arrivals still count towards the history)."""
        if self._watch is not None:
            self._watch.open = False

    def wait_until(self, now: float, queued: int) -> float | None:
        """Until when requests queued now should wait for the company (monotonic seconds), or
        None: it is there, its time is up, a batch went since, or lately callers seldom came
        back."""
        watch = self._watch
        if watch is None or not watch.open or queued >= watch.company or now > watch.until:
            return None
        if 2 * sum(self._returned) <= len(self._returned):
            return None
        return watch.until

    def _settle(self, now: float) -> None:
        """A batch whose callers are not back by the watch's time is a miss."""
        watch = self._watch
        if watch is not None and not watch.settled and now > watch.until:
            watch.settled = True
            self._returned.append(False)
