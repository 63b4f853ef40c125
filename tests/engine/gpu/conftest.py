"""Skip tests marked ``gpu`` with the reason when CuPy or a CUDA device is missing."""

from __future__ import annotations

import pytest

from engine.device import gpu_unavailable_reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs an NVIDIA GPU with CuPy: {reason}")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
