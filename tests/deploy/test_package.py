"""The wheel the images install carries every file the packages read, not only their modules."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.deploy.helpers import ROOT

PACKAGES = ("engine", "service")


def _package_files() -> set[str]:
    """Every file under the packages that is not Python source or a cache."""
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if path.is_file() and path.suffix not in (".py", ".pyc") \
                    and "__pycache__" not in path.parts:
                found.add(path.relative_to(ROOT).as_posix())
    return found


def _docker_context(target: Path) -> Path:
    """What the Dockerfile's wheel stage copies: no .git, no egg-info that could list files."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, target / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, target / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


def test_the_wheel_holds_every_data_file_of_the_packages(tmp_path: Path) -> None:
    (tmp_path / "context").mkdir()
    context = _docker_context(tmp_path / "context")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(tmp_path / "wheels"),
                    str(context)], check=True, timeout=300, capture_output=True)
    (wheel,) = (tmp_path / "wheels").glob("hybridserve-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        inside = set(archive.namelist())
    expected = _package_files()
    assert "engine/ops/mxnet_ops.json" in expected
    assert expected <= inside, f"missing from the wheel: {sorted(expected - inside)}"
