"""MXNet 1.9.1's operator names and what the engine does with each (``mxnet_ops.json``).

Every name ``mx.operator.get_all_registered_operators()`` gives has a status: ``supported``
(registered here), ``todo`` (a forward operator not implemented yet), ``unsupported`` (a forward
operator refused on purpose, with the reason) or ``excluded`` (no inference export contains it:
backward ops, optimizer updates... with the reason). Names MXNet registered as aliases carry
``alias_of``, the op they resolve to. ``tools/mxnet_fixtures/list_ops.py`` writes
the names; ``python -m engine.ops.coverage --write`` keeps ``supported`` in line with the registry.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

DATA_FILE = Path(__file__).with_name("mxnet_ops.json")
FORWARD = ("supported", "todo", "unsupported")
STATUSES = (*FORWARD, "excluded")

OperatorRecords = dict[str, dict[str, str]]


@cache
def load_operators(path: Path = DATA_FILE) -> OperatorRecords:
    """Name -> record (``status`` and, for unsupported or excluded names, ``reason``)."""
    return json.loads(path.read_text())["operators"]


def unsupported_reason(name: str) -> str | None:
    """Why MXNet operator ``name`` is refused on purpose, or None when it is not."""
    record = load_operators().get(name)
    if record is None or record["status"] != "unsupported":
        return None
    return record["reason"]


def mxnet_saved_name(name: str) -> str | None:
    """The name MXNet writes for op ``name`` (its alias target), or None when ``name`` is unknown.

    MXNet resolves an alias to the op it was added to, so ``_npx_slice`` is saved as ``slice``;
    NumPy-mode names registered as ops of their own (``_npi_add``) keep their name.
    """
    record = load_operators().get(name)
    if record is None:
        return None
    return record.get("alias_of", name)
