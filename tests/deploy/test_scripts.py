"""The helper scripts the images run: deploy/healthcheck.py and deploy/seed_models.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.deploy.helpers import READY_PATH, load_script

healthcheck = load_script("healthcheck")
seed_models = load_script("seed_models")


class _Handler(BaseHTTPRequestHandler):
    """Answers READY_PATH with the status stored on the server, anything else with 404."""

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        status = self.server.ready_status if self.path == READY_PATH else 404  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Keep test output quiet."""


@pytest.fixture()
def server() -> Iterator[ThreadingHTTPServer]:
    """A real HTTP server on a free loopback port, serving the readiness path."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.ready_status = 200  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def test_healthcheck_url_follows_port() -> None:
    assert healthcheck.ready_url({}) == f"http://127.0.0.1:8000{READY_PATH}"
    assert healthcheck.ready_url({"HYBRIDSERVE_PORT": "9001"}).startswith("http://127.0.0.1:9001/")


def test_healthcheck_passes_on_ready(server: ThreadingHTTPServer,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYBRIDSERVE_PORT", str(server.server_address[1]))
    assert healthcheck.main([]) == 0


def test_healthcheck_fails_when_not_ready(server: ThreadingHTTPServer,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    server.ready_status = 503  # type: ignore[attr-defined]
    monkeypatch.setenv("HYBRIDSERVE_PORT", str(server.server_address[1]))
    assert healthcheck.main([]) == 1
    assert "HTTP 503" in capsys.readouterr().err


def test_healthcheck_fails_when_nothing_listens(capsys: pytest.CaptureFixture[str]) -> None:
    with ThreadingHTTPServer(("127.0.0.1", 0), _Handler) as probe:
        port = probe.server_address[1]  # closed when the block ends: nothing listens there
    assert healthcheck.main([f"http://127.0.0.1:{port}{READY_PATH}"]) == 1
    assert "unreachable" in capsys.readouterr().err


def make_repository(root: Path, models: dict[str, bytes]) -> Path:
    """A repository with one version per model: <root>/<name>/1/model-symbol.json."""
    for name, content in models.items():
        version = root / name / "1"
        version.mkdir(parents=True)
        (version / "model-symbol.json").write_bytes(content)
        (root / name / "config.json").write_text("{}")
    return root


def test_seed_copies_missing_models_and_keeps_existing(tmp_path: Path) -> None:
    source = make_repository(tmp_path / "defaults", {"mlp": b"new-mlp", "cnn": b"new-cnn"})
    target = make_repository(tmp_path / "volume", {"mlp": b"user-mlp"})
    (source / ".hidden").mkdir()
    assert seed_models.seed(source, target) == ["cnn"]
    assert (target / "cnn" / "1" / "model-symbol.json").read_bytes() == b"new-cnn"
    assert (target / "mlp" / "1" / "model-symbol.json").read_bytes() == b"user-mlp"
    assert sorted(p.name for p in target.iterdir()) == ["cnn", "mlp"], "staging left behind"
    assert seed_models.seed(source, target) == [], "a second run must copy nothing"


def test_seed_loses_a_race_gracefully(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = make_repository(tmp_path / "defaults", {"mlp": b"ours"})
    target = tmp_path / "volume"
    target.mkdir()
    real_copytree = seed_models.shutil.copytree

    def copy_then_lose(src: Path, dst: Path, *args: object, **kwargs: object) -> object:
        if not (target / "mlp").exists():
            make_repository(target, {"mlp": b"theirs"})  # another pod finishes first
        return real_copytree(src, dst, *args, **kwargs)

    monkeypatch.setattr(seed_models.shutil, "copytree", copy_then_lose)
    assert seed_models.seed(source, target) == []
    assert (target / "mlp" / "1" / "model-symbol.json").read_bytes() == b"theirs"
    assert sorted(p.name for p in target.iterdir()) == ["mlp"]


def test_seed_main_reports_missing_target(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    source = make_repository(tmp_path / "defaults", {"mlp": b"x"})
    assert seed_models.main([str(source), str(tmp_path / "absent")]) == 1
    assert "is not a directory" in capsys.readouterr().err


def test_seed_main_uses_repository_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    source = make_repository(tmp_path / "defaults", {"mlp": b"x"})
    target = tmp_path / "volume"
    target.mkdir()
    monkeypatch.setenv("HYBRIDSERVE_MODEL_REPOSITORY", str(target))
    assert seed_models.main([str(source)]) == 0
    assert (target / "mlp" / "config.json").is_file()
    assert "copied ['mlp']" in capsys.readouterr().out
