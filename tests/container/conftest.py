"""The container test runs only under `make container-test`, against a real Docker engine.

Tests marked `container` are deselected (not skipped) unless HYBRIDSERVE_CONTAINER_TEST=1, which
the make target sets, so the default `make test` never builds images. When asked for, a missing
or too old Docker fails the test with what to install; it is never skipped.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterator

import pytest

from tests.container.compose import DockerError, Project, docker_problem, versions

ENABLE_VARIABLE = "HYBRIDSERVE_CONTAINER_TEST"
RUN_LOG = pytest.StashKey[list[str]]()
UP_TIMEOUT_S = 240


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the `container` tests unless the make target asked for them."""
    if os.environ.get(ENABLE_VARIABLE) == "1":
        return
    chosen = [item for item in items if item.get_closest_marker("container") is None]
    if len(chosen) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in chosen])
        items[:] = chosen


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the measurements the container tests logged."""
    lines = terminalreporter.config.stash.get(RUN_LOG, [])
    if lines:
        terminalreporter.write_sep("-", "container test")
        for line in lines:
            terminalreporter.write_line(line)


def _free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def run_log(pytestconfig: pytest.Config) -> list[str]:
    """Lines printed after the test session (measurements worth keeping)."""
    return pytestconfig.stash.setdefault(RUN_LOG, [])


@pytest.fixture(scope="session")
def project(run_log: list[str]) -> Iterator[Project]:
    """docker-compose.yml built and up (seeded, 3 healthy replicas, nginx); always taken down."""
    problem = docker_problem()
    if problem is not None:
        pytest.fail(f"THE CONTAINER TEST CANNOT RUN: {problem}", pytrace=False)
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith("HYBRIDSERVE_")}  # the compose defaults are under test
    environment.update(DOCKER_BUILDKIT="1", HYBRIDSERVE_ADMIN_TOKEN=secrets.token_hex(16),
                       HYBRIDSERVE_HTTP_PORT=str(_free_port()),
                       HYBRIDSERVE_GRPC_HOST_PORT=str(_free_port()), HYBRIDSERVE_POLL_INTERVAL="1")
    project = Project(f"hybridserve-container-test-{os.getpid()}", environment)
    run_log.append(", ".join(f"{key} {value}" for key, value in versions().items()))
    try:
        project.compose("build", timeout=900)
        try:
            project.compose("up", "--detach", "--wait", "--wait-timeout", str(UP_TIMEOUT_S),
                            timeout=UP_TIMEOUT_S + 60)
        except DockerError as error:
            raise DockerError(f"{error}\n--- logs ---\n{project.logs()}") from error
        yield project
    finally:
        project.compose("down", "--volumes", "--remove-orphans", "--timeout", "10")
