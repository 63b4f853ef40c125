"""``HYBRIDSERVE_REQUIRE_GPU=1`` turns the skip of a ``gpu`` test into a failure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.device import gpu_unavailable_reason

ROOT = Path(__file__).resolve().parents[3]
GPU_TEST = """
import pytest


@pytest.mark.gpu
def test_on_the_gpu():
    pass
"""


def _run_gpu_test(tmp_path: Path, require: str | None) -> subprocess.CompletedProcess[str]:
    """pytest, with this suite's hooks, on one ``gpu``-marked test that passes if it runs."""
    test_file = tmp_path / "test_marked.py"
    test_file.write_text(GPU_TEST)
    env = {key: value for key, value in os.environ.items() if key != "HYBRIDSERVE_REQUIRE_GPU"}
    if require is not None:
        env["HYBRIDSERVE_REQUIRE_GPU"] = require
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
               "tests.conftest", "-c", str(ROOT / "pyproject.toml"), str(test_file)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="a GPU is here: nothing to skip")
def test_gpu_tests_skip_unless_required(tmp_path: Path) -> None:
    skipped = _run_gpu_test(tmp_path, None)
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout
    required = _run_gpu_test(tmp_path, "1")
    assert required.returncode == 1 and "1 error" in required.stdout, required.stdout
    assert "HYBRIDSERVE_REQUIRE_GPU is set but the GPU cannot be used" in required.stdout
