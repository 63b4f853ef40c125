"""`bench/jit_profile.py`: samples put to the JIT functions whose compiled bytes lie there."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from bench import jit_profile

RNG = np.random.default_rng(40)


def random_bytes(count: int) -> bytes:
    return RNG.integers(0, 256, count, dtype=np.uint8).tobytes()


def test_a_function_is_found_in_each_copy_its_loader_placed_relocations_aside() -> None:
    """A function's bytes whose first window holds an address the loader filled in are found
    by a later window, in both modules that hold a copy; bytes found nowhere, nowhere."""
    body = random_bytes(400)
    loaded = bytearray(body)
    loaded[8:16] = random_bytes(8)  # an absolute address, patched as the code was loaded
    first = random_bytes(1000) + bytes(loaded) + random_bytes(500)
    second = random_bytes(64) + bytes(loaded) + random_bytes(64)
    code = [(0x10000, first), (0x90000, second)]
    assert jit_profile._located(body, code) == [0x10000 + 1000, 0x90000 + 64]
    assert jit_profile._located(random_bytes(400), code) == []


def test_a_place_holding_too_few_of_the_functions_bytes_is_not_it() -> None:
    """A signature's bytes alone, the rest of the function other bytes, is another function."""
    body = random_bytes(400)
    elsewhere = random_bytes(100) + body[:jit_profile.SIGNATURE] + random_bytes(600)
    assert jit_profile._located(body, [(0x5000, elsewhere)]) == []


def test_the_report_puts_each_sample_in_its_function(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Samples inside a found function count for it; inside the copied code but in no found
    function, for the JIT's unknown code; elsewhere, for perf's own symbol."""
    (tmp_path / "code_1000.bin").write_bytes(bytes(0x1000))
    functions = [(0x1100, 0x1200, "fused (abc)"), (0x1400, 0x1480, "requantize (abc)")]
    taken = ([(0x1150, "?")] * 6 + [(0x1410, "?")] * 2 + [(0x1900, "?")]
             + [(0x7F0000, "_PyEval_EvalFrameDefault")])
    options = argparse.Namespace(top=10, annotate=0, lines=5)
    jit_profile.report(taken, functions, tmp_path, options)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("10 samples")
    shares = {line.split(None, 2)[2]: line.split()[0] for line in lines[1:]}
    assert shares == {"fused (abc)": "60.0%", "requantize (abc)": "20.0%",
                      "[JIT code of no kept object]": "10.0%",
                      "_PyEval_EvalFrameDefault": "10.0%"}
