"""``_contrib_bipartite_matching``: greedy one-to-one matching of a score matrix's rows and
columns (SSD's anchor-to-ground-truth matching).

MXNet walks each batch's scores from best to worst (largest first, or smallest with
``is_ascend``) and matches a row and a column when both are still free; it stops at the first
free pair whose score does not pass ``threshold``, or once ``topk`` (when positive) pairs have
been matched and one more taken. Taking the best score among free rows and columns, again and
again, visits the same pairs in the same order, so each step is an arg-max over the masked
matrix: ``min(rows, cols)`` steps at most, a number fixed by the shapes, with no value read
back to the host.

Outputs: for every row the matched column (or -1), and for every column the matched row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import parse_bool, parse_float, parse_int
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred


def _infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return shapes, [None, None]
    if len(data) < 2:
        raise ShapeError(f"bipartite_matching: data must be (..., rows, cols); got {data}")
    return shapes, [data[:-1], (*data[:-2], data[-1])]


def _steps(attrs: Attrs, rows: int, cols: int) -> int:
    # MXNet checks `count > topk` after taking a pair, so topk = k matches k + 1 pairs.
    limit = min(rows, cols)
    return min(limit, attrs.topk + 1) if attrs.topk > 0 else limit


def _matching(xp: Any, attrs: Attrs, data: Any) -> tuple[Any, Any]:
    *lead, rows, cols = data.shape
    scores = data.reshape(-1, rows, cols)
    batch = scores.shape[0]
    # Searching for the largest of -scores is searching for the smallest score.
    signed = -scores if attrs.is_ascend else scores
    threshold = -attrs.threshold if attrs.is_ascend else attrs.threshold
    row_match = xp.full((batch, rows), -1, np.int64)
    col_match = xp.full((batch, cols), -1, np.int64)
    active = xp.ones(batch, bool)
    batches = xp.arange(batch)
    for _ in range(_steps(attrs, rows, cols)):
        free = (row_match == -1)[:, :, None] & (col_match == -1)[:, None, :]
        masked = xp.where(free, signed, -np.inf).reshape(batch, -1)
        best = xp.argmax(masked, axis=1)
        passes = masked[batches, best] > masked.dtype.type(threshold)
        active = active & passes
        row, col = best // cols, best % cols
        row_match[batches, row] = xp.where(active, col, row_match[batches, row])
        col_match[batches, col] = xp.where(active, row, col_match[batches, col])
    return (row_match.astype(data.dtype).reshape(*lead, rows),
            col_match.astype(data.dtype).reshape(*lead, cols))


register(OpDef(
    name="_contrib_bipartite_matching",
    params=(Param("is_ascend", parse_bool, False), Param("threshold", parse_float),
            Param("topk", parse_int, -1)),
    outputs=("row_marker", "col_marker"),
    infer_shape=_infer,
    infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0], dtypes[0]]),
    kernel=_matching,
    doc="Greedy bipartite matching by score: each row's matched column and each column's "
        "matched row (-1 where unmatched).",
))
