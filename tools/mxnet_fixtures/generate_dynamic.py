"""Write a tiny export that uses a data-dependent operator between layers, with MXNet's outputs.

Usage (inside the fixture venv, see README.md)::

    python tools/mxnet_fixtures/generate_dynamic.py --out tests/fixtures/mxnet_extra

The model lands in ``<out>/dynamic/<name>/`` in the layout of the model fixtures. It is kept
apart from ``models/``: ``boolean_mask`` keeps the rows of the whole batch that pass a test, so
rows are not independent and a server must not concatenate requests.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import mxnet as mx
import numpy as np
from generate_models import ModelSpec, export
from mxnet.gluon import nn


class MaskedScores(mx.gluon.HybridBlock):
    """Dense+relu features; the rows whose features sum above the batch's mean sum go through a
    second Dense and are summed. Returns the summed scores (1, 3) and the kept count (1,)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.encode = nn.Dense(8, in_units=6, activation="relu")
            self.score = nn.Dense(3, in_units=8)

    def hybrid_forward(self, F, data):  # noqa: N803 (Gluon's signature)
        hidden = self.encode(data)
        sums = F.sum(hidden, axis=1)
        keep = F.broadcast_greater(sums, F.mean(sums))
        kept = F.contrib.boolean_mask(hidden, keep)
        scores = F.sum(self.score(kept), axis=0, keepdims=True)
        return scores, F.reshape(F.sum(keep), (1,))


def masked_batches(rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    # Batches of different sizes keep different numbers of rows (the plans' rest stages are
    # compiled per kept count).
    # Rows above the mean: never none of distinct rows (MXNet 1.9.1's oneDNN FullyConnected
    # fails on zero rows; the engine's tests cover an empty selection against NumPy).
    return [{"data": rng.uniform(-1, 1, (size, 6)).astype(np.float32)} for size in (5, 8, 3)]


MODELS = (
    ModelSpec("boolean_mask_tiny", "Dense+relu, boolean_mask of rows by their feature sum, "
              "Dense, sum over the kept rows", 61, MaskedScores, masked_batches),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="fixture root; models go to <out>/dynamic/<name>")
    args = parser.parse_args()
    for spec in MODELS:
        export(spec, args.out, group="dynamic")
        print(f"exported {spec.name}")


if __name__ == "__main__":
    main()
