"""`service.grpc.stream.as_completed`: a stream's answers in the order they complete."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from service.grpc.stream import as_completed
from tests.service.helpers import run

WAIT_S = 30.0


async def _sent(*items: str) -> AsyncIterator[str]:
    for item in items:
        yield item


def test_a_later_request_is_answered_before_an_earlier_one_still_running() -> None:
    async def scenario() -> list[str]:
        release = asyncio.Event()

        async def answer(request: str) -> str:
            if request == "slow":
                await release.wait()
            return request

        answers = as_completed(_sent("slow", "fast"), answer)
        first = await asyncio.wait_for(anext(answers), WAIT_S)
        release.set()
        return [first, *[item async for item in answers]]

    assert run(scenario()) == ["fast", "slow"]


def test_answers_flow_while_the_client_keeps_sending() -> None:
    """perf_analyzer keeps its stream open: an answer must not wait for the client's close."""
    async def scenario() -> list[str]:
        answered = asyncio.Event()

        async def requests() -> AsyncIterator[str]:
            yield "first"
            await asyncio.wait_for(answered.wait(), WAIT_S)  # times out if answers wait
            yield "second"

        async def answer(request: str) -> str:
            return request.upper()

        got = []
        async for item in as_completed(requests(), answer):
            got.append(item)
            answered.set()
        return got

    assert run(scenario()) == ["FIRST", "SECOND"]


def test_closing_the_stream_cancels_the_requests_still_running() -> None:
    async def scenario() -> None:
        started, cancelled = asyncio.Event(), asyncio.Event()

        async def answer(request: str) -> str:
            if request == "forever":
                started.set()
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    cancelled.set()
                    raise
            return request

        answers = as_completed(_sent("forever", "quick"), answer)
        assert await asyncio.wait_for(anext(answers), WAIT_S) == "quick"
        await asyncio.wait_for(started.wait(), WAIT_S)
        await answers.aclose()
        await asyncio.wait_for(cancelled.wait(), WAIT_S)

    run(scenario())


def test_a_failure_reading_the_requests_ends_the_stream_with_it() -> None:
    async def requests() -> AsyncIterator[str]:
        yield "one"
        raise ConnectionError("the client's stream broke")

    async def scenario() -> list[str]:
        async def answer(request: str) -> str:
            return request

        return [item async for item in as_completed(requests(), answer)]

    with pytest.raises(ConnectionError, match="stream broke"):
        run(scenario())


def test_a_client_that_does_not_read_is_read_no_further_at_the_bound() -> None:
    async def scenario() -> list[str]:
        started: list[str] = []
        two_started, release = asyncio.Event(), asyncio.Event()

        async def answer(request: str) -> str:
            started.append(request)
            if len(started) == 2:
                two_started.set()
            await release.wait()
            return request

        answers = as_completed(_sent("a", "b", "c"), answer, max_outstanding=2)
        first = asyncio.ensure_future(anext(answers))
        await asyncio.wait_for(two_started.wait(), WAIT_S)
        for _ in range(100):  # the loop's turns, not time: the reader had every chance
            await asyncio.sleep(0)
        assert started == ["a", "b"]
        release.set()
        return [await asyncio.wait_for(first, WAIT_S), *[item async for item in answers]]

    assert sorted(run(scenario())) == ["a", "b", "c"]
