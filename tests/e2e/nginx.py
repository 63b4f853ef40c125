"""Find nginx, or install Debian's package once per machine (as root, with apt-get).

`nginx_or_skip()` returns the binary, or skips the calling test with a loud reason saying why
nginx could not be had (not root, no apt-get, the install failed). A failed install is not tried
again in the same test session.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

PACKAGES = ("nginx-light", "nginx")  # the smaller package first; both ship /usr/sbin/nginx
SBIN_NGINX = Path("/usr/sbin/nginx")
APT_TIMEOUT_S = 300
_failure: list[str] = []  # why the install failed, once it has


def find_nginx() -> str | None:
    """Path of an nginx binary on PATH or at /usr/sbin/nginx, or None."""
    found = shutil.which("nginx")
    if found is None and SBIN_NGINX.is_file() and os.access(SBIN_NGINX, os.X_OK):
        found = str(SBIN_NGINX)
    return found


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(["apt-get", *args], capture_output=True, text=True,
                          timeout=APT_TIMEOUT_S, env=environment, check=False)


def _candidate(package: str) -> bool:
    """Whether apt's package lists offer `package` (no network)."""
    result = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True,
                            timeout=60, check=False)
    match = re.search(r"Candidate:\s*(\S+)", result.stdout)
    return match is not None and match.group(1) != "(none)"


def _install() -> str:
    """Install the first package apt offers; the nginx binary, or raise RuntimeError saying why."""
    if os.geteuid() != 0:
        raise RuntimeError("not running as root, so apt-get cannot install nginx")
    if shutil.which("apt-get") is None or shutil.which("apt-cache") is None:
        raise RuntimeError("apt-get/apt-cache not found (not a Debian-like system)")
    problems: list[str] = []
    for refresh in (False, True):  # the local package lists first; `apt-get update` if they fail
        if refresh:
            update = _apt("update")
            if update.returncode != 0:
                problems.append(f"apt-get update exited {update.returncode}: "
                                f"{update.stderr.strip()[-1500:]}")
                break
        for package in PACKAGES:
            if not _candidate(package):
                problems.append(f"apt offers no {package} (refreshed lists: {refresh})")
                continue
            result = _apt("install", "-y", "--no-install-recommends", package)
            binary = find_nginx()
            if result.returncode == 0 and binary is not None:
                return binary
            problems.append(f"apt-get install -y {package} exited {result.returncode}: "
                            f"{result.stderr.strip()[-1500:]}")
    raise RuntimeError("; ".join(problems))


def nginx_or_skip(purpose: str) -> str:
    """The nginx binary, installed if missing; skip loudly (naming `purpose`) where it cannot be."""
    binary = find_nginx()
    if binary is not None:
        return binary
    if not _failure:
        try:
            return _install()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
            _failure.append(str(error))
    pytest.skip(f"NGINX UNAVAILABLE, {purpose} NOT RUN: nginx is not installed and could not "
                f"be installed ({_failure[0]}). Install it with `apt-get install nginx-light` "
                "(as root) to run this check.")
