"""Upload checks of the inputs' ``preprocess`` pipelines against the graph.

Each pipeline's rows must fit its input: 4 dimensions, 3 channels where the layout puts them,
the spatial size where the graph fixes it, the same datatype. Then a dry run: a synthetic PNG
through the pipeline and the rows through the model. A graph whose first op on the input
already scales or shifts it gets a warning, so that a user does not normalise twice.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from engine.serving.config import TensorConfig
from engine.serving.errors import InvalidModel
from engine.serving.preprocess import preprocess_image
from engine.serving.preprocess_config import ImagePreprocess
from engine.serving.text_check import check_text

# Canonical op names that scale or shift a tensor: a graph starting with one on its data input
# usually normalises the image itself (GluonCV exports, models converted from Caffe).
NORMALISING_OPS = frozenset({
    "_minus_scalar", "_rminus_scalar", "_plus_scalar", "_mul_scalar", "_div_scalar",
    "_rdiv_scalar", "broadcast_sub", "broadcast_add", "broadcast_mul", "broadcast_div",
    "elemwise_sub", "elemwise_add", "elemwise_mul", "elemwise_div",
})


def check_preprocess(model: Any, inputs: Sequence[TensorConfig],
                     sample: Mapping[str, tuple[int, ...]] | None,
                     where: str, version_dir: Path | None = None) -> dict[str, Any] | None:
    """Check every input's pipeline against the completed `inputs` (graph names as `source`)
    and dry-run it; None when no input has one.

    Returns:
        The record for the upload's answer: ``ran``, the row shapes by input, ``warnings``.

    Raises:
        InvalidModel: a pipeline does not fit its input, or the dry run fails.
    """
    pipelines = {index: tensor for index, tensor in enumerate(inputs)
                 if tensor.preprocess and tensor.preprocess.image}
    rows = check_text(model, inputs, version_dir, where)  # text: engine.serving.text_check
    if not pipelines and not rows:
        return None
    for index, tensor in pipelines.items():
        check_fits(index, tensor, where)
    rows.update({tensor.name: _dry_pipeline(index, tensor, where)
                 for index, tensor in pipelines.items()})
    record: dict[str, Any] = {"ran": True,
                              "inputs": {name: list(row.shape) for name, row in rows.items()}}
    reason = _dry_model_run(model, inputs, rows, sample, where)
    if reason is not None:
        record["reason"] = reason
    record["warnings"] = [warning for tensor in pipelines.values()
                          if (warning := normalisation_warning(model, tensor)) is not None]
    return record


def check_fits(index: int, tensor: TensorConfig, where: str) -> None:
    """Refuse a pipeline whose rows do not fit the input's datatype and shape."""
    assert tensor.preprocess is not None and tensor.shape is not None  # completed
    options = tensor.preprocess.image
    field = f"{where}: inputs.{index}.preprocess"
    if tensor.datatype != options.dtype:
        raise InvalidModel(f"{field}: the pipeline gives {options.dtype}; input "
                           f"{tensor.name!r} takes {tensor.datatype} (set \"dtype\": "
                           f"\"{tensor.datatype}\")")
    given = (-1, *options.output_shape)
    if len(tensor.shape) != 4:
        raise InvalidModel(f"{field}: input {tensor.name!r} has shape {list(tensor.shape)}; "
                           f"an image pipeline gives rows of shape {list(given[1:])} "
                           f"({options.layout}), so the input must have 4 dimensions")
    channel_axis = 1 if options.layout == "NCHW" else 3
    channels = tensor.shape[channel_axis]
    if channels > 0 and channels != options.channels:
        raise InvalidModel(f"{field}: input {tensor.name!r} has shape {list(tensor.shape)}: "
                           f"{channels} channel(s) at dimension {channel_axis}; the pipeline "
                           f"gives {options.channels} ({options.color}) there in "
                           f"{options.layout}")
    for axis, (dim, made) in enumerate(zip(tensor.shape, given)):
        if axis not in (0, channel_axis) and dim > 0 and dim != made:
            raise InvalidModel(f"{field}: input {tensor.name!r} has shape "
                               f"{list(tensor.shape)}; the pipeline gives rows of shape "
                               f"{list(given[1:])} ({options.layout}, height x width "
                               f"{options.output_size}): they differ at dimension {axis}")


def synthetic_image(width: int = 97, height: int = 61) -> bytes:
    """A small PNG with a colour gradient (odd sizes, so crops and letterboxes round)."""
    ys, xs = np.mgrid[0:height, 0:width]
    pixels = np.stack([xs * 255 // width, ys * 255 // height, (xs + ys) % 256], axis=2)
    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8), "RGB").save(buffer, "PNG")
    return buffer.getvalue()


def _dry_pipeline(index: int, tensor: TensorConfig, where: str) -> np.ndarray:
    assert tensor.preprocess is not None
    options: ImagePreprocess = tensor.preprocess.image
    # The synthetic image is small: enlarge it past any centre crop when nothing resizes.
    size = options.output_size or (1, 1)
    data = synthetic_image(max(97, size[1]), max(61, size[0]))
    try:
        row, _ = preprocess_image(data, options)
    except Exception as error:  # noqa: BLE001 - any failure of the dry run refuses the model
        raise InvalidModel(f"{where}: inputs.{index}.preprocess: the pipeline fails on a "
                           f"synthetic image: {error}") from error
    return row


def _dry_model_run(model: Any, inputs: Sequence[TensorConfig], rows: Mapping[str, np.ndarray],
                   sample: Mapping[str, tuple[int, ...]] | None, where: str) -> str | None:
    """Run one row of each pipeline (zeros at the sample shape for other inputs) through the
    model; the reason when it cannot run."""
    arrays = {}
    for tensor in inputs:
        if tensor.name in rows:
            arrays[tensor.graph_name] = rows[tensor.name][None]
        elif sample is not None and tensor.graph_name in sample:
            arrays[tensor.graph_name] = np.zeros(sample[tensor.graph_name], tensor.dtype)
        else:
            return (f"the model was not run on the pipeline's rows: no input shape is known "
                    f"for input {tensor.name!r}")
    try:
        model.infer(arrays)
    except Exception as error:  # noqa: BLE001 - like the test run: refuse the model
        shapes = ", ".join(f"{name} {list(array.shape)}" for name, array in arrays.items())
        raise InvalidModel(f"{where}: the model fails on the preprocess pipelines' rows "
                           f"({shapes}): {error}") from error
    return None


def normalisation_warning(model: Any, tensor: TensorConfig) -> str | None:
    """A warning when the pipeline normalises and the graph's first op on the input scales or
    shifts it too (None otherwise, or when the model exposes no graph)."""
    assert tensor.preprocess is not None
    graph = getattr(model, "graph", None)
    options = tensor.preprocess.image
    if graph is None or options.is_identity:
        return None
    variables = {index for index, node in enumerate(graph.nodes)
                 if node.is_variable and node.name == tensor.graph_name}
    for node in graph.nodes:
        if node.is_variable or not any(entry.node in variables for entry in node.inputs):
            continue
        if node.opdef.name in NORMALISING_OPS:
            return (f"input {tensor.name!r}: the graph's first op on it, {node.describe()}, "
                    f"may already normalise it, and preprocess applies scale {options.scale:g}, "
                    f"mean {list(options.mean)} and std {list(options.std)} too; check that "
                    "images are not normalised twice")
        return None
    return None
