"""Replay: how `spin_pool.Choice` and candidate rules pick ways over given sequences of runs.

Usage: ``python bench/choice_replay.py [--traces DIR] [--seeds 5] [--candidates NAME,...]``.

A scenario is a list of runs, each a pause before it and the seconds it takes armed and on
one thread. A rule is asked the way of each run on a stub clock, which then moves by the pause
and by that way's seconds, and is told the run's time. The report gives, per scenario and
rule, the share of runs that took the slower of the two ways (explorations included) and the
time lost against taking the faster way every run, as a share of that time; for a lasting
change, the run after it from which the new faster way is the one taken.

Synthetic scenarios (each run's time gets one-sided jitter, mean 3%: noise here only ever
slows a run): a steady stream with armed at 0.6x one thread; the same with bursts of 3-6 runs
at 1.5-3x, on both ways or on armed runs only; a lasting change to armed at 1.05x one thread
(a shared machine whose second vCPU stops helping) and back; and turns of 5-12 runs after
pauses of 0.1-2.5 s, each turn's first run 1.5x either way (cold caches), with and without
bursts. ``--traces`` adds recorded runs: files of lines "perf_counter armed(1/0)
milliseconds", one run each as `Choice.record` saw it; the way a run did not take is given
the time it took scaled by the ratio of the two ways' medians over the file, so that a burst
slows both ways alike.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.cpu.spin_pool import Choice  # noqa: E402

ARMED_SHARE = 0.6  # armed time over one thread's, where the cores help
ALONE_SECONDS = 0.010
JITTER = 0.03  # mean of the one-sided jitter on every run, a share of its time
COLD = 1.5  # the first run of a turn, either way


class Run(NamedTuple):
    pause: float  # seconds idle before the run
    armed: float  # seconds it takes armed
    alone: float  # and on one thread


class Clock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def replay(make: Callable[[Clock], Choice | Armed], runs: list[Run]) -> list[bool]:
    """The ways a rule takes over ``runs`` (True: armed)."""
    clock = Clock()
    choice = make(clock)
    ways = []
    for run in runs:
        clock.now += run.pause
        armed = choice.armed()
        seconds = run.armed if armed else run.alone
        clock.now += seconds
        choice.record(armed, seconds)
        ways.append(armed)
    return ways


def jitter(rng: random.Random, seconds: float, mean: float = JITTER) -> float:
    return seconds * (1.0 + rng.expovariate(1.0 / mean))


def stream(rng: random.Random, count: int, armed_share: float = ARMED_SHARE,
           noise: float = JITTER) -> list[Run]:
    """Back-to-back runs, each slowed by one-sided jitter of mean ``noise``."""
    return [Run(0.0, jitter(rng, armed_share * ALONE_SECONDS, noise),
                jitter(rng, ALONE_SECONDS, noise)) for _ in range(count)]


def turns(rng: random.Random, count: int) -> list[Run]:
    """``count`` turns of 5-12 back-to-back runs, each after a pause of 0.1-2.5 s."""
    runs = []
    for _ in range(count):
        turn = stream(rng, rng.randint(5, 12))
        turn[0] = Run(rng.uniform(0.1, 2.5), COLD * turn[0].armed, COLD * turn[0].alone)
        runs += turn
    return runs


def with_bursts(rng: random.Random, runs: list[Run], starts: Iterable[int],
                armed_only: bool) -> list[Run]:
    """``runs`` with a burst of 3-6 runs at 1.5-3x from each of ``starts``."""
    runs = list(runs)
    for start in starts:
        factor = rng.uniform(1.5, 3.0)
        for index in range(start, min(start + rng.randint(3, 6), len(runs))):
            run = runs[index]
            runs[index] = run._replace(armed=run.armed * factor,
                                       alone=run.alone if armed_only else run.alone * factor)
    return runs


def synthetic(rng: random.Random) -> dict[str, tuple[list[Run], int | None]]:
    """Scenarios by name, each with the run at which a lasting change happens (or None)."""
    steady = stream(rng, 3000)
    bursts = range(200, 3000, 97)
    in_turns = turns(rng, 250)
    change = next(index for index, run in enumerate(in_turns) if index >= 1000 and run.pause)
    in_turns_slower = in_turns[:change] + [run._replace(armed=1.3 * run.alone)
                                           for run in in_turns[change:]]
    turn_bursts = range(100, len(in_turns), 61)
    slower = [run._replace(armed=1.05 * run.alone) for run in stream(rng, 1500)]
    return {
        "steady": (steady, None),
        "bursts, both ways": (with_bursts(rng, steady, bursts, armed_only=False), None),
        "bursts, armed only": (with_bursts(rng, steady, bursts, armed_only=True), None),
        "armed to 1.05x": (stream(rng, 500) + slower, 500),
        "armed back to 0.6x": (slower[:500] + stream(rng, 1000), 500),
        "turns": (in_turns, None),
        "turns, bursts both ways": (with_bursts(rng, in_turns, turn_bursts, False), None),
        "turns, bursts armed only": (with_bursts(rng, in_turns, turn_bursts, True), None),
        "turns, armed to 1.3x": (in_turns_slower, change),
        "noisy (mean +30%), armed 0.85x": (stream(rng, 3000, 0.85, 0.3), None),
        "noisy (mean +30%), armed 1.1x": (stream(rng, 3000, 1.1, 0.3), None),
    }


def recorded(path: Path) -> list[Run]:
    """The runs of a trace file, the way not taken scaled by the ways' median ratio."""
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    rows = [(float(end), line == "1", float(ms) / 1e3) for end, line, ms in rows]
    settled = rows[1:]  # the first run makes the plan's jobs
    ratio = (statistics.median(seconds for _, armed, seconds in settled if armed)
             / statistics.median(seconds for _, armed, seconds in settled if not armed))
    runs, last_end = [], None
    for end, armed, seconds in settled:
        pause = 0.0 if last_end is None else max(0.0, end - seconds - last_end)
        last_end = end
        runs.append(Run(pause, seconds, seconds / ratio) if armed
                    else Run(pause, seconds * ratio, seconds))
    return runs


