"""Write MXNet 1.9.1 reference cases for operators beyond the original conformance set.

Usage (inside the fixture venv, see README.md)::

    python tools/mxnet_fixtures/generate_ops.py --out tests/fixtures/mxnet_extra

Every case has its own seed (derived from its id), so re-running gives the same files.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from casefile import Case, write_cases  # noqa: E402
from cases_aliases import alias_cases  # noqa: E402
from cases_attention import attention_cases  # noqa: E402
from cases_detection import detection_cases  # noqa: E402
from cases_misc import misc_cases  # noqa: E402
from cases_more import more_cases  # noqa: E402
from cases_numpy import numpy_cases  # noqa: E402
from cases_proposal import proposal_cases  # noqa: E402
from cases_shape import shape_cases  # noqa: E402

CaseFamily = Callable[[Callable[[str], np.random.Generator]], list[Case]]
FAMILIES: tuple[CaseFamily, ...] = (shape_cases, detection_cases, proposal_cases,
                                     attention_cases, more_cases, numpy_cases, misc_cases,
                                     alias_cases)


def rng_for(case_id: str) -> np.random.Generator:
    """A generator seeded from the case id, so each case is reproducible on its own."""
    return np.random.default_rng(zlib.crc32(case_id.encode()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="fixture root; cases go to <out>/ops")
    parser.add_argument("--only", metavar="TOPIC",
                        help="write only the family in cases_TOPIC.py (function TOPIC_cases) "
                             "to <out>/ops_TOPIC, a set of its own")
    args = parser.parse_args()
    if args.only:
        family = getattr(importlib.import_module(f"cases_{args.only}"), f"{args.only}_cases")
        cases, folder = family(rng_for), args.out / f"ops_{args.only}"
    else:
        cases = [case for family in FAMILIES for case in family(rng_for)]
        folder = args.out / "ops"
    write_cases(cases, folder)
    print(f"wrote {len(cases)} cases to {folder}")


if __name__ == "__main__":
    main()
