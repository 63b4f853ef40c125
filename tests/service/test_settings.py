"""Settings: command line over HYBRIDSERVE_* variables, validated with messages naming options."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.settings import load_settings


def test_environment_then_command_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HYBRIDSERVE_MODEL_REPOSITORY", str(tmp_path))
    monkeypatch.setenv("HYBRIDSERVE_PORT", "9001")
    monkeypatch.setenv("HYBRIDSERVE_ADMIN_TOKEN", "from-env")
    monkeypatch.setenv("HYBRIDSERVE_POLL_INTERVAL", "2.5")
    settings = load_settings(["--port", "9002", "--access-log"])
    assert settings.model_repository == tmp_path and settings.port == 9002
    assert settings.token == "from-env" and settings.poll_interval == 2.5 and settings.access_log
    assert "from-env" not in repr(settings)
    assert load_settings(["--admin-token", "cli"]).token == "cli"


def test_defaults_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ADMIN_TOKEN", "HOST", "PORT", "ADMIN_PORT"):
        monkeypatch.delenv(f"HYBRIDSERVE_{name}", raising=False)
    settings = load_settings([])
    assert settings.token is None and settings.host == "127.0.0.1" and settings.admin_port is None
    assert load_settings(["--admin-token", ""]).token is None


def test_invalid_options_name_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load_settings(["--port", "99999"])
    assert "port" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        load_settings(["--device", "tpu"])
    assert "device" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        load_settings(["--port", "8000", "--admin-port", "8000"])
    assert "admin_port 8000 equals port" in capsys.readouterr().err


def test_the_cache_directory_reaches_the_engine(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    import sys

    import uvloop
    from numba.core import config

    from engine.cpu import blas_threads, cache
    from service import __main__ as entry

    # `main` up to the server's start, without changing what other tests see.
    served = []
    monkeypatch.setattr(uvloop, "run", lambda coroutine: served.append(coroutine.close()))
    monkeypatch.setattr(blas_threads, "restart_flushed", lambda: True)
    monkeypatch.setattr(sys, "setswitchinterval", lambda interval: None)
    monkeypatch.setattr(cache, "_settings", {"directory": None})
    monkeypatch.setattr(config, "CACHE_DIR", config.CACHE_DIR)
    assert entry.main(["--cache-dir", str(tmp_path), "--model-repository", str(tmp_path),
                       "--blas-threads", "0"]) == 0
    assert served and cache.cache_dir() == tmp_path


def test_one_batch_at_a_time_gets_every_core(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.cpu import usable_cores
    from service.__main__ import blas_threads_for

    monkeypatch.setattr(usable_cores, "count", lambda: 4)
    assert load_settings([]).compute_threads == 1
    assert blas_threads_for(load_settings([])) == 4  # one batch on every core
    assert blas_threads_for(load_settings(["--compute-threads", "2"])) == 2  # a share each
    assert blas_threads_for(load_settings(["--compute-threads", "8"])) == 1
    assert blas_threads_for(load_settings(["--blas-threads", "3"])) == 3  # said outright
    assert blas_threads_for(load_settings(["--blas-threads", "0"])) == 0  # the library's own


def test_the_server_restarts_blas_threads_flushing_denormals(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    import uvloop

    from engine.cpu import blas_threads
    from service import __main__ as entry

    calls = []
    monkeypatch.setattr(uvloop, "run", lambda coroutine: coroutine.close())
    monkeypatch.setattr(blas_threads, "restart_flushed", lambda: calls.append("restart"))
    monkeypatch.setattr(sys, "setswitchinterval", lambda interval: None)
    assert entry.main(["--model-repository", str(tmp_path), "--blas-threads", "0"]) == 0
    assert calls == ["restart"]


def test_model_control_mode_keeps_todays_behaviour_by_default(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("POLL_INTERVAL", "MODEL_CONTROL_MODE", "LOAD_MODEL"):
        monkeypatch.delenv(f"HYBRIDSERVE_{name}", raising=False)
    settings = load_settings([])
    assert settings.control_mode == "none" and settings.repository_poll_s is None
    assert settings.models_at_start is None and settings.strict_readiness
    assert not settings.load_on_demand
    polling = load_settings(["--poll-interval", "2"])
    assert polling.control_mode == "poll" and polling.repository_poll_s == 2
    assert load_settings(["--model-control-mode", "poll"]).repository_poll_s == 15
    explicit = load_settings(["--model-control-mode", "explicit", "--load-model", "a",
                              "--load-model", "b", "--load-on-demand"])
    assert explicit.models_at_start == {"a", "b"} and explicit.load_on_demand
    assert explicit.repository_poll_s is None
    assert load_settings(["--model-control-mode", "explicit"]).models_at_start == set()
    assert load_settings(["--model-control-mode", "explicit", "--load-model", "a",
                          "--load-model", "*"]).models_at_start is None
    assert not load_settings(["--no-strict-readiness"]).strict_readiness
    with pytest.raises(SystemExit):
        load_settings(["--load-model", "a"])
    assert "under model_control_mode explicit only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        load_settings(["--model-control-mode", "explicit", "--poll-interval", "3"])
    assert "model_control_mode explicit never polls" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        load_settings(["--model-control-mode", "sometimes"])
    assert "model_control_mode" in capsys.readouterr().err