class Margin(Choice):
    """Leaves the way taken only where the other way's samples are faster by `MARGIN`."""

    MARGIN = 0.1

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.taken = [True, True]

    def armed(self) -> bool:
        answer = super().armed()
        if self._basis is not None:
            self.taken[self._basis] = self._faster(self._basis)
        return answer

    def _faster(self, kind: int) -> bool:
        armed, alone = (self._typical(times) for times in self._times[kind])
        if self.taken[kind]:
            return not alone < (1.0 - self.MARGIN) * armed
        return armed < (1.0 - self.MARGIN) * alone


class InARow(Choice):
    """Leaves the way taken only after the other way's samples win `WINS` decisions running."""

    WINS = 3

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.taken = [True, True]
        self.streak = [0, 0]

    def armed(self) -> bool:
        answer = super().armed()
        kind = self._basis
        if kind is not None:
            plain = Choice._faster(self, kind)
            self.streak[kind] = self.streak[kind] + 1 if plain != self.taken[kind] else 0
            if self.streak[kind] >= self.WINS:
                self.taken[kind], self.streak[kind] = plain, 0
        return answer

    def _faster(self, kind: int) -> bool:
        return self.taken[kind]


class Sticky(Choice):
    """The way taken stands for its `RANK`-th fastest kept sample, the other way for the
    median of its newest `SAMPLES`: the other way's samples, one an exploration, span far
    more time than the way taken's, and the fastest of a longer time is the faster by luck."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.way: list[int | None] = [None, None]

    def armed(self) -> bool:
        answer = super().armed()
        if self._basis is not None:
            self.way[self._basis] = 0 if self._faster(self._basis) else 1
        return answer

    def _faster(self, kind: int) -> bool:
        def time(way: int) -> float:
            times = self._times[kind][way]
            if self.way[kind] in (None, way):
                return self._typical(times)
            newest = sorted(times[-self.SAMPLES:])
            return newest[(len(newest) - 1) // 2]

        return time(0) <= time(1)


class Armed:
    """Every run armed: a reference, no rule."""

    def __init__(self, clock: Clock) -> None:
        del clock

    def armed(self) -> bool:
        return True

    def record(self, armed: bool, seconds: float) -> None:
        pass


def rule(base: type[Choice], **constants: object) -> Callable[[Clock], Choice]:
    """``base`` with its class constants (`Choice.KEPT`, `RANK`, ...) set to ``constants``."""
    return type(base.__name__, (base,), dict(constants))


CANDIDATES: dict[str, Callable[[Clock], Choice | Armed]] = {
    "every run armed": Armed,
    "median of 3": rule(Choice, KEPT=(3, 3), RANK=1),
    "Choice as built": Choice,
    "2nd best of 5": rule(Choice, KEPT=(5, 5), RANK=1),
    "2nd best of 7": rule(Choice, KEPT=(7, 7), RANK=1),
    "2nd best of 8": rule(Choice, KEPT=(8, 8), RANK=1),
    "2nd best of 9": rule(Choice, KEPT=(9, 9), RANK=1),
    "3rd best of 9": rule(Choice, KEPT=(9, 9), RANK=2),
    "2nd best of 8 + cold median of 3": rule(Choice, KEPT=(8, 3), RANK=1),
    "taken 2nd best of 8 + other median of 3": rule(Sticky, KEPT=(8, 3), RANK=1),
    "median of 3 + margin 10%": rule(Margin, KEPT=(3, 3), MARGIN=0.1),
    "median of 3 + margin 3%": rule(Margin, KEPT=(3, 3), MARGIN=0.03),
    "median of 3 + 3 wins running": rule(InARow, KEPT=(3, 3), WINS=3),
    "2nd best of 7 + margin 3%": rule(Margin, KEPT=(7, 7), MARGIN=0.03),
}


def score(runs: list[Run], ways: list[bool]) -> tuple[float, float]:
    """Share of runs the slower way, and time lost against the faster way's."""
    slow = sum((run.armed > run.alone) == armed for run, armed in zip(runs, ways, strict=True))
    best = sum(min(run.armed, run.alone) for run in runs)
    taken = sum(run.armed if armed else run.alone for run, armed in zip(runs, ways, strict=True))
    return slow / len(runs), taken / best - 1.0


