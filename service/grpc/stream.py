"""Answer the requests of one bidirectional stream concurrently, each as soon as it is done.

A client such as perf_analyzer ``--streaming`` keeps many requests in flight on one stream; a
request that waits for its batch must not hold back the answers to those sent after it, so
answers come back in the order they complete, and each names its request (its id).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import TypeVar

Request = TypeVar("Request")
Answer = TypeVar("Answer")
# Requests of one stream started and not yet answered out. A client that sends without reading
# would otherwise have every answer held here; at the bound the stream is read no further until
# answers go out, and gRPC's flow control holds the client back.
MAX_OUTSTANDING = 1024


class _Ended:
    """The stream is over: the client closed its side, or (`error`) reading it failed."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


async def as_completed(requests: AsyncIterable[Request],
                       answer: Callable[[Request], Awaitable[Answer]], *,
                       max_outstanding: int = MAX_OUTSTANDING) -> AsyncIterator[Answer]:
    """Yield ``answer(request)`` for every request, in the order the answers complete; end once
    the client has closed its side and every answer is out. `answer` turns its own failures
    into an answer (a stream goes on after one request fails). At most `max_outstanding`
    requests are started and not yet answered out. Closing the generator (the client hung up)
    cancels the requests still running."""
    done: asyncio.Queue[Answer | _Ended] = asyncio.Queue()
    running: set[asyncio.Task[None]] = set()
    slots = asyncio.Semaphore(max_outstanding)
    # Counted here when a request starts and by the consumer when its answer is taken: a
    # running task's done-callback may not have run yet when its answer is read.
    outstanding = 0

    async def settle(request: Request) -> None:
        try:
            result = await answer(request)
        except Exception as error:  # noqa: BLE001 - a bug in `answer`: the stream fails
            done.put_nowait(_Ended(error))
            return
        done.put_nowait(result)

    async def read() -> None:
        nonlocal outstanding
        try:
            async for request in requests:
                await slots.acquire()
                outstanding += 1
                task = asyncio.create_task(settle(request))
                running.add(task)
                task.add_done_callback(running.discard)
        except Exception as error:  # noqa: BLE001 - re-raised by the consumer below
            done.put_nowait(_Ended(error))
            return
        done.put_nowait(_Ended())

    reader = asyncio.create_task(read())
    reading = True
    try:
        while reading or outstanding:
            item = await done.get()
            if isinstance(item, _Ended):
                if item.error is not None:
                    raise item.error
                reading = False
                continue
            outstanding -= 1
            slots.release()
            yield item
    finally:
        reader.cancel()
        for task in list(running):
            task.cancel()
