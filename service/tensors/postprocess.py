"""Outputs after their ``postprocess``: typed tensors for V2 (REST and gRPC), objects for /predict.

V2 keeps each output's name and adds tensors beside it (docs/preprocessing.md has the table):
a top-k answers ``NAME`` (the values, ``[N, k]``), ``NAME_index`` (INT32) and, with labels,
``NAME_label`` (BYTES); a detector's ids, scores and boxes outputs answer their kept rows padded
to the most any image has (``[N, K]`` INT32, ``[N, K]`` FP32, ``[N, K, 4]`` FP32, padding -1
as GluonCV pads) and, with labels, ``NAME_label``. /predict answers a row of objects per image
instead (labels, scores, boxes). Triton's classification extension, when asked for on an
output, answers it in place of its postprocess.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from engine.serving.config import TensorConfig
from engine.serving.loaded import LoadedVersion
from engine.serving.postprocess import (
    DetectionRows,
    class_map,
    class_map_to_original,
    detection_rows,
    l2_normalise,
    padded,
    padded_maps,
    softmax,
    top_k,
)
from engine.serving.postprocess_config import (
    INDEX_SUFFIX,
    LABEL_SUFFIX,
    Postprocess,
)
from engine.serving.preprocess import Geometry
from engine.serving.preprocess_config import ImagePreprocess
from service.tensors import classification, json

Geometries = Mapping[str, Sequence[Geometry]]  # by input name, one per image row


def v2_outputs(handle: LoadedVersion, outputs: Mapping[str, np.ndarray],
               binary: Mapping[str, bool], classes: Mapping[str, int],
               geometries: Geometries | None = None
               ) -> tuple[dict[str, np.ndarray], dict[str, bool]]:
    """Exactly the tensors named by `binary`'s keys (outputs or a postprocess's extra tensors,
    in order), and whether each goes as binary data; an output in `classes` is answered as
    Triton's classification extension answers it."""
    posts = handle.postprocesses
    if not posts and not classes:  # most models: the outputs as they are
        return {name: outputs[name] for name in binary}, dict(binary)
    where = f"model {handle.name!r} version {handle.version}"
    owners = handle.tensor_owners
    detections = _Detections(handle, outputs, posts, geometries or {})
    computed: dict[str, dict[str, np.ndarray]] = {}  # by output: its tensors, computed once
    tensors: dict[str, np.ndarray] = {}
    for name in binary:
        if name in classes:
            values = _elementwise(outputs[name], posts.get(name))
            tensors[name] = classification.classify(values, classes[name],
                                                    handle.labels.get(name),
                                                    f"{where}: output {name!r}")
            continue
        owner = owners[name]
        if owner not in computed:
            computed[owner] = _tensors(handle, owner, outputs, posts.get(owner), detections,
                                       geometries or {})
        tensors[name] = computed[owner][name]
    return tensors, dict(binary)


def _elementwise(array: np.ndarray, post: Postprocess | None) -> np.ndarray:
    """The output after a postprocess that keeps its shape (softmax, embedding), else raw."""
    if post is not None and post.softmax is not None:
        return softmax(array, post.softmax.axis)
    if post is not None and post.embedding is not None:
        return l2_normalise(array)
    return array


def _tensors(handle: LoadedVersion, name: str, outputs: Mapping[str, np.ndarray],
             post: Postprocess | None, detections: _Detections, geometries: Geometries
             ) -> dict[str, np.ndarray]:
    """One output's V2 tensors."""
    labels = handle.labels.get(name)
    if post is not None and post.topk is not None:
        values, indices = _top(outputs[name], post)
        answer = {name: values, name + INDEX_SUFFIX: indices}
        if labels is not None:
            answer[name + LABEL_SUFFIX] = _label_bytes(indices, labels)
        return answer
    if post is not None and post.segmentation is not None:
        maps = _class_maps(handle, post, outputs[name], geometries)
        return {name: maps if isinstance(maps, np.ndarray) else padded_maps(maps)}
    part = detections.part(name)
    if part is not None:
        return part
    return {name: _elementwise(outputs[name], post)}


