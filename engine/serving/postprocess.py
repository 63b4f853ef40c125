"""Compute an output's postprocess: softmax, top-k, detection rows, class maps, embeddings.

Pure NumPy on one request's outputs (batch first), after the batcher has split them. The
options come from `engine.serving.postprocess_config`; detection boxes go back to the original
image through the `Geometry` each image row's preprocess gave.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.serving.postprocess_config import Detection
from engine.serving.preprocess import Geometry

# Padding of detection tensors, as GluonCV pads the rows its NMS suppressed.
PAD = -1


def softmax(array: np.ndarray, axis: int = -1) -> np.ndarray:
    """Probabilities along `axis`, FP32 (computed in FP64 after subtracting the maximum, so
    large logits do not overflow)."""
    values = np.asarray(array, np.float64)
    shifted = np.exp(values - values.max(axis=axis, keepdims=True))
    return (shifted / shifted.sum(axis=axis, keepdims=True)).astype(np.float32)


def top_k(array: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The `k` (at most the row size) highest values of each row (every element after the
    batch, flattened) and their indices, highest first; equal values keep index order, as the
    classification extension orders them."""
    rows = np.asarray(array).reshape(array.shape[0], -1)
    classes = rows.shape[1]
    # Descending and stable: sort the reversed row ascending, then read it backwards.
    order = classes - 1 - np.argsort(rows[:, ::-1], axis=1, kind="stable")[:, ::-1]
    indices = order[:, :min(k, classes)]
    return np.take_along_axis(rows, indices, axis=1), indices.astype(np.int32)


def class_map(array: np.ndarray) -> np.ndarray:
    """The class of each pixel of ``[N, C, H, W]`` scores: ``[N, H, W]`` INT32 (the first
    class where several score the same)."""
    return np.asarray(array).argmax(axis=1).astype(np.int32)


def class_map_to_original(classes: np.ndarray, geometry: Geometry,
                          input_size: tuple[int, int]) -> np.ndarray:
    """One ``[h, w]`` class map at the model's output resolution resized to the original image
    (``geometry.original``), nearest neighbour, INT32: each original pixel's centre goes
    through the preprocess's resize, letterbox and crop into the model's input (`input_size`,
    ``(height, width)``, which the output covers evenly) and takes the class there. Pixels the
    model never saw (cut off by a centre crop) are -1."""
    rows = _source_indices(geometry.original[0], geometry.scale[0], geometry.offset[0],
                           classes.shape[0], input_size[0])
    columns = _source_indices(geometry.original[1], geometry.scale[1], geometry.offset[1],
                              classes.shape[1], input_size[1])
    found = np.asarray(classes, np.int32)[np.ix_(np.maximum(rows, 0), np.maximum(columns, 0))]
    found[rows < 0, :] = PAD
    found[:, columns < 0] = PAD
    return found


def _source_indices(size: int, scale: float, offset: float, extent: int, input_extent: int
                    ) -> np.ndarray:
    """Along one axis, for each of the original image's `size` pixels, the output pixel (of
    `extent`, covering `input_extent` input pixels) whose area holds its centre; -1 outside."""
    centres = ((np.arange(size) + 0.5) * scale + offset) * (extent / input_extent)
    inside = (centres >= 0) & (centres < extent)
    return np.where(inside, np.floor(centres), PAD).astype(np.int64)


def padded_maps(maps: Sequence[np.ndarray]) -> np.ndarray:
    """Class maps of different sizes as one ``[N, H, W]`` INT32 tensor (H, W: the largest of
    each), padded with -1 at the bottom and right."""
    height = max(found.shape[0] for found in maps)
    width = max(found.shape[1] for found in maps)
    batch = np.full((len(maps), height, width), PAD, np.int32)
    for row, found in enumerate(maps):
        batch[row, :found.shape[0], :found.shape[1]] = found
    return batch


def l2_normalise(array: np.ndarray) -> np.ndarray:
    """Each row (every element after the batch) divided by its L2 norm, FP32; an all-zero row
    stays zero."""
    values = np.asarray(array, np.float64)
    rows = values.reshape(values.shape[0], -1)
    norms = np.sqrt(np.square(rows).sum(axis=1))
    norms[norms == 0] = 1.0
    return (rows / norms[:, None]).reshape(values.shape).astype(np.float32)


@dataclass(frozen=True)
class DetectionRows:
    """The detections of one image, highest score first."""

    class_ids: np.ndarray  # [n] INT32
    scores: np.ndarray  # [n] FP32
    boxes: np.ndarray  # [n, 4] FP32: x1, y1, x2, y2 in pixels

    def __len__(self) -> int:
        return len(self.class_ids)


def detection_rows(ids: np.ndarray, scores: np.ndarray, boxes: np.ndarray,
                   options: Detection, geometries: Sequence[Geometry | None]
                   ) -> list[DetectionRows]:
    """Per image, the rows of GluonCV's ids ``[N, R(, 1)]``, scores ``[N, R(, 1)]`` and boxes
    ``[N, R, 4]`` that are detections (class id >= 0, as GluonCV pads with -1) scoring at
    least the threshold; boxes mapped through each image's geometry (None: kept in the
    model's input pixels)."""
    batch = ids.shape[0]
    ids = np.rint(np.asarray(ids, np.float64).reshape(batch, -1)).astype(np.int64)
    scores = np.asarray(scores, np.float32).reshape(batch, -1)
    boxes = np.asarray(boxes, np.float32).reshape(batch, -1, 4)
    found = []
    for row in range(batch):
        keep = np.flatnonzero((ids[row] >= 0) & (scores[row] >= options.score_threshold))
        keep = keep[np.argsort(-scores[row][keep], kind="stable")][:options.max_detections]
        kept = boxes[row][keep]
        geometry = geometries[row] if row < len(geometries) else None
        if geometry is not None and options.coordinates == "original":
            kept = geometry.to_original(kept).astype(np.float32)
        found.append(DetectionRows(ids[row][keep].astype(np.int32), scores[row][keep], kept))
    return found


def padded(rows: Sequence[DetectionRows]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Detections of several images as three tensors of ``K`` rows each (K: the most any image
    has): class ids ``[N, K]`` INT32, scores ``[N, K]`` FP32, boxes ``[N, K, 4]`` FP32; the
    rows an image lacks are -1 throughout, as GluonCV pads."""
    count = max((len(found) for found in rows), default=0)
    ids = np.full((len(rows), count), PAD, np.int32)
    scores = np.full((len(rows), count), PAD, np.float32)
    boxes = np.full((len(rows), count, 4), PAD, np.float32)
    for row, found in enumerate(rows):
        ids[row, :len(found)] = found.class_ids
        scores[row, :len(found)] = found.scores
        boxes[row, :len(found)] = found.boxes
    return ids, scores, boxes
