"""``_contrib_box_nms``: non-maximum suppression with a fixed output shape.

MXNet keeps the input's shape: per batch row, the surviving records come first in descending
score order and every other row is filled with -1. A plan therefore sees no data-dependent shape.
On the CPU the sequential suppression loop runs over the survivors only. On a GPU the same result
is computed with array ops alone (sorts, an IoU matrix, a loop over candidate positions), so
nothing is read on the host and the plan can still be captured as a CUDA graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import parse_bool, parse_float, parse_int
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred
from engine.ops.vision.boxes import (
    BOX_FORMAT,
    greedy_keep,
    greedy_keep_batched,
    to_center,
    to_corner,
)


def _infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return shapes, [None]
    width = data[-1] if len(data) >= 2 else 0
    needed = max(attrs.coord_start + 4, attrs.score_index + 1, attrs.id_index + 1)
    if len(data) < 2 or (width and width < needed):
        raise ShapeError(f"box_nms: data must be (..., boxes, record) with records of at least "
                         f"{needed} values for coord_start={attrs.coord_start}, "
                         f"score_index={attrs.score_index}, id_index={attrs.id_index}; "
                         f"got {data}")
    return shapes, [data]


def _candidates(rows: np.ndarray, attrs: Attrs) -> np.ndarray:
    """Indices of the rows that take part, best score first, at most ``topk`` of them."""
    scores = rows[:, attrs.score_index]
    valid = scores > attrs.valid_thresh
    if attrs.id_index >= 0 and attrs.background_id >= 0:
        valid &= rows[:, attrs.id_index] != attrs.background_id
    order = np.flatnonzero(valid)
    order = order[np.argsort(-scores[order], kind="stable")]
    return order[:attrs.topk] if attrs.topk > 0 else order


def suppress_rows(rows: np.ndarray, attrs: Attrs) -> np.ndarray:
    """One batch row of records: survivors first by score, the rest -1."""
    order = _candidates(rows, attrs)
    coords = slice(attrs.coord_start, attrs.coord_start + 4)
    corners = rows[order, coords]
    if attrs.in_format == "center":
        corners = to_corner(np, corners)
    classes = None
    if attrs.id_index >= 0 and not attrs.force_suppress:
        classes = rows[order, attrs.id_index]
    kept = order[greedy_keep(corners, classes, attrs.overlap_thresh, inclusive=False)]
    result = np.full_like(rows, -1)
    result[:len(kept)] = rows[kept]
    if attrs.in_format != attrs.out_format:
        convert = to_center if attrs.out_format == "center" else to_corner
        result[:len(kept), coords] = convert(np, rows[kept, coords])
    return result


def _kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    batches = data.reshape(-1, *data.shape[-2:])
    if xp is np:
        result = np.stack([suppress_rows(rows, attrs) for rows in batches])
    else:
        result = suppress_batches(xp, batches, attrs)
    return result.reshape(data.shape)


def ranked_candidates(xp: Any, batches: Any, attrs: Attrs) -> tuple[Any, Any]:
    """Every batch row's records sorted as `_candidates` orders them (the others after, in
    index order), and which of the sorted records are candidates."""
    scores = batches[:, :, attrs.score_index]
    valid = scores > attrs.valid_thresh
    if attrs.id_index >= 0 and attrs.background_id >= 0:
        valid &= batches[:, :, attrs.id_index] != attrs.background_id
    # Stable sorts, as on the host: equal scores keep their index order.
    order = xp.argsort(xp.where(valid, -scores, xp.inf), axis=1, kind="stable")
    ranked = xp.take_along_axis(batches, order[:, :, None], axis=1)
    candidate = xp.take_along_axis(valid, order, axis=1)
    if attrs.topk > 0:
        candidate[:, attrs.topk:] = False
    return ranked, candidate


def suppress_batches(xp: Any, batches: Any, attrs: Attrs) -> Any:
    """`suppress_rows` for every ``(boxes, record)`` row of ``batches`` at once, with array ops
    only (see the module docstring)."""
    ranked, alive = ranked_candidates(xp, batches, attrs)
    count = batches.shape[1]
    limit = min(attrs.topk, count) if attrs.topk > 0 else count  # no candidate lies beyond
    coords = slice(attrs.coord_start, attrs.coord_start + 4)
    corners = ranked[:, :limit, coords]
    if attrs.in_format == "center":
        corners = to_corner(xp, corners)
    classes = None
    if attrs.id_index >= 0 and not attrs.force_suppress:
        classes = ranked[:, :limit, attrs.id_index]
    greedy_keep_batched(xp, corners, classes, attrs.overlap_thresh, False, alive[:, :limit])
    # Survivors to the front, still by score: a stable sort on "suppressed".
    order = xp.argsort((~alive).astype(np.int8), axis=1, kind="stable")
    survivors = xp.take_along_axis(ranked, order[:, :, None], axis=1)
    if attrs.in_format != attrs.out_format:
        convert = to_center if attrs.out_format == "center" else to_corner
        survivors[:, :, coords] = convert(xp, survivors[:, :, coords])
    filled = xp.arange(count)[None, :] < alive.sum(axis=1, keepdims=True)
    return xp.where(filled[:, :, None], survivors, batches.dtype.type(-1))


register(OpDef(
    name="_contrib_box_nms",
    aliases=("_contrib_box_non_maximum_suppression",),
    params=(
        Param("overlap_thresh", parse_float, 0.5),
        Param("valid_thresh", parse_float, 0.0),
        Param("topk", parse_int, -1),
        Param("coord_start", parse_int, 2),
        Param("score_index", parse_int, 1),
        Param("id_index", parse_int, -1),
        Param("background_id", parse_int, -1),
        Param("force_suppress", parse_bool, False),
        Param("in_format", BOX_FORMAT, "corner"),
        Param("out_format", BOX_FORMAT, "corner"),
    ),
    hidden_outputs=1,
    infer_shape=_infer,
    kernel=_kernel,
    doc="Greedy non-maximum suppression per batch row: kept records sorted by score first, "
        "other rows -1 (scores must exceed valid_thresh; topk limits the candidates).",
))
