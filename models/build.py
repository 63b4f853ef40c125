"""Build the default model repository in this directory (run: `python models/build.py`).

Two models, each defined with `engine.gluon`, hybridized and exported with `export`, then added
through `ModelRepository.add_version` (validated, moved into place, manifest written last):

- ``seed_mlp``: the hybridization texts' MLP (Dense 256-relu, Dense 128-relu, Dense 2) on a
  (1, 512) input, with seeded random weights: a model to try requests and benchmarks on.
- ``digits``: a real classifier of scikit-learn's bundled 8×8 handwritten digits. An MLP is
  trained with scikit-learn (a dev dependency), and its weights are loaded into a
  `HybridSequential` of the same shape. Inputs are the 64 pixel values, 0..16, unscaled: the
  first layer divides by 16 inside the graph so clients send raw pixels.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from engine import nd
from engine.gluon import nn
from engine.serving.repository import ModelRepository

HERE = Path(__file__).resolve().parent
SEED = 11


def build_seed_mlp(workdir: Path) -> Path:
    """Export the seed MLP; return the path prefix of its files."""
    nd.random.seed(SEED)
    net = nn.HybridSequential(prefix="seed_mlp_")
    with net.name_scope():
        net.add(nn.Dense(256, activation="relu"), nn.Dense(128, activation="relu"), nn.Dense(2))
    net.initialize()
    net.hybridize()
    net(nd.random.normal(shape=(1, 512)))
    prefix = workdir / "seed_mlp"
    net.export(str(prefix))
    return prefix


class ScaledInput(nn.HybridBlock):
    """Divides raw 0..16 pixel values by 16, as the training data was scaled."""

    def hybrid_forward(self, F, x):  # noqa: N803 - Gluon's F convention
        return x / 16.0


def train_digits() -> tuple[object, float]:
    """A scikit-learn MLP on the digits data set and its held-out accuracy."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    digits = load_digits()
    features = digits.data / 16.0
    train_x, test_x, train_y, test_y = train_test_split(
        features, digits.target, test_size=0.25, random_state=SEED, stratify=digits.target)
    classifier = MLPClassifier(hidden_layer_sizes=(64,), max_iter=600, random_state=SEED)
    classifier.fit(train_x, train_y)
    return classifier, float(classifier.score(test_x, test_y))


def build_digits(workdir: Path) -> tuple[Path, float]:
    """Export the digits classifier with scikit-learn's trained weights."""
    classifier, accuracy = train_digits()
    net = nn.HybridSequential(prefix="digits_")
    with net.name_scope():
        net.add(ScaledInput(), nn.Dense(64, activation="relu", in_units=64),
                nn.Dense(10, in_units=64))
    net.initialize()
    hidden, output = net[1], net[2]
    hidden.weight.set_data(nd.array(classifier.coefs_[0].T))
    hidden.bias.set_data(nd.array(classifier.intercepts_[0]))
    output.weight.set_data(nd.array(classifier.coefs_[1].T))
    output.bias.set_data(nd.array(classifier.intercepts_[1]))
    net.hybridize()
    net(nd.zeros((1, 64)))
    prefix = workdir / "digits"
    net.export(str(prefix))
    return prefix, accuracy


def config(input_width: int, output_name: str, classes: int) -> dict[str, object]:
    """The repository config naming the model's one input and output."""
    return {
        "max_batch_size": 64,
        "inputs": [{"name": "data", "datatype": "FP32", "shape": [-1, input_width]}],
        "outputs": [{"name": output_name, "datatype": "FP32", "shape": [-1, classes]}],
        "dynamic_batching": {"max_queue_delay_us": 500, "preferred_batch_sizes": [16, 64]},
    }


def output_name(prefix: Path) -> str:
    """``<head node>_output``, the name `Model.output_names` gives the model's only output."""
    graph = json.loads(prefix.with_name(prefix.name + "-symbol.json").read_text())
    return graph["nodes"][graph["heads"][0][0]]["name"] + "_output"


async def add(repository: ModelRepository, name: str, prefix: Path, cfg: dict) -> None:
    """Replace the model's version 1 with the freshly exported files."""
    symbol = prefix.with_name(prefix.name + "-symbol.json").read_bytes()
    params = prefix.with_name(prefix.name + "-0000.params").read_bytes()
    await repository.add_version(name, symbol, params, config=cfg, version=1, replace=True)


async def main() -> int:
    """Build both models into ``models/``."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        seed_prefix = build_seed_mlp(workdir)
        digits_prefix, accuracy = build_digits(workdir)
        for name in ("seed_mlp", "digits"):
            shutil.rmtree(HERE / name, ignore_errors=True)
        repository = ModelRepository(HERE)
        await repository.start()
        try:
            await add(repository, "seed_mlp", seed_prefix, config(512, output_name(seed_prefix), 2))
            await add(repository, "digits", digits_prefix,
                      config(64, output_name(digits_prefix), 10))
        finally:
            await repository.close()
    print(f"built seed_mlp and digits (held-out digit accuracy {accuracy:.3f}) in {HERE}")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(asyncio.run(main()))
