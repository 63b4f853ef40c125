"""The fake GPU with cuDNN that the simulated tests share: the fake CuPy installed, and
`engine.cuda.cudnn_conv` given the fake cuDNN frontend, which neither fails to build nor to
execute unless a test says so."""

from __future__ import annotations

from typing import Any

import pytest

from engine.cuda import cudnn_conv
from tests.engine.gpu import fake_cudnn, fake_cupy


@pytest.fixture
def fake_cudnn_gpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    cupy = fake_cupy.install(monkeypatch)
    monkeypatch.setattr(cudnn_conv, "_import_cudnn", lambda: (fake_cudnn.make(), None))
    monkeypatch.setattr(fake_cudnn.Graph, "fail_build", None)
    monkeypatch.setattr(fake_cudnn.Graph, "fail_execute", None)
    return cupy
