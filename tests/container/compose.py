"""Drive a real Docker engine for the container test: one throwaway Compose project.

Everything goes through the `docker` CLI (`docker compose`, `docker exec`, ...), so the test
needs nothing but Docker Engine with BuildKit and the Compose v2 plugin on PATH.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
MIN_COMPOSE = (2, 20)  # `depends_on: {required: false}` in docker-compose.yml
INSTALL_HINT = ("install Docker Engine with BuildKit (the docker-buildx plugin) and the Compose "
                "v2 plugin, version 2.20 or later (docker-compose-plugin); see docs/deploy.md")
HEALTHCHECK = ["python", "/opt/hybridserve/healthcheck.py"]


class DockerError(RuntimeError):
    """A docker command failed; the message holds the command and its output."""


def _run(args: Sequence[str], *, env: dict[str, str] | None = None, stdin: str | None = None,
         timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        result = subprocess.run(list(args), capture_output=True, text=True, input=stdin,
                                timeout=timeout, env=env, check=False, cwd=ROOT)
    except subprocess.TimeoutExpired as error:
        raise DockerError(f"`{' '.join(args)}` did not finish within {timeout:.0f} s") from error
    if check and result.returncode != 0:
        raise DockerError(f"`{' '.join(args)}` exited {result.returncode}:\n"
                          f"{result.stdout[-2000:]}{result.stderr[-3000:]}")
    return result


def docker_problem() -> str | None:
    """Why this machine cannot run the container test, or None when it can."""
    if shutil.which("docker") is None:
        return f"the `docker` command is not on PATH: {INSTALL_HINT}"
    info = _run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=60, check=False)
    if info.returncode != 0:
        return f"the Docker daemon does not answer `docker info`: {info.stderr.strip()[-500:]}"
    compose = _run(["docker", "compose", "version", "--short"], timeout=60, check=False)
    found = re.match(r"v?(\d+)\.(\d+)", compose.stdout.strip())
    if compose.returncode != 0 or found is None:
        return f"`docker compose` (Compose v2) is missing: {INSTALL_HINT}"
    version = (int(found.group(1)), int(found.group(2)))
    if version < MIN_COMPOSE:
        return f"Compose {compose.stdout.strip()} is older than 2.20: {INSTALL_HINT}"
    if _run(["docker", "buildx", "version"], timeout=60, check=False).returncode != 0:
        return f"BuildKit's `docker buildx` is missing: {INSTALL_HINT}"
    return None


def versions() -> dict[str, str]:
    """Docker engine, Compose and buildx versions, for the report."""
    return {
        "engine": _run(["docker", "info", "--format", "{{.ServerVersion}}"]).stdout.strip(),
        "compose": _run(["docker", "compose", "version", "--short"]).stdout.strip(),
        "buildx": _run(["docker", "buildx", "version"]).stdout.strip(),
    }


@dataclass(frozen=True)
class Project:
    """One Compose project of docker-compose.yml, run under its own name and environment."""

    name: str
    env: dict[str, str]

    def compose(self, *args: str, timeout: float = 300) -> str:
        """Run `docker compose -p NAME ARGS...` and return its stdout."""
        command = ["docker", "compose", "-f", str(COMPOSE_FILE), "-p", self.name, *args]
        return _run(command, env=self.env, timeout=timeout).stdout

    def docker(self, *args: str, stdin: str | None = None, timeout: float = 120,
               check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `docker ARGS...` in the project's environment."""
        return _run(["docker", *args], env=self.env, stdin=stdin, timeout=timeout, check=check)

    def containers(self, service: str) -> list[str]:
        """Names of the service's containers (running or not), sorted."""
        output = self.compose("ps", "--all", "--format", "{{.Name}}", service)
        return sorted(line for line in output.split() if line)

    def inspect(self, container: str) -> dict[str, Any]:
        """`docker inspect` of one container."""
        (details,) = json.loads(self.docker("inspect", container).stdout)
        return details

    def published(self, service: str, port: int) -> str:
        """HOST:PORT on which the service's container port is published."""
        return self.compose("port", service, str(port)).strip()

    def exec_python(self, container: str, code: str, stdin: str = "") -> str:
        """Run Python code inside a container (as its own user); its stdout."""
        return self.docker("exec", "-i", container, "python", "-c", code, stdin=stdin).stdout

    def wait_ready(self, container: str, limit_s: float) -> float:
        """Seconds until the container's own health check passes; fail after `limit_s`."""
        start = time.monotonic()
        last = ""
        while time.monotonic() - start < limit_s:
            result = self.docker("exec", container, *HEALTHCHECK, check=False, timeout=30)
            if result.returncode == 0:
                return time.monotonic() - start
            last = (result.stderr or result.stdout).strip()
            time.sleep(0.2)
        raise DockerError(f"{container} not ready {limit_s:.0f} s after start: {last[-500:]}")

    def logs(self, tail: int = 80) -> str:
        """The last lines of every container's log, for a failure report."""
        return _run(["docker", "compose", "-f", str(COMPOSE_FILE), "-p", self.name, "logs",
                     "--no-color", "--tail", str(tail)], env=self.env, check=False).stdout
