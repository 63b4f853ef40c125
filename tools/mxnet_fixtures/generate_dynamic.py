"""Write a tiny export that uses a data-dependent operator between layers, with MXNet's outputs.

Usage (inside the fixture venv, see README.md)::

    python tools/mxnet_fixtures/generate_dynamic.py --out tests/fixtures/mxnet_extra

The model lands in ``<out>/dynamic/<name>/`` in the layout of the model fixtures. It is kept
apart from ``models/``: its ``boolean_mask`` selects among the features of every row of the
batch, so rows are not independent and a server must not concatenate requests.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import mxnet as mx
import numpy as np
from generate_models import ModelSpec, export
from mxnet.gluon import nn


class MaskedScores(mx.gluon.HybridBlock):
    """Dense+relu features; those above the mean of all of them (every row's) go one by one
    through a second Dense (one input unit) and are summed. Returns the summed scores (1, 3)
    and how many features were kept (1,): one row out whatever the rows in."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.encode = nn.Dense(8, in_units=6, activation="relu")
            self.score = nn.Dense(3, in_units=1)

    def hybrid_forward(self, F, data):  # noqa: N803 (Gluon's signature)
        features = F.reshape(self.encode(data), (-1,))
        keep = F.broadcast_greater(features, F.mean(features))
        kept = F.expand_dims(F.contrib.boolean_mask(features, keep), axis=1)
        scores = F.sum(self.score(kept), axis=0, keepdims=True)
        return scores, F.reshape(F.sum(keep), (1,))


def masked_batches(rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    # Features above the mean: some are kept for any input with distinct features (MXNet
    # 1.9.1's oneDNN FullyConnected fails on zero rows; the engine's tests cover an empty
    # selection against NumPy). One-row batches are what a server sends this model.
    return [{"data": rng.uniform(-1, 1, (size, 6)).astype(np.float32)} for size in (1, 1, 4)]


MODELS = (
    ModelSpec("boolean_mask_tiny", "Dense+relu, boolean_mask of the features above their "
              "mean, Dense, sum over the kept ones", 61, MaskedScores, masked_batches),
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
