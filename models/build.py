"""Build the default model repository in this directory (run: `python models/build.py`).

Three models, each defined with `engine.gluon`, hybridized and exported with `export`, then
added through `ModelRepository.add_version` (validated, moved into place, manifest written last):

- ``seed_mlp``: the hybridization texts' MLP (Dense 256-relu, Dense 128-relu, Dense 2) on a
  (1, 512) input, with seeded random weights: a model to try requests and benchmarks on.
- ``digits``: a real classifier of scikit-learn's bundled 8×8 handwritten digits. An MLP is
  trained with scikit-learn (a dev dependency), and its weights are loaded into a
  `HybridSequential` of the same shape. Inputs are the 64 pixel values, 0..16, unscaled: the
  first layer divides by 16 inside the graph so clients send raw pixels.
- ``digits_image``: the same trained weights behind an image pipeline (docs/preprocessing.md):
  clients send a PNG or JPEG of a dark digit on a light background; the server makes it grey,
  8x8, and ``1 - pixel / 255`` (ink 1, paper 0, as the training data's ``value / 16``), and
  answers with labels (``labels.txt``: ``zero`` to ``nine``). The README's example sends
  ``docs/examples/digit.png``, a held-out digit drawn at 32x32, which this script writes too.
"""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from engine import nd
from engine.gluon import nn
from engine.serving.repository import ModelRepository

HERE = Path(__file__).resolve().parent
SEED = 11
LABELS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
LABELS_FILE = "labels.txt"
# The README's sample image: the first held-out digit of this class.
SAMPLE = 3
SAMPLE_PATH = HERE.parent / "docs" / "examples" / "digit.png"
# Grey, 8x8 (Pillow's bilinear shrinks by averaging), then p -> (p * -1/255 + 1) / 1 = 1 - p/255:
# dark ink on light paper becomes the training data's ink intensity (value / 16), 0 to 1.
DIGIT_PIPELINE = {"image": {"color": "L", "resize": {"exact": [8, 8]},
                            "scale": -1 / 255, "mean": -1.0}}


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


def train_digits() -> tuple[object, float, np.ndarray]:
    """A scikit-learn MLP on the digits data set, its held-out accuracy and the held-out
    images (raw 0..16 values, 8x8)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    digits = load_digits()
    features = digits.data / 16.0
    train_x, test_x, train_y, test_y, _, test_images = train_test_split(
        features, digits.target, digits.images, test_size=0.25, random_state=SEED,
        stratify=digits.target)
    classifier = MLPClassifier(hidden_layer_sizes=(64,), max_iter=600, random_state=SEED)
    classifier.fit(train_x, train_y)
    return classifier, float(classifier.score(test_x, test_y)), test_images[test_y == SAMPLE]


def load_weights(hidden: nn.Dense, output: nn.Dense, classifier: object) -> None:
    """Copy the scikit-learn MLP's two layers into Gluon's (Dense keeps weights transposed)."""
    hidden.weight.set_data(nd.array(classifier.coefs_[0].T))
    hidden.bias.set_data(nd.array(classifier.intercepts_[0]))
    output.weight.set_data(nd.array(classifier.coefs_[1].T))
    output.bias.set_data(nd.array(classifier.intercepts_[1]))


def build_digits(workdir: Path, classifier: object) -> Path:
    """Export the digits classifier with scikit-learn's trained weights."""
    net = nn.HybridSequential(prefix="digits_")
    with net.name_scope():
        net.add(ScaledInput(), nn.Dense(64, activation="relu", in_units=64),
                nn.Dense(10, in_units=64))
    net.initialize()
    load_weights(net[1], net[2], classifier)
    net.hybridize()
    net(nd.zeros((1, 64)))
    prefix = workdir / "digits"
    net.export(str(prefix))
    return prefix


def build_digits_image(workdir: Path, classifier: object) -> Path:
    """Export the same classifier on a ``(N, 1, 8, 8)`` input, the image pipeline's rows."""
    net = nn.HybridSequential(prefix="digits_image_")
    with net.name_scope():
        net.add(nn.Flatten(), nn.Dense(64, activation="relu", in_units=64),
                nn.Dense(10, in_units=64))
    net.initialize()
    load_weights(net[1], net[2], classifier)
    net.hybridize()
    net(nd.zeros((1, 1, 8, 8)))
    prefix = workdir / "digits_image"
    net.export(str(prefix))
    return prefix


def digit_png(values: np.ndarray, side: int = 32) -> bytes:
    """An 8x8 digit of 0..16 ink values drawn as a `side` x `side` grey PNG, dark on light."""
    pixels = np.round(255 * (1 - values / 16)).astype(np.uint8)
    image = Image.fromarray(pixels, "L").resize((side, side), Image.Resampling.NEAREST)
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


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


async def add(repository: ModelRepository, name: str, prefix: Path, cfg: dict,
              extra: dict[str, bytes] | None = None) -> None:
    """Replace the model's version 1 with the freshly exported files (and `extra` files,
    such as labels, beside them in the version folder)."""
    async with repository.staging() as staging:
        for suffix, target in (("-symbol.json", "model-symbol.json"),
                               ("-0000.params", "model-0000.params")):
            (staging / target).write_bytes(prefix.with_name(prefix.name + suffix).read_bytes())
        for file_name, data in (extra or {}).items():
            (staging / file_name).write_bytes(data)
        await repository.add_staged(name, staging, config=cfg, version=1, replace=True)


def image_config(output: str) -> dict[str, object]:
    """digits_image's config: an image in (`DIGIT_PIPELINE`), labelled scores out."""
    cfg = config(64, output, 10)
    cfg["inputs"] = [{"name": "image", "source": "data", "datatype": "FP32",
                      "shape": [-1, 1, 8, 8], "preprocess": DIGIT_PIPELINE}]
    cfg["outputs"] = [{"name": "scores", "source": output, "datatype": "FP32",
                       "shape": [-1, 10], "labels": LABELS_FILE}]
    return cfg


async def main() -> int:
    """Build the three models into ``models/`` and the README's sample digit."""
    classifier, accuracy, samples = train_digits()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        prefixes = {"seed_mlp": build_seed_mlp(workdir),
                    "digits": build_digits(workdir, classifier),
                    "digits_image": build_digits_image(workdir, classifier)}
        for name in prefixes:
            shutil.rmtree(HERE / name, ignore_errors=True)
        repository = ModelRepository(HERE)
        await repository.start()
        try:
            outputs = {name: output_name(prefix) for name, prefix in prefixes.items()}
            await add(repository, "seed_mlp", prefixes["seed_mlp"],
                      config(512, outputs["seed_mlp"], 2))
            await add(repository, "digits", prefixes["digits"], config(64, outputs["digits"], 10))
            await add(repository, "digits_image", prefixes["digits_image"],
                      image_config(outputs["digits_image"]),
                      {LABELS_FILE: ("\n".join(LABELS) + "\n").encode()})
        finally:
            await repository.close()
    SAMPLE_PATH.write_bytes(digit_png(samples[0]))
    print(f"built seed_mlp, digits and digits_image (held-out digit accuracy {accuracy:.3f}) "
          f"in {HERE}, and {SAMPLE_PATH.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(asyncio.run(main()))