def _class_maps(handle: LoadedVersion, post: Postprocess, array: np.ndarray,
                geometries: Geometries) -> np.ndarray | list[np.ndarray]:
    """A segmentation's class maps: ``[N, h, w]`` at the model's output resolution, or one map
    a row at its original image's size when the postprocess asks for it and the request sent
    images (a request of tensors has no original image)."""
    options = post.segmentation
    assert options is not None
    maps = class_map(array)
    rows = geometries.get(options.input or "")
    if options.coordinates != "original" or not rows:
        return maps
    pipeline = handle.pipelines[options.input or ""]
    assert isinstance(pipeline, ImagePreprocess) and pipeline.output_size is not None
    return [class_map_to_original(found, geometry, pipeline.output_size)
            for found, geometry in zip(maps, rows)]


def _top(array: np.ndarray, post: Postprocess) -> tuple[np.ndarray, np.ndarray]:
    assert post.topk is not None
    values = softmax(array.reshape(array.shape[0], -1)) if post.topk.softmax else array
    return top_k(values, post.topk.k)


def _label_of(index: int, labels: Sequence[str]) -> str:
    """Class `index`'s label; "" past the labels file (a detector's ids are not bounded by a
    shape) and for padding."""
    return labels[index] if 0 <= index < len(labels) else ""


def _label_bytes(indices: np.ndarray, labels: Sequence[str]) -> np.ndarray:
    """A BYTES tensor (object array of UTF-8 strings) of the labels of `indices`."""
    result = np.empty(indices.shape, dtype=object)
    flat = result.reshape(-1)
    for position, index in enumerate(indices.reshape(-1).tolist()):
        flat[position] = _label_of(index, labels).encode("utf-8")
    return result


class _Detections:
    """Each detector's rows, computed once per answer when one of its outputs is asked for."""

    def __init__(self, handle: LoadedVersion, outputs: Mapping[str, np.ndarray],
                 posts: Mapping[str, Postprocess], geometries: Geometries) -> None:
        self.handle, self.outputs, self.geometries = handle, outputs, geometries
        self.carriers = {name: post for name, post in posts.items() if post.detection}
        self.roles: dict[str, tuple[str, str]] = {}
        for name, post in self.carriers.items():
            assert post.detection is not None and post.detection.scores and post.detection.boxes
            self.roles.update({name: (name, "ids"), post.detection.scores: (name, "scores"),
                               post.detection.boxes: (name, "boxes")})
        self._rows: dict[str, list[DetectionRows]] = {}

    def rows(self, carrier: str) -> list[DetectionRows]:
        """The detections of each image of the detector whose ids output is `carrier`."""
        if carrier not in self._rows:
            detection = self.carriers[carrier].detection
            assert detection is not None and detection.scores and detection.boxes
            geometry = self.geometries.get(detection.input or "", ())
            self._rows[carrier] = detection_rows(
                self.outputs[carrier], self.outputs[detection.scores],
                self.outputs[detection.boxes], detection, geometry)
        return self._rows[carrier]

    def part(self, name: str) -> dict[str, np.ndarray] | None:
        """The V2 tensors of output `name` when it belongs to a detector, else None."""
        if name not in self.roles:
            return None
        carrier, role = self.roles[name]
        ids, scores, boxes = padded(self.rows(carrier))
        if role == "scores":
            return {name: scores}
        if role == "boxes":
            return {name: boxes}
        labels = self.handle.labels.get(name)
        answer = {name: ids}
        if labels is not None:
            answer[name + LABEL_SUFFIX] = _label_bytes(ids, labels)
        return answer


