"""Test-wide hooks: ``gpu``-marked tests skip with the reason where CuPy or a GPU is missing.

On a GPU machine set ``HYBRIDSERVE_REQUIRE_GPU=1``: a missing CuPy or GPU then fails every
``gpu`` test (with the same reason) instead of skipping it, so a green run means they ran.

Also the ``gpu_backend`` fixture: the GPU frontend tests run once on a numpy stand-in for CuPy
(any machine) and once, marked ``gpu``, on the real device; and ``int8_kernels_counted``, for
tests of int8's semantics on a host without our int8 kernels.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from engine.device import gpu_unavailable_reason

REQUIRE_GPU = "HYBRIDSERVE_REQUIRE_GPU"


def gpu_required() -> bool:
    """Whether this run must not skip ``gpu`` tests (``HYBRIDSERVE_REQUIRE_GPU=1``)."""
    return os.environ.get(REQUIRE_GPU, "").strip() not in ("", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    if gpu_required():
        return  # `pytest_runtest_setup` fails them instead
    skip = pytest.mark.skip(reason=f"needs an NVIDIA GPU with CuPy: {reason}")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def pytest_runtest_setup(item: pytest.Item) -> None:
    reason = gpu_unavailable_reason()
    if reason is not None and gpu_required() and item.get_closest_marker("gpu") is not None:
        pytest.fail(f"{REQUIRE_GPU} is set but the GPU cannot be used: {reason}", pytrace=False)


@dataclass(frozen=True)
class GpuBackend:
    """What a GPU test runs on: the array module and the type of its device arrays."""

    name: str
    xp: Any
    array_type: type
    simulated: bool


@pytest.fixture(params=["simulated", pytest.param("real", marks=pytest.mark.gpu)])
def gpu_backend(request: pytest.FixtureRequest,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[GpuBackend]:
    """``engine.gpu(0)`` backed by the numpy stand-in for CuPy, or by the real CuPy."""
    import engine.nd.placement as placement

    monkeypatch.setattr(placement, "_USED", {})
    if request.param == "real":
        import cupy

        yield GpuBackend("real", cupy, cupy.ndarray, simulated=False)
        cupy.cuda.Device(0).synchronize()
        return
    from tests.engine.gpu import fake_cupy

    cupy = fake_cupy.install(monkeypatch)
    yield GpuBackend("simulated", cupy, fake_cupy.FakeArray, simulated=True)


@pytest.fixture
def no_cupy(monkeypatch: pytest.MonkeyPatch) -> str:
    """A machine without CuPy, whatever this one has; returns the reason the engine gives."""
    import engine.device as device_module
    import engine.nd.placement as placement

    reason = ("CuPy is not installed (No module named 'cupy'); install it with "
              "`pip install .[gpu]`")
    monkeypatch.setattr(device_module, "_import_cupy", lambda: (None, reason))
    monkeypatch.setattr(placement, "_USED", {})
    return reason


@pytest.fixture(scope="module")
def int8_kernels_counted() -> Iterator[None]:
    """The host counts as having our int8 kernels: ``precision="int8"`` quantizes a float32
    model rather than falling back to fp32 (`engine.runtime.precision`). The int8 layers still
    take the kernels only where they run, else the NumPy path, which computes the same bytes,
    so a test of int8's semantics holds on any host. Module-wide, so that a module's own
    fixtures loading int8 models see it too; tests of the fallback leave it out."""
    from engine.runtime import precision

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(precision, "int8_kernels_here", lambda: True)
        yield
