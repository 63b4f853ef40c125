"""The ``hybridserve`` console script: its help lists every command it runs."""

from __future__ import annotations

import importlib
import tomllib

import pytest

from tests.e2e.server import ROOT


def test_the_console_scripts_help_lists_every_command(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["hybridserve"].partition(":")
    main = getattr(importlib.import_module(module), function)
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    help_text = capsys.readouterr().out
    assert "--model-repository" in help_text  # the server's options
    assert "hybridserve export-onnx" in help_text and "ONNX" in help_text
