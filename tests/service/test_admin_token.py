"""The admin token: generated once into a private file and kept, explicit token wins, off switch."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from engine.serving import disk
from service import admin_token
from service.admin_token import TOKEN_FILE_NAME, AdminAccess, TokenFileError, resolve
from service.settings import Settings, load_settings
from tests.service.helpers import AUTH, run, serving


def _settings(root: Path, **overrides: object) -> Settings:
    return Settings(**{"model_repository": root, **overrides})


def test_generated_on_first_start_private_and_reused(tmp_path: Path) -> None:
    root = tmp_path / "repository"
    first = resolve(_settings(root))
    path = root / TOKEN_FILE_NAME
    assert first.created and first.file == path.absolute() and first.token
    assert len(first.token) >= 40  # 32 random bytes, URL-safe base64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == os.geteuid()
    assert path.read_text() == first.token + "\n"
    again = resolve(_settings(root))
    assert (again.token, again.created) == (first.token, False)
    assert resolve(_settings(tmp_path / "other")).token != first.token
    assert sorted(entry.name for entry in root.iterdir()) == [TOKEN_FILE_NAME]  # no temporaries


def test_generated_token_is_private_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        access = resolve(_settings(tmp_path))
    finally:
        os.umask(previous)
    assert access.file is not None and stat.S_IMODE(access.file.stat().st_mode) == 0o600


def test_explicit_token_wins_and_no_file_is_written(tmp_path: Path) -> None:
    resolve(_settings(tmp_path / "a"))
    access = resolve(_settings(tmp_path / "a", admin_token="explicit"))
    assert (access.token, access.file) == ("explicit", None)
    assert resolve(_settings(tmp_path / "b", admin_token="explicit")).token == "explicit"
    assert not (tmp_path / "b").exists()


def test_management_off_reads_and_writes_no_token(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    access = resolve(_settings(tmp_path, management=False, admin_token="ignored"))
    assert access.token is None and "switched off" in access.refusal
    assert list(tmp_path.iterdir()) == []
    assert load_settings(["--no-management"]).management is False
    monkeypatch.setenv("HYBRIDSERVE_MANAGEMENT", "false")
    assert load_settings([]).management is False
    assert load_settings(["--management"]).management is True
    with pytest.raises(SystemExit):
        load_settings(["--no-management", "--admin-port", "9000"])

    async def scenario() -> None:
        settings = _settings(tmp_path, management=False, admin_token="test-token")
        async with serving(settings, []) as (client, _):
            for method, path in (("POST", "/models/m"), ("DELETE", "/models/m"),
                                 ("POST", "/v2/repository/models/m/load")):
                response = await client.request(method, path, headers=AUTH)
                assert response.status_code == 403, response.text
                assert "switched off" in response.json()["error"]
            assert (await client.get("/models")).status_code == 200  # reading still works

    run(scenario())


def test_token_file_setting_moves_it(tmp_path: Path) -> None:
    path = tmp_path / "state" / "token"
    access = resolve(_settings(tmp_path / "repository", admin_token_file=path))
    assert access.file == path and path.read_text().strip() == access.token
    assert not (tmp_path / "repository").exists()


def test_an_existing_file_is_trusted_only_if_private(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / TOKEN_FILE_NAME
    path.write_text("hand-written-token\n")
    path.chmod(0o600)
    assert resolve(_settings(tmp_path)).token == "hand-written-token"
    path.chmod(0o640)
    with pytest.raises(TokenFileError, match=r"mode 0640.*chmod 600"):
        resolve(_settings(tmp_path))
    path.chmod(0o600)
    if path.stat().st_uid == 0:  # root's files are trusted as provided (see below): not root's
        os.chown(path, 4321, -1)
    owner = path.stat().st_uid
    with monkeypatch.context() as patch:  # the server runs as another user than the file's
        patch.setattr(os, "geteuid", lambda: owner + 1)
        with pytest.raises(TokenFileError, match=f"owned by uid {owner}, not"):
            resolve(_settings(tmp_path))
    os.chown(path, os.geteuid(), -1)
    for content in ("", "two words", "\n\n"):
        path.write_text(content)
        with pytest.raises(TokenFileError, match="expected one line"):
            resolve(_settings(tmp_path))


def _root_file(mode: int, group: int) -> os.stat_result:
    """The status of a regular file owned by root (a Kubernetes Secret volume's file)."""
    return os.stat_result((stat.S_IFREG | mode, 1, 1, 1, 0, group, 40, 0, 0, 0))


@pytest.mark.parametrize(("mode", "group", "trusted"), [
    (0o440, 10001, True),  # a Secret with defaultMode 0440 and the pod's fsGroup
    (0o400, 10001, True),
    (0o440, 20002, False),  # readable by a group the server is not in
    (0o444, 10001, False),  # by everyone
    (0o460, 10001, False),  # changeable by the group
    (0o640, 10001, True),  # only root may change it, and root may change anything
    (0o442, 10001, False),
])
def test_a_file_root_provides_for_the_servers_group_is_trusted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int, group: int,
        trusted: bool) -> None:
    path = tmp_path / "token"
    path.write_text("secret-token")  # a Secret's file ends without a newline
    real_fstat = os.fstat
    monkeypatch.setattr(os, "geteuid", lambda: 10001)  # the images' user
    monkeypatch.setattr(os, "getegid", lambda: 10001)
    monkeypatch.setattr(os, "getgroups", lambda: [10001])
    monkeypatch.setattr(os, "fstat", lambda descriptor: _root_file(mode, group)
                        if real_fstat(descriptor).st_ino == path.stat().st_ino
                        else real_fstat(descriptor))
    settings = _settings(tmp_path / "repository", admin_token_file=path)
    if trusted:
        access = resolve(settings)
        assert access.token == "secret-token" and access.file == path and not access.created
    else:
        with pytest.raises(TokenFileError, match=rf"is root's with mode {mode:04o} and group "
                           rf"{group}: only root and this server's group \(gid 10001\)"):
            resolve(settings)


