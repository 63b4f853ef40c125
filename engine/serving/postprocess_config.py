"""The ``postprocess`` of a ``config.json`` output: what the server makes of the raw tensor.

Pure data, validated when the config is parsed (unknown keys are errors). An output gives
exactly one kind, as an object (``{"topk": {"k": 5}}``) or, for a kind whose options all have
defaults, its name (``"softmax"``)::

    {"name": "probabilities", "labels": "imagenet.txt", "postprocess": {"topk": {"k": 5}}}
    {"name": "ids", "labels": "voc.txt",
     "postprocess": {"detection": {"score_threshold": 0.5}}}

`engine.serving.postprocess` computes each kind; `engine.serving.postprocess_check` checks
them against the graph at upload; docs/preprocessing.md describes every key.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    model_validator,
)

from engine.serving.preprocess_config import Number

KINDS = ("softmax", "topk", "detection", "segmentation", "embedding")
# Extra tensors an output answers with on V2, named ``<output><suffix>``.
INDEX_SUFFIX = "_index"
LABEL_SUFFIX = "_label"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Softmax(_Strict):
    """Probabilities along `axis` (the class axis; -1, the last, by default)."""

    axis: StrictInt = -1


class TopK(_Strict):
    """The `k` highest values of each row (all elements after the batch), highest first, with
    their class indices; `softmax` first turns the row into probabilities."""

    k: StrictInt = Field(ge=1, le=100_000)
    softmax: StrictBool = False


class Detection(_Strict):
    """GluonCV's three detector outputs as rows of (class, score, box). Sits on the class-ids
    output; `scores` and `boxes` name the other two (config names; inferred from the shapes
    when left out). Rows scoring under `score_threshold` are dropped; boxes are mapped to the
    original image's pixels through `input`'s preprocess (``coordinates: "original"``) or kept
    in the model's input pixels (``"input"``)."""

    scores: str | None = Field(None, min_length=1, max_length=256)
    boxes: str | None = Field(None, min_length=1, max_length=256)
    score_threshold: Number = 0.5
    max_detections: StrictInt | None = Field(None, ge=1, le=100_000)
    coordinates: Literal["original", "input"] = "original"
    input: str | None = Field(None, min_length=1, max_length=256)


class Segmentation(_Strict):
    """The class of each pixel: argmax over the class axis of ``[N, C, H, W]``, at the model's
    output resolution (``coordinates: "output"``) or resized, nearest neighbour, to the
    original image through `input`'s preprocess (``"original"``)."""

    coordinates: Literal["output", "original"] = "output"
    input: str | None = Field(None, min_length=1, max_length=256)


class Embedding(_Strict):
    """Each row (all elements after the batch) scaled to unit L2 norm."""


class Postprocess(_Strict):
    """An output's postprocess: exactly one kind."""

    softmax: Softmax | None = None
    topk: TopK | None = None
    detection: Detection | None = None
    segmentation: Segmentation | None = None
    embedding: Embedding | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Postprocess:
        kinds = [kind for kind in KINDS if getattr(self, kind) is not None]
        if len(kinds) != 1:
            raise ValueError(f"give exactly one of {', '.join(KINDS)}; got "
                             f"{', '.join(kinds) or 'none'}")
        return self

    @property
    def kind(self) -> str:
        """The one kind given (``"topk"``)."""
        return next(kind for kind in KINDS if getattr(self, kind) is not None)


def _shorthand(value: Any) -> Any:
    """A kind's name alone stands for it with default options (``"softmax"``)."""
    if isinstance(value, str):
        if value not in KINDS:
            raise ValueError(f"unknown postprocess {value!r}; give one of {', '.join(KINDS)}, "
                             "or an object such as {\"topk\": {\"k\": 5}}")
        return {value: {}}
    return value


PostprocessField = Annotated[Postprocess, BeforeValidator(_shorthand)]


def extra_names(name: str, postprocess: Postprocess, labelled: bool) -> list[str]:
    """The names of the tensors an output answers with on V2 besides its own."""
    if postprocess.topk is not None:
        return [name + INDEX_SUFFIX, *([name + LABEL_SUFFIX] if labelled else [])]
    if postprocess.detection is not None and labelled:
        return [name + LABEL_SUFFIX]
    return []


def tensor_owners(outputs: Any) -> dict[str, str]:
    """Every tensor V2 answers with, in model metadata's order, mapped to the (completed
    config's) output that computes it: each output itself, and a postprocess's extra tensors
    (``NAME_index``, ``NAME_label``) after their output."""
    owners = {}
    for tensor in outputs:
        owners[tensor.name] = tensor.name
        if tensor.postprocess is not None:
            extras = extra_names(tensor.name, tensor.postprocess, tensor.labels is not None)
            owners.update(dict.fromkeys(extras, tensor.name))
    return owners


def check_outputs(outputs: Any) -> None:
    """Consistency of the outputs' postprocesses within one config (the graph is checked at
    upload): labels on an embedding, a detector naming itself or an output that has its own
    postprocess, V2 names that clash.

    Raises:
        ValueError: the message names the output.
    """
    names = [tensor.name for tensor in outputs]
    for index, tensor in enumerate(outputs):
        post = tensor.postprocess
        if post is None:
            continue
        where = f"outputs.{index}.postprocess (output {tensor.name!r})"
        if post.embedding is not None and tensor.labels is not None:
            raise ValueError(f"{where}: an embedding has no classes to label; drop labels")
        if post.detection is not None:
            _check_detector(where, tensor.name, post.detection, outputs)
        clashes = [extra for extra in extra_names(tensor.name, post, tensor.labels is not None)
                   if extra in names]
        if clashes:
            raise ValueError(f"{where}: its postprocess answers with tensors {clashes}, which "
                             "are also outputs' names; rename one")


def _check_detector(where: str, name: str, detection: Detection, outputs: Any) -> None:
    by_name = {tensor.name: tensor for tensor in outputs}
    named = [value for value in (detection.scores, detection.boxes) if value is not None]
    if name in named or len(set(named)) != len(named):
        raise ValueError(f"{where}: detection's scores and boxes must be two other outputs "
                         f"(this one is the class ids); got scores {detection.scores!r}, "
                         f"boxes {detection.boxes!r}")
    for value in named:
        if value not in by_name:
            raise ValueError(f"{where}: detection names output {value!r}, which is not one "
                             f"of the outputs {sorted(by_name)}")
        if by_name[value].postprocess is not None:
            raise ValueError(f"{where}: output {value!r} is part of this detection and "
                             "cannot have a postprocess of its own")
