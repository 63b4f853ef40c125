"""`compiled.compiled_once`: kernels compiled once, whatever threads ask at once."""

from __future__ import annotations

import threading
import time

from engine.cpu.compiled import compiled_once


def test_threads_asking_at_once_compile_once_and_all_see_every_kernel() -> None:
    kernels: dict = {}
    builds = []
    start = threading.Barrier(8)
    seen = []

    def build() -> dict:
        builds.append(1)
        time.sleep(0.05)  # compiling takes a while: the other threads arrive meanwhile
        return {"first": 1, "second": 2}

    def ask() -> None:
        start.wait()
        seen.append(dict(compiled_once(kernels, build)))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1
    assert seen == [{"first": 1, "second": 2}] * 8  # never a half-filled dict
