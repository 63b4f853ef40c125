"""`bench/serve.py`: served against in process in turns."""

from __future__ import annotations

import pytest

from bench import serve


def test_each_served_turn_is_held_against_the_in_process_turns_on_either_side() -> None:
    assert serve.turn_ratios([45.0, 60.0], [40.0, 50.0, 70.0]) == pytest.approx([1.0, 1.0])
    assert serve.turn_ratios([27.0], [30.0, 30.0]) == pytest.approx([0.9])
    with pytest.raises(ValueError, match="2 served turns need 3"):
        serve.turn_ratios([1.0, 2.0], [1.0, 2.0])
