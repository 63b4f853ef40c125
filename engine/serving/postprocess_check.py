"""Upload checks of the outputs' ``postprocess`` against the completed graph.

Each kind must fit its output's datatype and shape; a detector's scores and boxes outputs are
found (named in config.json, or inferred from the shapes GluonCV exports: ids and scores
``[N, R, 1]`` or ``[N, R]``, boxes ``[N, R, 4]``) and written into the completed config, and
mapping boxes to the original image needs an input with an image preprocess. Then a dry run:
the test inference's outputs through each postprocess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from engine.serving.config import TensorConfig
from engine.serving.errors import InvalidModel
from engine.serving.postprocess import class_map, detection_rows, l2_normalise, softmax, top_k
from engine.serving.postprocess_config import Detection

# Without an image input, the other `coordinates`, which needs none.
_KEEP = {"boxes": "set \"coordinates\": \"input\" to keep boxes in the model's input pixels",
         "class maps": "set \"coordinates\": \"output\" to answer class maps at the model's "
                       "output resolution"}
FLOATS = frozenset({"FP16", "FP32", "FP64"})
NUMBERS = FLOATS | {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"}


def check_postprocess(inputs: Sequence[TensorConfig], outputs: Sequence[TensorConfig],
                      sample: Mapping[str, Any] | None, where: str
                      ) -> tuple[tuple[TensorConfig, ...], dict[str, Any] | None]:
    """Check every output's postprocess against the completed `inputs` and `outputs`, and run
    it on the test inference's outputs (`sample`, by graph name; None: not run).

    Returns:
        The outputs with each detector's inferred names written in, and the record for the
        upload's answer (None when no output has a postprocess).

    Raises:
        InvalidModel: a postprocess does not fit its output; the message names the field.
    """
    if not any(tensor.postprocess is not None for tensor in outputs):
        return tuple(outputs), None
    completed = list(outputs)
    kinds = {}
    for index, tensor in enumerate(outputs):
        if tensor.postprocess is None:
            continue
        field = f"{where}: outputs.{index}.postprocess"
        kinds[tensor.name] = tensor.postprocess.kind
        if tensor.postprocess.detection is not None:
            detection = resolve_detection(field, tensor, inputs, outputs)
            post = tensor.postprocess.model_copy(update={"detection": detection})
            completed[index] = tensor.model_copy(update={"postprocess": post})
        else:
            check_fits(field, tensor)
        segmentation = tensor.postprocess.segmentation
        if segmentation is not None and segmentation.coordinates == "original":
            chosen = _image_input(field, "class maps", segmentation.input, inputs)
            post = tensor.postprocess.model_copy(update={
                "segmentation": segmentation.model_copy(update={"input": chosen})})
            completed[index] = tensor.model_copy(update={"postprocess": post})
    record: dict[str, Any] = {"ran": sample is not None, "outputs": kinds}
    if sample is not None:
        _dry_run(completed, sample, where)
    else:
        record["reason"] = "the test inference did not run"
    return tuple(completed), record


def check_fits(field: str, tensor: TensorConfig) -> None:
    """Refuse a softmax, top-k, segmentation or embedding its output cannot take."""
    assert tensor.postprocess is not None and tensor.shape is not None  # completed
    post, shape = tensor.postprocess, list(tensor.shape)
    about = f"output {tensor.name!r} ({tensor.datatype} {shape})"
    if post.kind in ("softmax", "embedding") and tensor.datatype not in FLOATS:
        raise InvalidModel(f"{field}: {post.kind} needs a floating-point output; {about}")
    if post.kind in ("topk", "segmentation") and tensor.datatype not in NUMBERS:
        raise InvalidModel(f"{field}: {post.kind} needs a numeric output; {about}")
    if post.softmax is not None and not 1 <= post.softmax.axis % len(shape) < len(shape):
        raise InvalidModel(f"{field}: softmax axis {post.softmax.axis} is not a class axis of "
                           f"{about}: give an axis after the batch (1 to {len(shape) - 1}, "
                           "or negative from the end)")
    if post.segmentation is not None and len(shape) != 4:
        raise InvalidModel(f"{field}: segmentation needs class scores [N, C, H, W]; {about}")


def resolve_detection(field: str, tensor: TensorConfig, inputs: Sequence[TensorConfig],
                      outputs: Sequence[TensorConfig]) -> Detection:
    """A detector's options with its scores, boxes and input named; refused when the outputs
    are not GluonCV's ids, scores and boxes or the boxes cannot be mapped."""
    assert tensor.postprocess is not None and tensor.postprocess.detection is not None
    detection = tensor.postprocess.detection
    ids_shape = _rows_shape(tensor)
    if ids_shape is None:
        raise InvalidModel(f"{field}: detection goes on the class-ids output, shape [N, R] or "
                           f"[N, R, 1] (GluonCV's first output); output {tensor.name!r} has "
                           f"shape {list(tensor.shape or ())}")
    others = {other.name: other for other in outputs
              if other.name != tensor.name and other.postprocess is None}
    boxes = _pick(field, "boxes", detection.boxes, others,
                  lambda other: _boxes_rows(other) is not None)
    scores = _pick(field, "scores", detection.scores, others,
                   lambda other: other.name != boxes and _rows_shape(other) is not None)
    rows = {ids_shape, _rows_shape(others[scores]), _boxes_rows(others[boxes])} - {-1}
    if None in rows or len(rows) > 1:
        raise InvalidModel(f"{field}: ids {list(tensor.shape or ())}, scores "
                           f"{list(others[scores].shape or ())} and boxes "
                           f"{list(others[boxes].shape or ())} must have one row count R: "
                           "[N, R(, 1)], [N, R(, 1)] and [N, R, 4]")
    chosen = (detection.input if detection.coordinates == "input"
              else _image_input(field, "boxes", detection.input, inputs))
    return detection.model_copy(update={"scores": scores, "boxes": boxes, "input": chosen})


