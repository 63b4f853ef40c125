"""Machine code kept on disk for the next process (`engine.cpu.jit_objects`, `llvm_jit.compile_ir`
with ``kept``): an object found is linked in place of compiling, another target or level looks
for another file, an unwritable directory compiles every time, and a network loaded by a second
process from the kept objects computes the same bytes as the first."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cpu import cache, jit_objects, llvm_jit

llvm = pytest.importorskip("llvmlite.binding")

REPO = Path(__file__).resolve().parents[3]

ADD = """
define i64 @step(i64 %x) {
  %y = add i64 %x, ADDEND
  ret i64 %y
}
"""


def adds(addend: int) -> str:
    return ADD.replace("ADDEND", str(addend))


def run_step(engine) -> int:
    step = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(engine.get_function_address("step"))
    return step(10)


@pytest.fixture
def kept_here(tmp_path: Path):
    cache.set_cache_dir(tmp_path)
    yield tmp_path / jit_objects.FOLDER
    cache.set_cache_dir(None)


def objects(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.o")) if folder.exists() else []


def test_a_kept_object_is_linked_in_place_of_compiling(kept_here: Path) -> None:
    """The first compile keeps its object; the second links whatever the file holds: here
    another function's code, put in its place, which the engine then runs."""
    assert run_step(llvm_jit.compile_ir(adds(1), kept=True)) == 11
    (kept,) = objects(kept_here)
    other = llvm_jit.compile_ir(adds(5), kept=True)
    assert run_step(other) == 15 and len(objects(kept_here)) == 2
    other_file = next(path for path in objects(kept_here) if path != kept)
    kept.write_bytes(other_file.read_bytes())
    assert run_step(llvm_jit.compile_ir(adds(1), kept=True)) == 15  # linked, not compiled
    assert run_step(llvm_jit.compile_ir(adds(1))) == 11  # not kept: compiled as always


def test_another_target_level_or_pass_choice_is_another_file(kept_here: Path) -> None:
    text = adds(2)
    for cpu, features, level, optimise in (("", "", 2, False), ("haswell", "+avx2", 2, False),
                                           ("", "", 3, False), ("", "", 2, True)):
        assert run_step(llvm_jit.compile_ir(text, cpu, features, level, optimise,
                                            kept=True)) == 12
    assert len(objects(kept_here)) == 4
    llvm_jit.compile_ir(text, kept=True)  # the first again: found, nothing added
    assert len(objects(kept_here)) == 4
    assert not list(kept_here.glob("*.o.*"))  # no partial file left behind


def test_an_unwritable_cache_compiles_every_time(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    cache.set_cache_dir(blocked)
    try:
        assert jit_objects.path_for(("x",), "text") is None
        assert run_step(llvm_jit.compile_ir(adds(3), kept=True)) == 13
    finally:
        cache.set_cache_dir(None)


LOAD_AND_RUN = """
import json, sys
import numpy as np
from engine.cpu import jit_objects
from bench import nets
import engine
from engine import sym
stored, found = [], []
store, load = jit_objects.store, jit_objects.load
jit_objects.store = lambda path, data: (stored.append(path), store(path, data))
jit_objects.load = lambda path: (lambda data: (found.append(data is not None), data)[1])(load(path))
net = sym.Activation(sym.Convolution(sym.var("data"), num_filter=32, kernel=(3, 3), pad=(1, 1),
                                     name="c1"), act_type="relu")
net = sym.Activation(sym.Convolution(net, num_filter=48, kernel=(1, 1), name="c2"),
                     act_type="relu")
symbol = sym.FullyConnected(sym.Flatten(net), num_hidden=10, name="fc")
params = nets.random_params(symbol, (1, 16, 14, 14), seed=2)
x = np.random.default_rng(0).standard_normal((1, 16, 14, 14), dtype=np.float32)
extra = {"calibration": {"data": x}} if sys.argv[1] == "int8" else {}
model = engine.load_model(symbol, params, optimize=True, precision=sys.argv[1], **extra)
out = next(iter(model.infer({"data": x}).values()))
print(json.dumps({"bytes": np.ascontiguousarray(out).tobytes().hex(), "stored": len(stored),
                  "found": sum(found), "asked": len(found)}))
"""


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_second_process_computes_the_same_bytes_from_the_kept_code(
        tmp_path: Path, precision: str) -> None:
    """A small CNN (a 3×3 and a 1×1 convolution, a dense layer: our GEMM's or the int8
    products' kernels) loaded in a process with an empty cache, then in another that finds
    every object kept: the same output bytes, and the second generates none of that code."""
    environment = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    runs = []
    for _ in range(2):
        child = subprocess.run([sys.executable, "-c", LOAD_AND_RUN, precision], cwd=REPO,
                               env=environment, capture_output=True, text=True, timeout=600,
                               check=True)
        runs.append(json.loads(child.stdout.strip().splitlines()[-1]))
    kept = objects(tmp_path / "hybridserve" / jit_objects.FOLDER)
    first, second = runs
    assert first["found"] == 0 and first["stored"] == first["asked"] == len(kept) > 0
    assert second["stored"] == 0 and second["found"] == second["asked"] == len(kept)
    assert second["bytes"] == first["bytes"]
