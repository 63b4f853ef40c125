"""End to end: management out of the box with a generated token, and the README as printed."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.admin_token import TOKEN_FILE_NAME
from tests.e2e.server import ROOT, running_server
from tests.service.helpers import files_for

pytestmark = pytest.mark.e2e
README = ROOT / "README.md"


def _block_after(marker: str) -> str:
    """The first fenced code block after the README line starting with `marker`."""
    text = README.read_text()
    start = text.index("\n" + marker)
    opening = text.index("```", start)
    body_start = text.index("\n", opening) + 1
    return text[body_start:text.index("```", body_start)]


def _clean_environment() -> dict[str, str]:
    """This process's environment without HYBRIDSERVE_* (no token from the caller's shell)."""
    return {key: value for key, value in os.environ.items() if not key.startswith("HYBRIDSERVE_")}


def _shell(command: str, cwd: Path) -> str:
    result = subprocess.run(["bash", "-c", command], cwd=cwd, env=_clean_environment(),
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _printed_command(log: Path) -> str:
    """The upload command the server printed at start."""
    match = re.search(r"^  (curl .*)$", log.read_text(), re.MULTILINE)
    assert match, log.read_text()
    return match.group(1)


def test_readme_tour_then_upload_work_as_printed(tmp_path: Path) -> None:
    checkout = tmp_path  # stands for the user's checkout: ./models, and the tour's exports
    environment = {**_clean_environment(), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", _block_after("Define, hybridize and export")],
                   cwd=checkout, env=environment, check=True, timeout=120)
    (checkout / "models").mkdir()  # the user's repository: no config for the upload to find
    with running_server(checkout / "models", token=None) as server:
        token_file = checkout / "models" / TOKEN_FILE_NAME
        assert f"admin token: generated and stored in {token_file}" in server.log.read_text()
        command = _block_after("Upload it").replace("127.0.0.1:8000",
                                                   server.url.removeprefix("http://"))
        created = json.loads(_shell(command, checkout))
        assert (created["name"], created["version"], created["state"]) == ("my_mlp", 1, "READY")
        predicted = httpx.post(server.url + "/predict", timeout=30, json={
            "model": "my_mlp", "inputs": {"data": np.zeros((1, 512)).tolist()}})
        assert predicted.status_code == 200, predicted.text
        assert np.asarray(next(iter(predicted.json()["outputs"].values()))).shape == (1, 2)


def test_generated_token_is_private_kept_across_restarts_and_overridable(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    symbol, params = files_for("hybridnet")
    (tmp_path / "NAME-symbol.json").write_bytes(symbol)
    (tmp_path / "NAME-0000.params").write_bytes(params)
    repository.mkdir()
    token_file = repository / TOKEN_FILE_NAME
    with running_server(repository, token=None) as server:
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        created = json.loads(_shell(_printed_command(server.log), tmp_path))
        assert (created["name"], created["version"]) == ("NAME", 1)
    auth = {"Authorization": f"Bearer {token}"}
    with running_server(repository, token=None) as server:
        assert f"admin token: read from {token_file}" in server.log.read_text()
        assert token_file.read_text().strip() == token
        response = httpx.post(server.url + "/models/NAME/unload", headers=auth, timeout=30)
        assert response.status_code == 200, response.text
    with running_server(repository, token="explicit") as server:
        refused = httpx.post(server.url + "/models/NAME/load", headers=auth, timeout=30)
        assert refused.status_code == 403 and "not the server's admin token" in refused.text
        loaded = httpx.post(server.url + "/models/NAME/load", timeout=30,
                            headers={"Authorization": "Bearer explicit"})
        assert loaded.status_code == 200, loaded.text
    with running_server(repository, ["--no-management"], token=None) as server:
        refused = httpx.post(server.url + "/models/NAME/load", headers=auth, timeout=30)
        assert refused.status_code == 403 and "switched off" in refused.text
        assert "switched off" in server.log.read_text()
    assert token_file.read_text().strip() == token


def test_an_exposed_token_file_stops_the_start(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    repository.mkdir()
    token_file = repository / TOKEN_FILE_NAME
    token_file.write_text("some-token\n")
    token_file.chmod(0o644)
    result = subprocess.run(
        [sys.executable, "-m", "service", "--model-repository", str(repository), "--port", "0"],
        cwd=ROOT, env=_clean_environment(), capture_output=True, text=True, timeout=60,
        check=False)
    assert result.returncode == 2, result.stderr
    assert f"chmod 600 {token_file}" in result.stderr
