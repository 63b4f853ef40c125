"""Box geometry shared by the detection ops, and ``_contrib_box_iou``/``box_decode``/``box_encode``.

Boxes are the last axis of length 4, either ``corner`` (x1, y1, x2, y2) or ``center``
(x, y, width, height). Areas and overlaps use plain differences (no "+1" pixel convention), as
MXNet's contrib box ops do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import choice, parse_float
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred

BOX_FORMAT = choice("corner", "center")


def to_corner(xp: Any, boxes: Any) -> Any:
    """(x, y, w, h) boxes as (x1, y1, x2, y2)."""
    half = boxes[..., 2:4] / 2
    return xp.concatenate([boxes[..., 0:2] - half, boxes[..., 0:2] + half], axis=-1)


def to_center(xp: Any, boxes: Any) -> Any:
    """(x1, y1, x2, y2) boxes as (x, y, w, h)."""
    size = boxes[..., 2:4] - boxes[..., 0:2]
    return xp.concatenate([boxes[..., 0:2] + size / 2, size], axis=-1)


def as_corner(xp: Any, boxes: Any, box_format: str) -> Any:
    """Boxes in ``box_format`` as corner boxes."""
    return to_corner(xp, boxes) if box_format == "center" else boxes


def pairwise_iou(xp: Any, lhs: Any, rhs: Any) -> Any:
    """``(..., n, m)`` intersection over union of corner boxes ``lhs (..., n, 4)`` and
    ``rhs (..., m, 4)`` (leading axes broadcast: a batch of box sets)."""
    low = xp.maximum(lhs[..., :, None, 0:2], rhs[..., None, :, 0:2])
    high = xp.minimum(lhs[..., :, None, 2:4], rhs[..., None, :, 2:4])
    overlap = xp.clip(high - low, 0, None).prod(axis=-1)
    area_lhs = xp.clip(lhs[..., 2:4] - lhs[..., 0:2], 0, None).prod(axis=-1)
    area_rhs = xp.clip(rhs[..., 2:4] - rhs[..., 0:2], 0, None).prod(axis=-1)
    union = area_lhs[..., :, None] + area_rhs[..., None, :] - overlap
    return xp.where(union > 0, overlap / xp.where(union > 0, union, 1), 0).astype(lhs.dtype)


def check_boxes(shape: MaybeShape, what: str) -> None:
    """Raise `ShapeError` unless the last axis holds 4 box coordinates."""
    if shape is not None and (len(shape) == 0 or shape[-1] not in (0, 4)):
        raise ShapeError(f"{what} must end in an axis of 4 box coordinates; got {shape}")


# --- box_iou ----------------------------------------------------------------------------------

def _iou_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    lhs, rhs = shapes
    check_boxes(lhs, "box_iou lhs")
    check_boxes(rhs, "box_iou rhs")
    if lhs is None or rhs is None:
        return shapes, [None]
    return shapes, [(*lhs[:-1], *rhs[:-1])]


def _iou_kernel(xp: Any, attrs: Attrs, lhs: Any, rhs: Any) -> Any:
    flat_lhs = as_corner(xp, lhs.reshape(-1, 4), attrs.format)
    flat_rhs = as_corner(xp, rhs.reshape(-1, 4), attrs.format)
    return pairwise_iou(xp, flat_lhs, flat_rhs).reshape(lhs.shape[:-1] + rhs.shape[:-1])


register(OpDef(
    name="_contrib_box_iou",
    params=(Param("format", BOX_FORMAT, "corner"),),
    inputs=("lhs", "rhs"),
    infer_shape=_iou_infer,
    kernel=_iou_kernel,
    doc="Intersection over union of every lhs box with every rhs box.",
))


# --- box_decode -------------------------------------------------------------------------------

def _decode_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data, anchors = shapes
    check_boxes(data, "box_decode data")
    check_boxes(anchors, "box_decode anchors")
    return shapes, [data]


def _decode_kernel(xp: Any, attrs: Attrs, data: Any, anchors: Any) -> Any:
    anchor = anchors if attrs.format == "center" else to_center(xp, anchors)
    dtype = data.dtype.type
    std = [dtype(attrs[f"std{k}"]) for k in range(4)]
    x = data[..., 0] * std[0] * anchor[..., 2] + anchor[..., 0]
    y = data[..., 1] * std[1] * anchor[..., 3] + anchor[..., 1]
    log_w, log_h = data[..., 2] * std[2], data[..., 3] * std[3]
    if attrs.clip > 0:
        log_w, log_h = xp.minimum(log_w, dtype(attrs.clip)), xp.minimum(log_h, dtype(attrs.clip))
    half_w = xp.exp(log_w) * anchor[..., 2] / 2
    half_h = xp.exp(log_h) * anchor[..., 3] / 2
    return xp.stack([x - half_w, y - half_h, x + half_w, y + half_h], axis=-1)


register(OpDef(
    name="_contrib_box_decode",
    params=(*(Param(f"std{k}", parse_float, 1.0) for k in range(4)),
            Param("clip", parse_float, -1.0),
            Param("format", BOX_FORMAT, "center")),
    inputs=("data", "anchors"),
    infer_shape=_decode_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]),
    kernel=_decode_kernel,
    doc="Corner boxes from (dx, dy, dw, dh) offsets against anchors (format names the "
        "anchors' layout); clip caps the scaled log sizes.",
))


# --- box_encode -------------------------------------------------------------------------------

def _encode_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    samples = shapes[0]
    out = None if samples is None else (*samples, 4)
    return shapes, [out, out]


def _encode_kernel(xp: Any, attrs: Attrs, samples: Any, matches: Any, anchors: Any, refs: Any,
                   means: Any, stds: Any) -> tuple[Any, Any]:
    index = matches.astype("int64")[..., None].repeat(4, axis=-1)
    matched = to_center(xp, xp.take_along_axis(refs, index, axis=1))
    anchor = to_center(xp, anchors)
    offsets = (matched[..., 0:2] - anchor[..., 0:2]) / anchor[..., 2:4]
    scales = xp.log(matched[..., 2:4] / anchor[..., 2:4])
    targets = (xp.concatenate([offsets, scales], axis=-1) - means) / stds
    positive = (samples > 0.5)[..., None]
    masks = xp.broadcast_to(positive, targets.shape).astype(targets.dtype)
    return xp.where(positive, targets, 0).astype(targets.dtype), masks


register(OpDef(
    name="_contrib_box_encode",
    inputs=("samples", "matches", "anchors", "refs", "means", "stds"),
    outputs=("targets", "masks"),
    infer_shape=_encode_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[2], dtypes[2]]),
    kernel=_encode_kernel,
    doc="Regression targets of each anchor toward its matched reference box (positive samples "
        "only) and the matching 0/1 masks.",
))


def host(array: Any) -> np.ndarray:
    """A numpy array with ``array``'s contents (a device array is copied to the host)."""
    return array.get() if hasattr(array, "get") else array