def predict_outputs(handle: LoadedVersion, outputs: Mapping[str, np.ndarray],
                    geometries: Geometries | None = None) -> dict[str, Any]:
    """``/predict``'s ``outputs``: nested lists, and for a top-k, detector or segmentation a
    list with one entry per image (a detector's scores and boxes outputs are in its rows)."""
    posts = handle.postprocesses
    if not posts:
        return {name: json.json_ready(array) for name, array in outputs.items()}
    detections = _Detections(handle, outputs, posts, geometries or {})
    answer: dict[str, Any] = {}
    for name, array in outputs.items():
        post, labels = posts.get(name), handle.labels.get(name)
        if name in detections.carriers:
            answer[name] = [_detection_objects(found, labels) for found in detections.rows(name)]
        elif name in detections.roles:
            continue
        elif post is not None and post.topk is not None:
            answer[name] = _top_objects(*_top(array, post), labels)
        elif post is not None and post.segmentation is not None:
            maps = _class_maps(handle, post, array, geometries or {})
            answer[name] = [_segment_object(row, labels) for row in maps]
        else:
            answer[name] = json.json_ready(_elementwise(array, post))
    return answer


def _with_label(entry: dict[str, Any], index: int, labels: Sequence[str] | None
                ) -> dict[str, Any]:
    if labels is not None:
        entry["label"] = _label_of(index, labels)
    return entry


def _top_objects(values: np.ndarray, indices: np.ndarray, labels: Sequence[str] | None
                 ) -> list[list[dict[str, Any]]]:
    return [[_with_label({"index": index, "score": score}, index, labels)
             for index, score in zip(row_indices.tolist(), row_values.tolist())]
            for row_values, row_indices in zip(values, indices)]


def _detection_objects(found: DetectionRows, labels: Sequence[str] | None
                       ) -> list[dict[str, Any]]:
    return [_with_label({"class_id": class_id, "score": score, "box": box}, class_id, labels)
            for class_id, score, box in zip(found.class_ids.tolist(), found.scores.tolist(),
                                            found.boxes.tolist())]


def _segment_object(classes: np.ndarray, labels: Sequence[str] | None) -> dict[str, Any]:
    present, pixels = np.unique(classes[classes >= 0], return_counts=True)  # -1: unseen
    return {"class_map": classes.tolist(),
            "classes": [_with_label({"index": index, "pixels": count}, index, labels)
                        for index, count in zip(present.tolist(), pixels.tolist())]}


def metadata(outputs: Sequence[TensorConfig]) -> list[tuple[str, str, list[int]]]:
    """(name, datatype, shape) of each tensor the outputs answer with on V2, as model metadata
    shows them: what a postprocess gives, not what the graph does."""
    parts = {}
    for tensor in outputs:
        detection = tensor.postprocess.detection if tensor.postprocess else None
        if detection is not None:
            parts.update({detection.scores: "FP32", detection.boxes: "FP32"})
    shown = []
    for tensor in outputs:
        assert tensor.shape is not None and tensor.datatype is not None  # completed
        post, labelled = tensor.postprocess, tensor.labels is not None
        if tensor.name in parts:
            boxes = tensor.shape[-1] == 4 and len(tensor.shape) == 3
            shown.append((tensor.name, "FP32", [-1, -1, 4] if boxes else [-1, -1]))
        elif post is None:
            shown.append((tensor.name, tensor.datatype, list(tensor.shape)))
        elif post.segmentation is not None:  # original: each request's own image sizes
            original = post.segmentation.coordinates == "original"
            shown.append((tensor.name, "INT32", [-1, -1, -1] if original
                          else [-1, *tensor.shape[2:]]))
        elif post.topk is not None:
            classes = math.prod(tensor.shape[1:])
            width = min(post.topk.k, classes) if classes > 0 else -1
            datatype = "FP32" if post.topk.softmax else tensor.datatype
            shown += [(tensor.name, datatype, [-1, width]),
                      (tensor.name + INDEX_SUFFIX, "INT32", [-1, width])]
            shown += [(tensor.name + LABEL_SUFFIX, "BYTES", [-1, width])] if labelled else []
        elif post.detection is not None:
            shown.append((tensor.name, "INT32", [-1, -1]))
            shown += [(tensor.name + LABEL_SUFFIX, "BYTES", [-1, -1])] if labelled else []
        else:  # softmax, embedding: the same shape in FP32
            shown.append((tensor.name, "FP32", list(tensor.shape)))
    return shown
