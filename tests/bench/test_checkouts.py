"""`bench/checkouts.py`: two checkouts' engines timed in turns of fresh processes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import checkouts


def test_each_turn_is_compared_with_its_own_pair() -> None:
    """Turn by turn: a slow spell in one turn slows both sides of that turn alone."""
    results = {"this": [[9.0, 10.0, 11.0], [18.0, 20.0, 22.0]],
               "other": [[10.0, 11.0, 12.0], [19.0, 21.0, 23.0]]}
    ratios = checkouts.turn_ratios(results)
    assert ratios["medians"] == pytest.approx([10 / 11, 20 / 21])
    assert ratios["bests"] == pytest.approx([9 / 10, 18 / 19])


def test_the_other_must_be_a_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "argv", ["checkouts.py", "--other", str(tmp_path)])
    with pytest.raises(SystemExit, match="not a checkout"):
        checkouts.main()
