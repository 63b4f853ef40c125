"""End to end: the README's "Images in, labels out" curl, as printed, on the default repository."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.server import ROOT, running_server

pytestmark = pytest.mark.e2e
SECTION = "## Images in, labels out"


def readme_blocks(heading: str) -> list[str]:
    """The fenced code blocks of the README section under `heading`, in order."""
    text = (ROOT / "README.md").read_text()
    start = text.index("\n" + heading + "\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else len(text)]
    return [block.split("\n", 1)[1] for block in section.split("```")[1::2]]


def classification(strings: list[str]) -> list[tuple[float, int, str]]:
    """Triton's ``value:index:label`` strings, parsed."""
    parsed = []
    for string in strings:
        value, index, label = string.split(":")
        parsed.append((float(value), int(index), label))
    return parsed


def test_the_readme_curl_labels_the_sample_digit(tmp_path: Path) -> None:
    command, printed = readme_blocks(SECTION)[:2]
    repository = tmp_path / "models"  # the default repository, as `make serve` serves it
    shutil.copytree(ROOT / "models", repository,
                    ignore=shutil.ignore_patterns(".*", "build.py", "__pycache__"))
    with running_server(repository) as server:
        command = command.replace("http://127.0.0.1:8000", server.url)
        assert server.url in command  # the README's URL is the one `make serve` prints
        # From the checkout's root, as the README says: the command names docs/examples/.
        result = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True,
                                text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    (output,) = answer["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("scores", "BYTES", [1, 3])
    served = classification(output["data"])
    assert served[0][1:] == (3, "three")
    expected = classification(json.loads(printed)["outputs"][0]["data"])
    assert [row[1:] for row in served] == [row[1:] for row in expected]
    # The numbers as printed, six decimals: equal up to the last digit's rounding (a float32
    # near 13.7 is spaced about 1e-6 apart, so a value a unit off in the sixth decimal is a
    # different result, not noise).
    for (value, *_), (expected_value, *_) in zip(served, expected, strict=True):
        assert value == pytest.approx(expected_value, abs=1.5e-6), (output["data"], printed)
