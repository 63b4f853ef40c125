"""What a starting server checks before it serves: the repository directory, its HTTP ports."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from service.settings import Settings
from service.startup import StartError, bind_http, check_repository


def test_a_missing_repository_is_refused_unless_asked_to_create_it(tmp_path: Path) -> None:
    missing = tmp_path / "modles"
    with pytest.raises(StartError) as refused:
        check_repository(Settings(model_repository=missing))
    message = str(refused.value)
    assert f"model repository '{missing}'" in message and "does not exist" in message
    for option in ("--model-repository", "HYBRIDSERVE_MODEL_REPOSITORY",
                   "--create-model-repository", "HYBRIDSERVE_CREATE_MODEL_REPOSITORY"):
        assert option in message
    assert not missing.exists()

    nested = missing / "a" / "b"
    assert check_repository(Settings(model_repository=nested,
                                     create_model_repository=True)) == nested
    assert nested.is_dir()
    assert check_repository(Settings(model_repository=nested)) == nested  # exists: no option


def test_a_file_in_the_repositorys_place_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "models"
    blocker.write_text("")
    for create in (False, True):
        with pytest.raises(StartError, match="is not a directory; set --model-repository"):
            check_repository(Settings(model_repository=blocker,
                                      create_model_repository=create))


def test_a_taken_http_port_names_its_option_and_variable() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for field, names in (("port", "--port / HYBRIDSERVE_PORT"),
                             ("admin_port", "--admin-port / HYBRIDSERVE_ADMIN_PORT")):
            with pytest.raises(StartError) as refused:
                bind_http("127.0.0.1", port, field)
            assert f"cannot listen for HTTP on 127.0.0.1:{port}" in str(refused.value)
            assert names in str(refused.value)


def test_a_free_port_is_bound_but_refuses_connections_until_served() -> None:
    sock = bind_http("127.0.0.1", 0, "port")
    with sock:
        port = sock.getsockname()[1]
        assert port != 0
        # Not listening yet: a client is refused (the app has not started), not queued.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