def switched_at(runs: list[Run], ways: list[bool], change: int) -> int | None:
    """Runs after ``change`` until the way taken is the faster one for good: the first run
    from which the slower way takes at most 2 of every 32 (explorations)."""
    faster = [run.armed <= run.alone for run in runs]
    for start in range(change, len(runs) - 32):
        window = range(start, start + 32)
        if ways[start] == faster[start] and sum(ways[i] != faster[i] for i in window) <= 2:
            return start - change
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, help="a folder of choice-*.txt traces")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--candidates", help="comma-separated names (default: all)")
    options = parser.parse_args()
    names = options.candidates.split(",") if options.candidates else list(CANDIDATES)
    results: dict[str, dict[str, list[tuple[float, float, int | None]]]] = {}
    changing = set()
    for seed in range(options.seeds):
        for scenario, (runs, change) in synthetic(random.Random(seed)).items():
            for name in names:
                ways = replay(CANDIDATES[name], runs)
                switch = None if change is None else switched_at(runs, ways, change)
                if change is not None:
                    changing.add(scenario)
                results.setdefault(scenario, {}).setdefault(name, []).append(
                    (*score(runs, ways), switch))
    for path in sorted(options.traces.glob("choice-*.txt")) if options.traces else ():
        runs = recorded(path)
        for name in names:
            ways = replay(CANDIDATES[name], runs)
            results.setdefault(f"trace {path.stem} ({len(runs)} runs)", {})[name] = [
                (*score(runs, ways), None)]
    print(f"per rule: runs the slower way %, time lost against the faster way % (medians over "
          f"{options.seeds} seeds for synthetic runs); switch: runs until the new way holds")
    for scenario, by_rule in results.items():
        print(f"\n{scenario}")
        for name, rows in by_rule.items():
            slow = statistics.median(row[0] for row in rows)
            lost = statistics.median(row[1] for row in rows)
            switch = ""
            if scenario in changing:
                switches = [row[2] for row in rows if row[2] is not None]
                never = len(rows) - len(switches)
                switch = (f"  switch {min(switches, default='-')}-{max(switches, default='-')}"
                          + (f", never in {never}" if never else ""))
            print(f"  {name:32} slow {100 * slow:5.1f}%  lost {100 * lost:5.1f}%{switch}")


if __name__ == "__main__":
    main()
