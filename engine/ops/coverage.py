"""How much of MXNet 1.9.1's forward operator set the registry covers (see `engine.ops.catalog`).

Usage::

    python -m engine.ops.coverage            # covered/total, then what is missing
    python -m engine.ops.coverage --write    # mark registered names supported, others todo
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.ops.catalog import DATA_FILE, FORWARD, STATUSES, OperatorRecords, load_operators
from engine.ops.registry import has_op


@dataclass(frozen=True)
class Coverage:
    """Forward-operator counts and the names still missing."""

    covered: int
    total: int
    missing: tuple[str, ...]
    unsupported: dict[str, str]

    @property
    def percent(self) -> float:
        """Covered forward names as a percentage of all forward names."""
        return 100.0 * self.covered / self.total if self.total else 100.0


def coverage(operators: OperatorRecords) -> Coverage:
    """Count forward names (supported, todo, unsupported) and list the todo ones."""
    forward = {name: record for name, record in operators.items()
               if record["status"] in FORWARD}
    return Coverage(
        covered=sum(record["status"] == "supported" for record in forward.values()),
        total=len(forward),
        missing=tuple(sorted(name for name, record in forward.items()
                             if record["status"] == "todo")),
        unsupported={name: record["reason"] for name, record in forward.items()
                     if record["status"] == "unsupported"},
    )


def synced(operators: OperatorRecords) -> OperatorRecords:
    """The records with every registered name ``supported`` and unregistered ``supported`` todo.

    A record's ``alias_of`` (a fact about MXNet) survives the change of status.
    """
    result = {}
    for name, record in operators.items():
        if has_op(name):
            record = _with_status(record, "supported")
        elif record["status"] == "supported":
            record = _with_status(record, "todo")
        result[name] = record
    return result


def _with_status(record: dict[str, str], status: str) -> dict[str, str]:
    kept = {"alias_of": record["alias_of"]} if "alias_of" in record else {}
    return {"status": status, **kept}


def report(operators: OperatorRecords) -> str:
    """The text ``python -m engine.ops.coverage`` prints."""
    result = coverage(operators)
    counts = Counter(record["status"] for record in operators.values())
    lines = [
        f"MXNet forward operators covered: {result.covered}/{result.total} "
        f"({result.percent:.1f}%)",
        "names by status: " + ", ".join(f"{status} {counts[status]}" for status in STATUSES),
        f"missing ({len(result.missing)}):",
        *(f"  {name}" for name in result.missing),
        f"unsupported on purpose ({len(result.unsupported)}):",
        *(f"  {name}: {reason}" for name, reason in sorted(result.unsupported.items())),
    ]
    return "\n".join(lines)


def _write(path: Path) -> None:
    document: dict[str, Any] = json.loads(path.read_text())
    document["operators"] = synced(document["operators"])
    path.write_text(json.dumps(document, indent=1) + "\n")
    load_operators.cache_clear()


def main(argv: list[str] | None = None) -> None:
    """Print coverage; with ``--write``, first bring the data file in line with the registry."""
    parser = argparse.ArgumentParser(prog="python -m engine.ops.coverage",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true",
                        help="mark registered names supported in the data file first")
    args = parser.parse_args(argv)
    if args.write:
        _write(DATA_FILE)
    print(report(load_operators()))


if __name__ == "__main__":
    main()
