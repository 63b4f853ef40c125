"""Generated kernel code and numba's caches go to the cache directory, never the package tree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.cpu import cache, compiled

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "engine"

# A strided copy run as a spin-pool job: it compiles a numba kernel and generates a job's
# source, the two things that are cached on disk.
SCRIPT = """
import sys
import numpy as np
from engine.cpu import cache
cache.set_cache_dir(sys.argv[1])
from engine.kernels import strided_kernel
source = np.arange(64 * 512, dtype=np.float32).reshape(64, 512)[:, ::2]
target = np.zeros((64, 256), np.float32)
job = strided_kernel.job(0, target, source, source)
assert job is not None, "no job: numba or the spin pool is missing"
job()
assert (target == source).all()
"""

pytestmark = pytest.mark.skipif(not compiled.available(), reason="numba not installed")


def package_files() -> set[Path]:
    """Files under engine/ other than Python's own bytecode."""
    return {path for path in PACKAGE.rglob("*") if path.is_file() and path.suffix != ".pyc"}


def run(cache_dir: Path) -> None:
    subprocess.run([sys.executable, "-c", SCRIPT, str(cache_dir)], cwd=ROOT, check=True,
                   timeout=600, capture_output=True)


def test_job_sources_and_numba_caches_land_in_the_cache_directory(tmp_path: Path) -> None:
    before = package_files()
    run(tmp_path)
    assert list((tmp_path / "kernel_jobs").glob("job_*.py"))
    assert list((tmp_path / "numba").rglob("*.nbi"))
    assert package_files() == before


def test_an_unwritable_cache_directory_compiles_in_process(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    before = package_files()
    run(blocked / "cache")  # cannot be created: under a file
    assert package_files() == before


def test_the_default_is_the_users_cache_and_numba_follows_a_new_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from numba.core import config

    monkeypatch.setattr(config, "CACHE_DIR", config.CACHE_DIR)  # restored afterwards
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cache, "_settings", {"directory": None})
    assert cache.cache_dir() == tmp_path / "hybridserve"
    cache.set_cache_dir(tmp_path / "elsewhere")
    assert cache.cache_dir() == tmp_path / "elsewhere"
    assert cache.folder("kernel_jobs") == tmp_path / "elsewhere" / "kernel_jobs"
    assert config.CACHE_DIR == str(tmp_path / "elsewhere" / "numba")
