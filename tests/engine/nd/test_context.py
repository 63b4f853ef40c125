"""Context values: cpu()/gpu(), equality, MXNet's repr, ``with`` scoping."""

from __future__ import annotations

import pytest

from engine.context import Context, cpu, current_context, gpu


def test_values_and_repr() -> None:
    assert repr(cpu()) == "cpu(0)" and str(gpu(1)) == "gpu(1)"
    assert cpu() == Context("cpu", 0) and cpu() != gpu(0) and gpu(1) != gpu(0)
    assert Context(gpu(2)) == gpu(2)
    assert len({cpu(), cpu(0), gpu()}) == 2
    assert (gpu(3).device_type, gpu(3).device_id) == ("gpu", 3)


def test_current_context_scoping() -> None:
    assert current_context() == cpu(0)
    with gpu(1):
        assert current_context() == gpu(1)
        with cpu(0):
            assert current_context() == cpu(0)
        assert current_context() == gpu(1)
    assert current_context() == cpu(0)


def test_bad_values() -> None:
    with pytest.raises(ValueError, match="device type"):
        Context("tpu")
    with pytest.raises(ValueError, match="non-negative"):
        gpu(-1)
