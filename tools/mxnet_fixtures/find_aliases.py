"""Find MXNet operator names that behave exactly like an operator the engine already has.

Usage (inside the fixture venv)::

    python tools/mxnet_fixtures/find_aliases.py --out engine/ops/mxnet_aliases.json

MXNet registers many operators twice: a legacy name and a NumPy-mode ``_npx_``/``_npi_`` name,
or an old capitalised spelling (``_Equal``). A ``todo`` name that MXNet itself registered as an
alias (``alias_of`` in ``mxnet_ops.json``) of a supported op is the same op. For every other
``todo`` name this script takes the ``supported`` names with the same parameter list (names,
types and defaults, as ``mx.operator.get_operator_arguments`` reports them), re-runs each
candidate's reference cases from ``tests/fixtures/mxnet/ops`` under the todo name, and keeps
the candidate when MXNet gives the same outputs on every case. When several candidates pass,
the one whose name matches once the ``_npx_``/``_npi_``/``_np_`` prefixes are stripped wins;
otherwise the name is left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import mxnet as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from casefile import Case, run_case  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CATALOG = ROOT / "engine" / "ops" / "mxnet_ops.json"
REFERENCE = ROOT / "tests" / "fixtures" / "mxnet" / "ops"


def signature(name: str) -> tuple:
    """An operator's parameter list: names, types and defaults."""
    arguments = mx.operator.get_operator_arguments(name)
    return tuple(zip(arguments.names, arguments.types))


def reference_cases() -> dict[str, list[Case]]:
    """The original conformance cases, grouped by op, as runnable `Case` objects."""
    document = json.loads((REFERENCE / "cases.json").read_text())
    arrays = np.load(REFERENCE / "cases.npz")
    grouped: dict[str, list[Case]] = defaultdict(list)
    for record in document["cases"]:
        inputs = {spec["name"]: arrays[f"{record['id']}/in{k}"]
                  for k, spec in enumerate(record["inputs"])}
        unspecified = tuple(k for k, spec in enumerate(record["outputs"])
                            if spec.get("unspecified"))
        grouped[record["op"]].append(Case(record["id"], record["op"], inputs, record["attrs"],
                                          record.get("tolerance"), unspecified))
    return grouped


def same_results(alias: str, cases: list[Case]) -> bool:
    """Whether MXNet gives every case the same outputs under ``alias`` as under its own op."""
    for case in cases:
        renamed = Case(case.id, alias, case.inputs, case.attrs, case.tolerance, case.unspecified)
        try:
            _, expected = run_case(case)
            _, actual = run_case(renamed)
        except mx.base.MXNetError:
            return False
        for key, value in expected.items():
            if key.split("/")[-1].startswith("out") and not np.array_equal(
                    value, actual[key], equal_nan=True):
                return False
    return True


def stripped(name: str) -> str:
    for prefix in ("_npx_", "_npi_", "_np_", "_"):
        if name.startswith(prefix):
            return name[len(prefix):].lower()
    return name.lower()


def choose(alias: str, passing: list[str]) -> str | None:
    if len(passing) == 1:
        return passing[0]
    named = [target for target in passing if stripped(target) == stripped(alias)]
    return named[0] if len(named) == 1 else None


def find_target(name: str, operators: dict, targets: set[str],
                cases: dict[str, list[Case]]) -> str | None:
    """The supported op (with reference cases, for non-aliases) ``name`` behaves like, or None."""
    canonical = operators[name].get("alias_of")
    if canonical in targets:
        return canonical  # the same op inside MXNet
    own = signature(name)
    passing = [target for target in cases if target in targets and signature(target) == own
               and same_results(name, cases[target])]
    return choose(name, passing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    operators = json.loads(CATALOG.read_text())["operators"]
    previous = json.loads(args.out.read_text())["aliases"] if args.out.exists() else {}
    cases = reference_cases()
    # Names registered only through the alias file are candidates again, never targets.
    candidates = [name for name, record in operators.items()
                  if record["status"] == "todo" or name in previous]
    targets = {name for name, record in operators.items()
               if record["status"] == "supported" and name not in previous}
    aliases = {name: target for name in candidates
               if (target := find_target(name, operators, targets, cases)) is not None}
    document = {"generator": "tools/mxnet_fixtures/find_aliases.py",
                "mxnet_version": mx.__version__, "aliases": dict(sorted(aliases.items()))}
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {len(aliases)} aliases to {args.out}")


if __name__ == "__main__":
    main()
