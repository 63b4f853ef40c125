"""Attribute parsing from several threads at once, as when two models load side by side."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator

import pytest

from engine.ops.attrs import parse_int_tuple, parse_literal


class _FinalizedCycle:
    """Garbage whose collection runs Python code, so the GIL can pass to another thread while
    CPython 3.11 builds an AST (the race of python/cpython#106905)."""

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        total = 0
        for step in range(30):
            total += step


@pytest.fixture
def eager_thread_switches() -> Iterator[None]:
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(interval)


@pytest.mark.usefixtures("eager_thread_switches")
def test_literals_parse_in_four_threads_at_once() -> None:
    # Without the parse lock this loop fails some twenty times in two seconds on 3.11.
    failures: list[str] = []
    deadline = time.monotonic() + 2.0

    def parse_until_deadline() -> None:
        while time.monotonic() < deadline:
            garbage = [_FinalizedCycle() for _ in range(5)]
            del garbage
            try:
                assert parse_literal(" {'kernel': (3, 3), 'eps': 1e-05} ") == {
                    "kernel": (3, 3), "eps": 1e-05}
                assert parse_int_tuple("(1, 512)") == (1, 512)
            except SystemError as error:
                failures.append(str(error))

    threads = [threading.Thread(target=parse_until_deadline) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_a_non_literal_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="cannot read"):
        parse_literal("__import__('os')")