def greedy_keep(corners: np.ndarray, classes: np.ndarray | None, threshold: float,
                inclusive: bool, alive: np.ndarray | None = None) -> np.ndarray:
    """Which of the score-ordered ``corners`` survive greedy non-maximum suppression.

    A surviving box suppresses every later one whose IoU with it exceeds ``threshold`` (or
    equals it, when ``inclusive``) and, when ``classes`` is given, that has the same class.
    Boxes not ``alive`` at the start neither suppress nor survive.
    """
    overlaps = pairwise_iou(np, corners, corners)
    suppresses = overlaps >= threshold if inclusive else overlaps > threshold
    if classes is not None:
        suppresses &= classes[:, None] == classes[None, :]
    alive = np.ones(len(corners), bool) if alive is None else alive.copy()
    for index in range(len(corners)):
        if alive[index]:
            alive[index + 1:] &= ~suppresses[index, index + 1:]
    return alive


def greedy_keep_batched(xp: Any, corners: Any, classes: Any | None, threshold: float,
                        inclusive: bool, alive: Any) -> Any:
    """`greedy_keep` for a batch ``(B, K, 4)`` of score-ordered boxes, with array ops only.

    No value is read on the host, so a GPU runs it inside a CUDA graph: the loop is over
    positions (K small steps, each masking what the box there suppresses if it is alive), not
    over data-dependent survivors. ``alive`` (B, K) is updated in place and returned.
    """
    overlaps = pairwise_iou(xp, corners, corners)
    suppresses = overlaps >= threshold if inclusive else overlaps > threshold
    if classes is not None:
        suppresses &= classes[:, :, None] == classes[:, None, :]
    for index in range(corners.shape[1] - 1):
        alive[:, index + 1:] &= ~(alive[:, index, None] & suppresses[:, index, index + 1:])
    return alive
