"""The short form of ``bench/soak.py``: 20 s of load with models churning, then the verdict."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.e2e
SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


def _soak_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_soak", SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_short_soak_has_no_unexpected_error_and_bounded_memory() -> None:
    soak = _soak_module()
    result = soak.run_soak(seconds=20, workers=3, rss_bound_mib=64)
    assert result.unexpected == [], result.unexpected[:10]
    assert result.requests > 100, result.statuses
    assert result.management_ops >= 5, result.statuses
    assert result.churn_requests > 0, result.statuses
    assert result.rss_growth_mib <= result.rss_bound_mib, (
        f"RSS grew {result.rss_growth_mib:.1f} MiB (baseline {result.rss_baseline_mib:.1f}, "
        f"final {result.rss_final_mib:.1f}, max {result.rss_max_mib:.1f})")
