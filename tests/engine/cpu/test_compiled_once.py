"""`compiled.compiled_once`: kernels compiled once, whatever threads ask at once; `prepare`
sets up numba's compiler once; `made_once` makes a thing once until `make_anew`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.cpu import compiled
from engine.cpu.compiled import compiled_once

ROOT = Path(__file__).resolve().parents[3]


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


def test_make_anew_makes_each_thing_again_and_keeps_what_was_made() -> None:
    made: dict = {}
    first = compiled.made_once(made, "kernel", lambda: object())
    assert compiled.made_once(made, "kernel", lambda: object()) is first

    compiled.make_anew()

    second = compiled.made_once(made, "kernel", lambda: object())
    assert second is not first
    assert any(kept.get("kernel") is first for kept in compiled._retired)  # still alive
    assert compiled.made_once(made, "kernel", lambda: object()) is second


def test_remade_makes_its_dicts_things_again_within_and_gives_the_old_ones_back_after() -> None:
    remade, other = {}, {}
    first = compiled.made_once(remade, "kernel", lambda: object())
    kept = compiled.made_once(other, "kernel", lambda: object())

    with compiled.remade(remade):
        within = compiled.made_once(remade, "kernel", lambda: object())
        assert within is not first
        assert compiled.made_once(other, "kernel", lambda: object()) is kept  # not named

    assert compiled.made_once(remade, "kernel", lambda: object()) is first
    assert any(held.get("kernel") is within for held in compiled._retired)  # still alive


PREPARE = """
import gc, json
from engine.cpu import compiled
gc.collect()
counts = [len(gc.get_objects())]
for _ in range(2):
    assert compiled.prepare()
    gc.collect()
    counts.append(len(gc.get_objects()))
print(json.dumps(counts))
"""


@pytest.mark.skipif(not compiled.available(), reason="numba is not installed")
def test_prepare_sets_up_numbas_compiler_in_its_first_call_only() -> None:
    # A process of its own: this one may have compiled kernels already.
    done = subprocess.run([sys.executable, "-c", PREPARE], cwd=ROOT, check=True, timeout=300,
                          capture_output=True, text=True)
    start, first, second = json.loads(done.stdout.splitlines()[-1])
    assert first - start > 20_000  # the import, the typing and target registries
    assert second - first < 100
