"""`service.collector`: numba's compiler is set up and frozen before the first CPU model loads,
and what a loader makes is never frozen.

Each check runs in a process of its own: freezing is process-wide, and the test process may have
set up numba already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cpu import compiled

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not compiled.available(), reason="numba is not installed")

SCRIPT = """
import gc, json, sys, weakref
from engine.cpu import compiled
from service.collector import CompilerFrozenFirst

if sys.argv[2] == "broken":
    def prepare():
        raise RuntimeError("no LLVM target for this host")
    compiled.prepare = prepare

class Model:
    pass

calls, made = [], []

def loader(symbol, params, *, device, **options):
    model = Model()
    model.itself = model  # a cycle: only the collector frees it
    made.append(weakref.ref(model))
    calls.append([symbol, params, device, options])
    return model

load = CompilerFrozenFirst(loader)
counts = {"start": gc.get_freeze_count()}
load("s.json", "p.params", device=sys.argv[1], precision="bf16")
counts["first"] = gc.get_freeze_count()
gc.collect()
collected_first = made[0]() is None
load("s.json", "p.params", device="cpu")
counts["second"] = gc.get_freeze_count()
gc.collect()
print(json.dumps({"counts": counts, "calls": calls,
                  "collected": [collected_first, made[1]() is None]}))
"""


def _run(device: str, compiler: str = "working") -> dict:
    done = subprocess.run([sys.executable, "-c", SCRIPT, device, compiler], cwd=ROOT, check=True,
                          timeout=300, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_the_first_cpu_load_freezes_numbas_compiler_and_never_the_models() -> None:
    seen = _run("cpu")
    counts = seen["counts"]
    # numba's import and its typing and target registries: tens of thousands of objects.
    assert counts["first"] - counts["start"] > 20_000, counts
    assert counts["second"] == counts["first"], "only the first load freezes"
    assert seen["collected"] == [True, True], "a loaded model's cycles stay collectable"
    assert seen["calls"] == [["s.json", "p.params", "cpu", {"precision": "bf16"}],
                             ["s.json", "p.params", "cpu", {}]]


def test_a_gpu_load_sets_up_no_cpu_compiler() -> None:
    seen = _run("gpu")
    assert seen["counts"]["first"] == seen["counts"]["start"]
    # The CPU load after it is the first for the CPU: it freezes then.
    assert seen["counts"]["second"] - seen["counts"]["first"] > 20_000, seen["counts"]
    assert seen["calls"][0][2] == "gpu"


def test_a_compiler_that_cannot_be_set_up_leaves_the_loads_as_they_were() -> None:
    seen = _run("cpu", "broken")
    counts = seen["counts"]
    assert counts["first"] == counts["second"] == counts["start"], "nothing frozen"
    assert [call[2] for call in seen["calls"]] == ["cpu", "cpu"]
    assert seen["collected"] == [True, True]
