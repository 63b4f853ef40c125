"""checkov's Kubernetes policies over deploy/k8s: no failed check, every skip accepted in the docs.

checkov pins many packages of its own, so it runs from its own environment: ``make k8s-check``
installs it there and points ``HYBRIDSERVE_CHECKOV`` at it. Without that variable the test uses
a ``checkov`` on PATH, and skips where there is none; with it, a missing binary fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.helpers import K8S, ROOT

DOCS = ROOT / "docs" / "deploy.md"


def checkov_binary() -> str:
    """The checkov to run: $HYBRIDSERVE_CHECKOV (required to exist), else one on PATH."""
    required = os.environ.get("HYBRIDSERVE_CHECKOV", "").strip()
    if required:
        if not Path(required).is_file():
            pytest.fail(f"HYBRIDSERVE_CHECKOV={required} does not exist; run `make k8s-check`")
        return required
    found = shutil.which("checkov")
    if found is None:
        pytest.skip("checkov is not installed here; `make k8s-check` runs this test with it")
    return found


def test_checkov_passes_the_kubernetes_manifests() -> None:
    # --skip-download: no platform guidelines or policies fetched, the built-in set only.
    result = subprocess.run(
        [checkov_binary(), "--directory", str(K8S), "--framework", "kubernetes",
         "--skip-download", "--output", "json"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "LOG_LEVEL": "WARNING"})
    report = json.loads(result.stdout)
    summary = report["summary"]
    results = report.get("results", {})
    failed = [f"{check['check_id']} {check['resource']} ({check['file_path']}): "
              f"{check['check_name']}" for check in results.get("failed_checks", [])]
    assert summary["failed"] == 0 and summary["parsing_errors"] == 0, "\n".join(failed)
    assert summary["passed"] > 100, summary  # the policy set ran over every object
    accepted = DOCS.read_text()
    for check in results.get("skipped_checks", []):
        reason = check["check_result"].get("suppress_comment", "")
        assert reason.strip(), f"{check['check_id']} on {check['resource']}: no reason"
        assert re.search(rf"`{check['check_id']}`", accepted), (
            f"{check['check_id']} is skipped on {check['resource']} but docs/deploy.md does not "
            "list it among the accepted exceptions")
