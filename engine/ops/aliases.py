"""MXNet names that behave exactly like an operator registered elsewhere (``mxnet_aliases.json``).

MXNet registers many operators under a second name: NumPy-mode ``_npx_``/``_npi_`` spellings
(``_npx_batch_dot``), straight-through estimators (``_contrib_round_ste``), scatter variants that
only differ for sparse storage. ``tools/mxnet_fixtures/find_aliases.py`` finds them by running
the target's reference cases under the other name in MXNet itself and comparing the outputs;
``tests/fixtures/mxnet_extra`` holds those cases, so each alias is checked against MXNet.

Each alias resolves to its target's record (`register_alias`). A graph that names the alias keeps
that name in its nodes, and `sym` writes the name MXNet itself saves (`catalog.mxnet_saved_name`).
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.ops.registry import has_op, register_alias

ALIASES_FILE = Path(__file__).with_name("mxnet_aliases.json")
# MXNet names whose op this engine registered under a NumPy-mode name MXNet 1.9.1 does not have;
# tests/fixtures/mxnet_extra checks them under MXNet's names.
ENGINE_SPELLINGS = {"_np_sum": "_npi_sum", "_np_prod": "_npi_prod", "_np_max": "_npi_max",
                    "_np_min": "_npi_min"}


def load_aliases(path: Path = ALIASES_FILE) -> dict[str, str]:
    """Alias name -> the registered name it behaves like."""
    return {**ENGINE_SPELLINGS, **json.loads(path.read_text())["aliases"]}


def register_aliases() -> None:
    """Register every alias; `engine.ops` calls it once all op modules have registered."""
    for alias, target in load_aliases().items():
        if not has_op(target):
            raise ImportError(f"mxnet_aliases.json: {alias!r} names {target!r}, which no op "
                              "module registers; import that module in engine/ops/__init__.py")
        register_alias(alias, target)
