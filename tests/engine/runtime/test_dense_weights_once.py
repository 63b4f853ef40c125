"""A dense weight our GEMM multiplies is held once: as its packed panels, not beside them.

The memory figure (`param_bytes` and `derived_bytes`, what the server's accounting adds up)
is about the parameters' size, and so is the RSS a load adds; the outputs are bit for bit
those of the same model holding its weights plain (the ``pack_weights`` pass left out), at
batch sizes compiled at once and later; the reference interpreter and the ONNX exporter get
the plain weights back.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.compiler import PASSES
from engine.kernels import gemm_kernel
from engine.kernels.packed_weight import PackedWeight
from tests.conformance.fixtures import model_files

ROOT = Path(__file__).resolve().parents[3]
WIDTHS = (1024, 2048, 2048, 1024)  # 8.4 M float32 parameters, 33.6 MB
PLAIN = [name for name in PASSES if name != "pack_weights"]

needs_gemm = pytest.mark.skipif(not gemm_kernel.available(),
                                reason="our GEMM does not compile here: nothing is packed")

# Run in a process of its own, so that the RSS is this load's alone: the kernels compile and
# the allocator settles on a small model first, then the large one loads and runs batches of
# 1, 7 and 64 rows. RSS as the e2e memory tests read it (/proc/<pid>/statm).
CHILD = """
import json, os, sys
import numpy as np
import engine
from engine.graph.params import save_params
from engine.serving.control import reclaim_memory
from engine import sym

def rss():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def mlp(widths):
    x = sym.var("data")
    for layer, units in enumerate(widths[1:]):
        x = sym.FullyConnected(x, num_hidden=units, name=f"fc{layer}")
        if layer < len(widths) - 2:
            x = sym.Activation(x, act_type="relu")
    return x

def write(path, widths):
    rng = np.random.default_rng(0)
    arrays = {}
    for layer, (fan_in, fan_out) in enumerate(zip(widths, widths[1:])):
        arrays[f"arg:fc{layer}_weight"] = rng.standard_normal((fan_out, fan_in), np.float32)
        arrays[f"arg:fc{layer}_bias"] = rng.standard_normal(fan_out, np.float32)
    save_params(path, arrays)
    return sum(array.nbytes for array in arrays.values())

def run(model, width):
    for rows in (1, 7, 64):
        model.infer({"data": np.ones((rows, width), np.float32)})

widths, folder = json.loads(sys.argv[1]), sys.argv[2]
small = [64, 64, 64, 64]
write(folder + "/small.params", small)
run(engine.load_model(mlp(small), folder + "/small.params"), small[0])
size = write(folder + "/large.params", widths)
reclaim_memory()
before = rss()
model = engine.load_model(mlp(widths), folder + "/large.params")
run(model, widths[0])
reclaim_memory()
print(json.dumps({"added": rss() - before, "size": size, "param_bytes": model.param_bytes,
                  "derived_bytes": model.derived_bytes}))
"""


@needs_gemm
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="RSS is read from /proc")
def test_a_dense_model_accounts_and_adds_about_its_parameters(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(WIDTHS), str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    size = figures["size"]
    accounted = figures["param_bytes"] + figures["derived_bytes"]
    # The panels pad the units to whole vectors: none here (multiples of 32).
    assert accounted == size, figures
    # Plus three small plans' buffers; two copies of the weights would add twice the size.
    assert 0.85 * size <= figures["added"] <= 1.2 * size, figures


@needs_gemm
def test_outputs_match_the_model_holding_its_weights_plain_bit_for_bit() -> None:
    symbol, params = model_files("seed_mlp")
    packed = engine.load_model(symbol, params)
    plain = engine.load_model(symbol, params, optimize=PLAIN)
    held = {name: packed.params.held(name) for name in packed.params}
    assert sum(isinstance(value, PackedWeight) for value in held.values()) == 2
    assert packed.param_bytes == plain.param_bytes
    rng = np.random.default_rng(5)
    batches = {rows: rng.standard_normal((rows, 512), np.float32) for rows in (1, 7, 64)}
    packed.infer({"data": batches[1]})  # batch 1 compiles first; 7 and 64 are compiled later
    for rows, data in batches.items():
        got, want = packed.infer({"data": data}), plain.infer({"data": data})
        for name in want:
            assert np.array_equal(got[name], want[name]), (rows, name)
    assert packed.derived_bytes == 0 < plain.derived_bytes  # nothing packed a second time
    for name in packed.params:  # each plan binds the one packed copy
        assert packed.params.held(name) is held[name]
        np.testing.assert_array_equal(packed.params[name], plain.params[name])


@needs_gemm
def test_the_reference_interpreter_and_the_onnx_export_see_the_plain_weights(
        tmp_path: Path) -> None:
    symbol, params = model_files("seed_mlp")
    packed = engine.load_model(symbol, params)
    plain = engine.load_model(symbol, params, optimize=PLAIN)
    assert isinstance(packed.params.held("seed_mlp_dense0_weight"), PackedWeight)
    data = {"data": np.random.default_rng(6).standard_normal((3, 512), np.float32)}
    got, want = packed.reference(data), plain.reference(data)
    for name in want:
        assert np.array_equal(got[name], want[name])
    pytest.importorskip("onnx")
    from engine.onnx import export

    export(packed, tmp_path / "packed.onnx")
    export(plain, tmp_path / "plain.onnx")
    assert (tmp_path / "packed.onnx").read_bytes() == (tmp_path / "plain.onnx").read_bytes()
    # what they rebuilt is theirs alone: the model still holds the panels only
    assert packed.param_bytes == plain.param_bytes and packed.derived_bytes == 0
