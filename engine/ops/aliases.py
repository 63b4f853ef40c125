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

from engine.ops import (  # noqa: F401  (the targets must be registered first)
    activation,
    creation,
    dense,
    elementwise,
    indexing,
    join,
    products,
    reduce,
    reshape,
    rnn,
    sequence,
    slicing,
    tile,
    transpose,
)
from engine.ops.registry import register_alias

ALIASES_FILE = Path(__file__).with_name("mxnet_aliases.json")


def load_aliases(path: Path = ALIASES_FILE) -> dict[str, str]:
    """Alias name -> the registered name it behaves like."""
    return json.loads(path.read_text())["aliases"]


for _alias, _target in load_aliases().items():
    register_alias(_alias, _target)
