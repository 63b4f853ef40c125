"""`bench/choice_replay.py`: runs replayed through `spin_pool.Choice` and candidate rules."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench import choice_replay
from engine.cpu import spin_pool


def test_bursts_put_fewer_runs_on_the_slower_way_than_a_median_of_three() -> None:
    scenarios = choice_replay.synthetic(random.Random(0))
    steady, _ = scenarios["steady"]
    bursts, _ = scenarios["bursts, armed only"]
    median = choice_replay.CANDIDATES["median of 3"]
    slow_steady, _ = choice_replay.score(steady, choice_replay.replay(spin_pool.Choice, steady))
    slow_median, _ = choice_replay.score(bursts, choice_replay.replay(median, bursts))
    slow_built, lost_built = choice_replay.score(bursts,
                                                 choice_replay.replay(spin_pool.Choice, bursts))
    # In the steady stream only the explorations (one run in `EXPLORE`, and the first runs'
    # each way in turn) go the slower way.
    assert slow_steady < 1.5 / spin_pool.Choice.EXPLORE
    assert slow_built < 0.5 * slow_median and 0 < lost_built


def test_a_lasting_change_is_followed_within_the_kept_runs() -> None:
    runs, change = choice_replay.synthetic(random.Random(1))["armed to 1.05x"]
    ways = choice_replay.replay(spin_pool.Choice, runs)
    # Seven slow armed runs of eight, and the eighth run after the change goes one thread.
    assert change is not None and all(ways[change:change + spin_pool.Choice.KEPT[0] - 1])
    assert choice_replay.switched_at(runs, ways, change) == spin_pool.Choice.KEPT[0] - 1


def test_a_trace_gives_the_way_not_taken_its_run_scaled_by_the_median_ratio(
        tmp_path: Path) -> None:
    trace = tmp_path / "choice-1.txt"
    # The first run (making the jobs) is left out; armed runs at half the one-thread time.
    trace.write_text("10.000 1 900\n10.100 1 5\n10.111 0 10\n10.117 1 6\n11.000 0 12\n")
    runs = choice_replay.recorded(trace)
    assert [run.armed for run in runs] == pytest.approx([0.005, 0.005, 0.006, 0.006])
    assert [run.alone for run in runs] == pytest.approx([0.010, 0.010, 0.012, 0.012])
    # Each run's pause: from the one before's end to its own start.
    assert [run.pause for run in runs] == pytest.approx([0.0, 0.001, 0.0, 0.871])
