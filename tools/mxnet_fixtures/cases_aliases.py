"""Cases for the alias names ``find_aliases.py`` found: the target's cases, run under the alias."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from casefile import Case
from find_aliases import ROOT, reference_cases

ALIASES = ROOT / "engine" / "ops" / "mxnet_aliases.json"
CASES_PER_ALIAS = 2


def alias_cases(rng_for: Callable[[str], np.random.Generator]) -> list[Case]:
    """Up to two reference cases of each alias's target, renamed to the alias."""
    if not Path(ALIASES).exists():
        return []
    aliases = json.loads(ALIASES.read_text())["aliases"]
    grouped = reference_cases()
    cases = []
    for alias, target in aliases.items():
        for case in grouped[target][:CASES_PER_ALIAS]:
            cases.append(Case(f"{alias}__{case.id}", alias, case.inputs, case.attrs,
                              case.tolerance, case.unspecified))
    return cases
