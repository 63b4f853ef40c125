"""Triton's load tool, perf_analyzer, prepared to run on this machine: `command()`.

The tool ships in the ``perf-analyzer`` wheel from PyPI, whose binary needs glibc 2.38 (and the
GCC 13 C++ library). Debian 12 has glibc 2.36, and pip there does not even offer the wheel (its
platform tag is manylinux_2_38). So the wheel is downloaded for that tag, checked against its
pinned sha256, and the binary taken out of it; where the machine's own C library is too old,
Debian 13's ``libc6``, ``libstdc++6`` and ``libgcc-s1`` are fetched with apt (through an index
of their own, so the machine's sources stay as they are; apt checks the archive's signature)
and unpacked beside it, and the binary is started through their dynamic loader. The other
libraries it links (zlib, OpenSSL 3) are the machine's.

Everything lands in one cache folder (``$HYBRIDSERVE_PERF_ANALYZER_DIR``, else
``$XDG_CACHE_HOME/hybridserve-tests/perf-analyzer-VERSION``), prepared once and then reused.
Run ``python -m tests.e2e.perf_analyzer`` to prepare it and print the command.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSION = "2.60.0"
WHEEL = f"perf_analyzer-{VERSION}-py3-none-manylinux_2_38_x86_64.whl"
WHEEL_SHA256 = "23ef56b107ae9233e5cf09fbdf508dd9b936a52f1bae2f63f53c8117087b3f25"
# Debian 13 (trixie): its C and C++ runtime, the release the binary is built for.
RUNTIME_SUITE = "trixie"
RUNTIME_PACKAGES = ("libc6", "libstdc++6", "libgcc-s1")
ARCHIVE = "http://deb.debian.org/debian"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
HOST_LIBRARIES = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu")
LOADER = "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
STEP_TIMEOUT_S = 600


class Unavailable(Exception):
    """perf_analyzer cannot be prepared or run here; the message says why."""


def cache_dir() -> Path:
    """Where the wheel's binary and the runtime libraries are kept."""
    given = os.environ.get("HYBRIDSERVE_PERF_ANALYZER_DIR")
    if given:
        return Path(given)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "hybridserve-tests" / f"perf-analyzer-{VERSION}"


def command() -> list[str]:
    """The argv prefix that runs perf_analyzer, preparing the cache folder first if needed.

    Raises:
        Unavailable: not an x86-64 Linux machine, the downloads failed (no network, no apt),
            or the binary does not run even through Debian 13's C library.
    """
    if sys.platform != "linux" or platform.machine() != "x86_64":
        raise Unavailable(f"the perf-analyzer wheel is for x86-64 Linux only, not "
                          f"{sys.platform}/{platform.machine()}")
    folder = cache_dir()
    for argv in (_direct(folder), _through_runtime(folder)):
        if argv is not None and _runs(argv):
            return argv
    folder.mkdir(parents=True, exist_ok=True)
    binary = _binary(folder)
    if _runs([str(binary)]):
        return [str(binary)]
    argv = [*_runtime_loader(folder), str(binary)]
    if not _runs(argv):
        raise Unavailable(f"perf_analyzer {VERSION} does not run here, even through Debian "
                          f"13's C library in {folder / 'runtime'}: "
                          f"{_run_error(argv)}")
    return argv


def _direct(folder: Path) -> list[str] | None:
    binary = folder / "perf_analyzer"
    return [str(binary)] if binary.is_file() else None


def _through_runtime(folder: Path) -> list[str] | None:
    binary, runtime = folder / "perf_analyzer", folder / "runtime"
    if not (binary.is_file() and (runtime / LOADER).is_file()):
        return None
    return [*_loader_argv(runtime), str(binary)]


def _runs(argv: list[str]) -> bool:
    return _run_error(argv) is None