def _rows_shape(tensor: TensorConfig) -> int | None:
    """R of an ids or scores shape ``[N, R]`` / ``[N, R, 1]`` (-1: open), else None."""
    shape = tuple(tensor.shape or ())
    if len(shape) == 2 or len(shape) == 3 and shape[2] == 1:
        return shape[1]
    return None


def _boxes_rows(tensor: TensorConfig) -> int | None:
    """R of a boxes shape ``[N, R, 4]`` (-1: open), else None."""
    shape = tuple(tensor.shape or ())
    return shape[1] if len(shape) == 3 and shape[2] == 4 else None


def _pick(field: str, role: str, named: str | None, others: Mapping[str, TensorConfig],
          fits: Any) -> str:
    """The output playing `role`: the one named, checked, or the only one whose shape fits."""
    if named is not None:
        if named not in others or not fits(others[named]):
            shape = list(others[named].shape or ()) if named in others else None
            raise InvalidModel(f"{field}: detection {role} {named!r} (shape {shape}) is not a "
                               f"{role} output of GluonCV's form (ids [N, R(, 1)], scores "
                               "[N, R(, 1)], boxes [N, R, 4]) free of a postprocess of its own")
        return named
    candidates = [name for name, other in others.items() if fits(other)]
    if len(candidates) != 1:
        shapes = {name: list(other.shape or ()) for name, other in others.items()}
        raise InvalidModel(f"{field}: cannot tell which output is the detection's {role}: "
                           f"{len(candidates)} of the other outputs {shapes} fit; name it "
                           f"(\"{role}\": \"<output name>\")")
    return candidates[0]


def _image_input(field: str, what: str, named: str | None, inputs: Sequence[TensorConfig]
                 ) -> str:
    """The input whose preprocess geometry maps `what` (``"boxes"``, ``"class maps"``) to
    the original image."""
    images = [tensor.name for tensor in inputs
              if tensor.preprocess is not None and tensor.preprocess.image is not None]
    if named is not None:
        if named not in images:
            raise InvalidModel(f"{field}: input {named!r} is not an input with an image "
                               f"preprocess (those are {images}); {what} are mapped back "
                               "through its resize and crop")
        return named
    if len(images) != 1:
        raise InvalidModel(f"{field}: {what} are mapped to the original image through an "
                           f"input's image preprocess, and the model has {len(images)} such "
                           f"inputs {images}: add a preprocess to the image input (name it "
                           f"with \"input\" when there are several), or {_KEEP[what]}")
    return images[0]


def _dry_run(outputs: Sequence[TensorConfig], sample: Mapping[str, Any], where: str) -> None:
    """Each postprocess on the test inference's outputs; a failure refuses the model."""
    arrays = {tensor.name: np.asarray(sample[tensor.graph_name]) for tensor in outputs
              if tensor.graph_name in sample}
    for index, tensor in enumerate(outputs):
        post = tensor.postprocess
        if post is None or tensor.name not in arrays:
            continue
        array = arrays[tensor.name]
        try:
            if post.softmax is not None:
                softmax(array, post.softmax.axis)
            elif post.topk is not None:
                top_k(array, post.topk.k)
            elif post.segmentation is not None:
                class_map(array)
            elif post.embedding is not None:
                l2_normalise(array)
            elif post.detection is not None:
                detection = post.detection
                assert detection.scores is not None and detection.boxes is not None
                detection_rows(array, arrays[detection.scores], arrays[detection.boxes],
                               detection, [])
        except Exception as error:  # noqa: BLE001 - any failure of the dry run refuses it
            raise InvalidModel(f"{where}: outputs.{index}.postprocess: {post.kind} fails on "
                               f"the test inference's output {list(array.shape)}: "
                               f"{error}") from error
