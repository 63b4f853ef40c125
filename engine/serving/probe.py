"""Sample input shapes for a model's test inference when the graph leaves dimensions open.

A ResNet exported from Gluon fixes its input's channels (through the first convolution's
weight) but not its height and width; a LeNet needs exactly 28×28 because a FullyConnected
follows the flatten. Shape inference cannot solve for such dimensions, but it can check a
guess cheaply, without allocating: `find_sample_shapes` tries a short list of sizes, smallest
first, and keeps the first that the whole graph accepts with one row in, one row out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.errors import EngineError
from engine.serving.config import TensorConfig

# Small sizes first (the test run is cheapest there), then sizes common in exported models
# (image sides, sequence lengths, flattened widths).
CANDIDATE_SIZES = (*range(1, 33), 48, 56, 64, 96, 100, 112, 128, 160, 192, 224, 227, 256, 299,
                   320, 384, 448, 512, 768, 784, 1000, 1024)


def find_sample_shapes(model: Any, inputs: Sequence[TensorConfig]
                       ) -> dict[str, tuple[int, ...]] | None:
    """Shapes with one row for every input, or None when no candidate size fits.

    Every variable dimension (-1 after the batch) takes the same candidate size, so inputs
    whose open dimensions must agree (two sequences of one length) are found too. A model
    without ``output_shapes`` (no shape inference to ask) gets size 1.
    """
    if all(dim > 0 for tensor in inputs for dim in tensor.shape[1:]):
        return _shapes_at(inputs, 1)
    check = getattr(model, "output_shapes", None)
    if check is None:
        return _shapes_at(inputs, 1)
    for size in CANDIDATE_SIZES:
        shapes = _shapes_at(inputs, size)
        try:
            outputs = check(shapes)
        except EngineError:
            continue
        if all(shape is None or (len(shape) > 0 and shape[0] in (0, 1))
               for shape in outputs.values()):
            return shapes
    return None


def _shapes_at(inputs: Sequence[TensorConfig], size: int) -> dict[str, tuple[int, ...]]:
    return {tensor.name: (1, *(dim if dim > 0 else size for dim in tensor.shape[1:]))
            for tensor in inputs}


def takes_batches(model: Any, sample: Mapping[str, tuple[int, ...]]) -> bool:
    """Whether the graph takes two rows where `sample` has one, with two rows out.

    GluonCV's Faster R-CNN bakes its batch size into reshapes: it accepts one row and nothing
    else, so the batcher must never combine its requests.
    """
    check = getattr(model, "output_shapes", None)
    if check is None:
        return True
    try:
        outputs = check({name: (2, *shape[1:]) for name, shape in sample.items()})
    except EngineError:
        return False
    return all(shape is None or (len(shape) > 0 and shape[0] in (0, 2))
               for shape in outputs.values())


def sample_or_ones(inputs: Sequence[TensorConfig],
                   sample: Mapping[str, tuple[int, ...]] | None) -> dict[str, tuple[int, ...]]:
    """`sample`'s shapes for `inputs`, or where there is none one row with every open
    dimension 1 (what memory is estimated and measured at)."""
    if sample is not None:
        return {tensor.name: tuple(sample[tensor.name]) for tensor in inputs}
    return {tensor.name: (1, *(dim if dim > 0 else 1 for dim in tensor.shape[1:]))
            for tensor in inputs}