def _run_error(argv: list[str]) -> str | None:
    """None when ``perf_analyzer --version`` works, else what it said."""
    try:
        done = subprocess.run([*argv, "--version"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    said = (done.stdout + done.stderr).decode(errors="replace")
    return None if done.returncode == 0 and "Perf Analyzer" in said else said.strip()[-500:]


def _binary(folder: Path) -> Path:
    """The wheel's binary in `folder`, downloaded and checked first."""
    target = folder / "perf_analyzer"
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        _step([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--platform", "manylinux_2_38_x86_64", "--python-version", "3.11",
               "--disable-pip-version-check", "-d", scratch, f"perf-analyzer=={VERSION}"],
              "download the perf-analyzer wheel from PyPI")
        wheel = Path(scratch) / WHEEL
        if not wheel.is_file():
            raise Unavailable(f"pip did not download {WHEEL}: {os.listdir(scratch)}")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != WHEEL_SHA256:
            raise Unavailable(f"{WHEEL} has sha256 {digest}, expected {WHEEL_SHA256}")
        partial = Path(scratch) / "perf_analyzer"
        with zipfile.ZipFile(wheel) as archive, archive.open("perf_analyzer/bin/perf_analyzer"
                                                             ) as source:
            partial.write_bytes(source.read())
        partial.chmod(0o755)
        partial.replace(target)  # whole or absent, should two sessions prepare at once
    return target


def _runtime_loader(folder: Path) -> list[str]:
    """The loader argv of Debian 13's C library, unpacked under `folder` first."""
    runtime = folder / "runtime"
    if (runtime / LOADER).is_file():
        return _loader_argv(runtime)
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise Unavailable(f"glibc {platform.libc_ver()[1]} is older than the 2.38 "
                              f"perf_analyzer needs, and {tool} (to fetch Debian 13's) is "
                              "not installed")
    if not KEYRING.is_file():
        raise Unavailable(f"no Debian archive keyring at {KEYRING} to check Debian 13's packages")
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        state = Path(scratch)
        sources = state / "sources.list"
        sources.write_text(f"deb [signed-by={KEYRING}] {ARCHIVE} {RUNTIME_SUITE} main\n")
        for sub in ("lists/partial", "cache/archives/partial", "debs", "runtime"):
            (state / sub).mkdir(parents=True)
        settings = {"Dir::Etc::SourceList": sources, "Dir::Etc::SourceParts": "/dev/null",
                    "Dir::State::Lists": state / "lists", "Dir::Cache": state / "cache",
                    "Dir::State::status": "/dev/null", "Debug::NoLocking": 1,
                    "APT::Sandbox::User": "root"}
        options = [part for key, value in settings.items() for part in ("-o", f"{key}={value}")]
        _step(["apt-get", *options, "update"], f"read Debian {RUNTIME_SUITE}'s package index")
        _step(["apt-get", *options, "download", *RUNTIME_PACKAGES],
              f"download {', '.join(RUNTIME_PACKAGES)} from Debian {RUNTIME_SUITE}",
              cwd=state / "debs")
        for deb in sorted((state / "debs").glob("*.deb")):
            _step(["dpkg-deb", "-x", str(deb), str(state / "runtime")], f"unpack {deb.name}")
        if not (state / "runtime" / LOADER).is_file():
            raise Unavailable(f"Debian {RUNTIME_SUITE}'s libc6 has no {LOADER}")
        if not runtime.exists():
            (state / "runtime").replace(runtime)
    return _loader_argv(runtime)


def _loader_argv(runtime: Path) -> list[str]:
    libraries = [str(runtime / "usr/lib/x86_64-linux-gnu"), *HOST_LIBRARIES]
    return [str(runtime / LOADER), "--library-path", ":".join(libraries)]


def _step(argv: list[str], what: str, cwd: Path | None = None) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, cwd=cwd, timeout=STEP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise Unavailable(f"could not {what}: {error}") from None
    if done.returncode != 0:
        said = (done.stdout + done.stderr).decode(errors="replace").strip()
        raise Unavailable(f"could not {what} ({' '.join(argv[:3])} ... exited "
                          f"{done.returncode}): {said[-800:]}")


if __name__ == "__main__":
    try:
        print(" ".join(command()))
    except Unavailable as error:
        sys.exit(f"perf_analyzer unavailable: {error}")