def test_a_directory_in_its_place_is_refused(tmp_path: Path) -> None:
    (tmp_path / TOKEN_FILE_NAME).mkdir()
    with pytest.raises(TokenFileError, match="not a regular file"):
        resolve(_settings(tmp_path))


def test_unwritable_location_leaves_management_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    access = resolve(_settings(tmp_path, admin_token_file=blocker / "token"))
    assert access.token is None
    assert "none could be stored" in access.refusal and "--no-management" in access.refusal


def test_replicas_starting_together_agree(tmp_path: Path) -> None:
    tokens: list[str] = []
    barrier = threading.Barrier(8)

    def start() -> None:
        barrier.wait()
        token = resolve(_settings(tmp_path)).token
        assert token is not None
        tokens.append(token)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(tokens) == 8 and len(set(tokens)) == 1
    assert sorted(entry.name for entry in tmp_path.iterdir()) == [TOKEN_FILE_NAME]


def test_the_repository_scanner_ignores_the_token_file(tmp_path: Path) -> None:
    resolve(_settings(tmp_path))
    assert disk.scan(tmp_path) == {}
    assert disk.remove_stale(tmp_path, 0.0) == []
    assert (tmp_path / TOKEN_FILE_NAME).exists()


def test_start_message_says_where_and_how(tmp_path: Path) -> None:
    settings = _settings(tmp_path, host="0.0.0.0", port=8123)
    access = resolve(settings)
    message = admin_token.start_message(access, settings)
    assert f"generated and stored in {access.file} (mode 0600" in message
    assert (f'curl -X POST http://127.0.0.1:8123/models/NAME -H "Authorization: Bearer '
            f'$(cat {access.file})"') in message
    assert "read from" in admin_token.start_message(resolve(settings), settings)
    explicit = admin_token.start_message(AdminAccess("secret"), settings)
    assert "configured" in explicit and "secret" not in explicit
    split = _settings(tmp_path, host="::", port=8123, admin_port=8124)
    assert "http://[::1]:8124/models/NAME" in admin_token.start_message(access, split)
