"""``_contrib_MultiBoxDetection``: SSD decoding and class-aware greedy suppression, as MXNet 1.9.

Per image the output is ``(anchors, 6)`` rows ``[class, score, x1, y1, x2, y2]``: rows whose
best foreground score reaches ``threshold`` come first; of those, the best ``nms_topk`` are
sorted by score and the rest keep anchor order with class -1; suppressed rows keep their values
with class -1; the remaining rows are all -1. The suppression reuses `box_nms`'s Loop.
"""

from __future__ import annotations

import numpy as np

from engine.onnx.context import NodeContext, converts
from engine.onnx.convert_boxes import _greedy, _part, pairwise_iou


def _decode(ctx: NodeContext, loc: str, anchors: str) -> str:
    """Corner boxes from SSD offsets against corner anchors, in MXNet's arithmetic order."""
    dtype = ctx.in_dtypes[0]
    variances = np.asarray(ctx.params.variances, dtype)
    low, high = _part(ctx, anchors, 0, 2), _part(ctx, anchors, 2, 4)
    size = ctx.op("Sub", [high, low])
    centre = ctx.op("Div", [ctx.op("Add", [low, high]), ctx.scalar(2.0)])
    moved = ctx.op("Mul", [_part(ctx, loc, 0, 2), ctx.builder.const(variances[:2], "variance")])
    moved = ctx.op("Add", [ctx.op("Mul", [moved, size]), centre])
    grown = ctx.op("Exp", [ctx.op("Mul", [_part(ctx, loc, 2, 4),
                                          ctx.builder.const(variances[2:], "variance")])])
    half = ctx.op("Div", [ctx.op("Mul", [grown, size]), ctx.scalar(2.0)])
    boxes = ctx.op("Concat", [ctx.op("Sub", [moved, half]), ctx.op("Add", [moved, half])],
                   axis=-1)
    if ctx.params.clip:
        boxes = ctx.op("Clip", [boxes, ctx.scalar(0.0), ctx.scalar(1.0)])
    return boxes


def _first(ctx: NodeContext, rows: str, keys: str, count: int) -> tuple[str, str]:
    """``rows`` reordered by descending ``keys`` (ties: lower index first), and the order."""
    _, order = ctx.op("TopK", [keys, ctx.ints([count])], outputs=2, axis=1)
    return ctx.op("GatherND", [rows, ctx.unsqueeze(order, [-1])], batch_dims=1), order


@converts("_contrib_MultiBoxDetection")
def multibox_detection(ctx: NodeContext) -> str:
    params, (probs, loc, anchors) = ctx.params, ctx.inputs[:3]
    count = ctx.in_shapes[0][2]
    foreground = _part(ctx, probs, 1, ctx.in_shapes[0][1], axis=1)
    classes = ctx.cast(ctx.op("ArgMax", [foreground], axis=1, keepdims=0), ctx.in_dtypes[0])
    scores = ctx.reduce("ReduceMax", foreground, [1], False)
    boxes = _decode(ctx, ctx.op("Reshape", [loc, ctx.ints([-1, count, 4])]),
                    ctx.op("Reshape", [anchors, ctx.ints([1, count, 4])]))
    rows = ctx.op("Concat", [ctx.unsqueeze(classes, [-1]), ctx.unsqueeze(scores, [-1]), boxes],
                  axis=-1)
    valid = ctx.op("GreaterOrEqual", [scores, ctx.scalar(params.threshold)])
    # Valid rows first, in anchor order.
    positions = ctx.builder.const(np.arange(count, 0, -1).astype(np.float32), "positions")
    zero = ctx.builder.const(np.float32(0), "zero")
    rows, order = _first(ctx, rows, ctx.op("Where", [valid, positions, zero]), count)
    valid = ctx.op("GatherElements", [valid, order], axis=1)
    index = ctx.builder.const(np.arange(count, dtype=np.int64), "index")
    if 0 < params.nms_threshold <= 1:
        rows = _suppressed(ctx, rows, valid, index, count)
    return ctx.op("Where", [ctx.unsqueeze(valid, [-1]), rows, ctx.scalar(-1.0)])


def _suppressed(ctx: NodeContext, rows: str, valid: str, index: str, count: int) -> str:
    """The best ``nms_topk`` valid rows sorted by score and suppressed; the other valid rows
    unsorted with class -1."""
    params = ctx.params
    scores = ctx.squeeze(_part(ctx, rows, 1, 2), [-1])
    ranked, _ = _first(ctx, rows, ctx.op("Where", [valid, scores, ctx.scalar(-np.inf)]), count)
    number = ctx.op("ReduceSum", [ctx.cast(valid, np.int64), ctx.ints([1])], keepdims=1)
    kept = number if params.nms_topk <= 0 else ctx.op("Min", [number,
                                                               ctx.ints([params.nms_topk])])
    alive = ctx.op("Less", [index, kept])  # (batch, anchors)
    candidates = ctx.op("Where", [ctx.unsqueeze(alive, [-1]), ranked, rows])
    corners = _part(ctx, candidates, 2, 6)
    suppresses = ctx.op("GreaterOrEqual", [pairwise_iou(ctx, corners, corners),
                                           ctx.scalar(params.nms_threshold)])
    classes = _part(ctx, candidates, 0, 1)
    if not params.force_suppress:
        same = ctx.op("Equal", [classes, ctx.op("Transpose", [classes], perm=[0, 2, 1])])
        suppresses = ctx.op("And", [suppresses, same])
    later = np.triu(np.ones((count, count), bool), 1)
    suppresses = ctx.op("And", [suppresses, ctx.builder.const(later, f"{ctx.hint}_later")])
    survivors = ctx.unsqueeze(_greedy(ctx, suppresses, alive, count), [-1])
    marked = ctx.op("Where", [survivors, classes, ctx.scalar(-1.0)])
    return ctx.op("Concat", [marked, _part(ctx, candidates, 1, 6)], axis=-1)
