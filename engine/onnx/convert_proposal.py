"""``_contrib_Proposal`` and ``_contrib_MultiProposal``: Faster R-CNN region proposals.

Written batched, every image at once, in the arithmetic order of the engine's kernel
(engine/ops/vision/proposal.py): the anchors of the (export-time) feature map are constants; deltas
move them, boxes are clipped to ``im_info`` and the too-small ones grow and lose their score;
TopK (ties: lower index first, as a stable sort) keeps the best ``rpn_pre_nms_top_n``; their
"+1"-area IoU feeds `box_nms`'s suppression Loop; the survivors, in score order and repeated
cyclically when fewer than ``rpn_post_nms_top_n`` remain, become rows
``(batch index, x1, y1, x2, y2)``.
"""

from __future__ import annotations

import numpy as np

from engine.onnx.context import NodeContext, converts
from engine.onnx.convert_boxes import _greedy, _part
from engine.ops.vision.proposal import shifted_anchors


def _decode(ctx: NodeContext, deltas: str, height: int, width: int) -> str:
    """``(N, H, W, A, 4)`` anchors moved by their deltas (unclipped)."""
    boxes = shifted_anchors(ctx.params, height, width)
    if ctx.params.iou_loss:  # deltas move the corners directly
        return ctx.op("Add", [deltas, ctx.builder.const(boxes, f"{ctx.hint}_anchors")])
    size = boxes[..., 2:4] - boxes[..., 0:2] + np.float32(1)
    centre = boxes[..., 0:2] + np.float32(0.5) * (size - np.float32(1))
    size_name = ctx.builder.const(size, f"{ctx.hint}_anchor_size")
    new_centre = ctx.op("Add", [ctx.op("Mul", [_part(ctx, deltas, 0, 2), size_name]),
                                ctx.builder.const(centre, f"{ctx.hint}_anchor_centre")])
    new_size = ctx.op("Mul", [ctx.op("Exp", [_part(ctx, deltas, 2, 4)]), size_name])
    half = ctx.op("Mul", [ctx.scalar(0.5), ctx.op("Sub", [new_size, ctx.scalar(1.0)])])
    return ctx.op("Concat", [ctx.op("Sub", [new_centre, half]),
                             ctx.op("Add", [new_centre, half])], axis=-1)


def _info(ctx: NodeContext, column: int) -> str:
    """Column ``column`` of ``im_info`` as ``(N, 1)``."""
    return _part(ctx, ctx.inputs[2], column, column + 1)


def _clip(ctx: NodeContext, boxes: str) -> str:
    """Boxes clipped to ``[0, width - 1] x [0, height - 1]`` of their image."""
    columns = ctx.ints([1, 0, 1, 0])
    limit = ctx.op("Sub", [ctx.op("Gather", [ctx.inputs[2], columns], axis=1), ctx.scalar(1.0)])
    limit = ctx.op("Reshape", [limit, ctx.ints([-1, 1, 1, 1, 4])])
    return ctx.op("Max", [ctx.op("Min", [boxes, limit]), ctx.scalar(0.0)])


def _outside(ctx: NodeContext, height: int, width: int) -> str:
    """``(N, H, W, 1)``: cells beyond the image (floor(size / stride) cells are inside)."""
    stride = ctx.scalar(float(ctx.params.feature_stride))
    cells = [ctx.op("Floor", [ctx.op("Div", [_info(ctx, k), stride])]) for k in range(2)]
    rows = np.arange(height, dtype=np.float32).reshape(1, height, 1, 1)
    columns = np.arange(width, dtype=np.float32).reshape(1, 1, width, 1)
    below = ctx.op("GreaterOrEqual", [ctx.builder.const(rows, f"{ctx.hint}_rows"),
                                      ctx.op("Reshape", [cells[0], ctx.ints([-1, 1, 1, 1])])])
    right = ctx.op("GreaterOrEqual", [ctx.builder.const(columns, f"{ctx.hint}_columns"),
                                      ctx.op("Reshape", [cells[1], ctx.ints([-1, 1, 1, 1])])])
    return ctx.op("Or", [below, right])


def _scored_boxes(ctx: NodeContext) -> tuple[str, str]:
    """(``(N, H*W*A, 4)`` boxes, ``(N, H*W*A)`` scores), cell-major, small boxes filtered."""
    _, channels, height, width = ctx.in_shapes[0]
    count = channels // 2
    deltas = ctx.op("Reshape", [ctx.inputs[1], ctx.ints([-1, count, 4, height, width])])
    deltas = ctx.op("Transpose", [deltas], perm=[0, 3, 4, 1, 2])
    boxes = _clip(ctx, _decode(ctx, deltas, height, width))
    scores = ctx.op("Transpose", [_part(ctx, ctx.inputs[0], count, channels, axis=1)],
                    perm=[0, 2, 3, 1])
    scores = ctx.op("Where", [_outside(ctx, height, width), ctx.scalar(-1.0), scores])
    boxes = ctx.op("Reshape", [boxes, ctx.ints([-1, height * width * count, 4])])
    scores = ctx.op("Reshape", [scores, ctx.ints([-1, height * width * count])])
    return _filter_small(ctx, boxes, scores)


def _filter_small(ctx: NodeContext, boxes: str, scores: str) -> tuple[str, str]:
    """Boxes narrower or lower than ``rpn_min_size * scale`` grow by it and score -1."""
    min_size = ctx.op("Mul", [_info(ctx, 2), ctx.scalar(float(ctx.params.rpn_min_size))])
    sides = ctx.op("Add", [ctx.op("Sub", [_part(ctx, boxes, 2, 4), _part(ctx, boxes, 0, 2)]),
                           ctx.scalar(1.0)])
    small = ctx.op("Less", [sides, ctx.unsqueeze(min_size, [-1])])
    small = ctx.op("Or", [_part(ctx, small, 0, 1), _part(ctx, small, 1, 2)])  # (N, n, 1)
    half = ctx.op("Div", [min_size, ctx.scalar(2.0)])
    grow = ctx.op("Mul", [ctx.builder.const(np.array([-1, -1, 1, 1], np.float32),
                                            f"{ctx.hint}_grow"), ctx.unsqueeze(half, [-1])])
    boxes = ctx.op("Where", [small, ctx.op("Add", [boxes, grow]), boxes])
    scores = ctx.op("Where", [ctx.squeeze(small, [-1]), ctx.scalar(-1.0), scores])
    return boxes, scores


def _suppresses(ctx: NodeContext, corners: str, picked: int) -> str:
    """``(N, picked, picked)``: candidate i removes a later j when their "+1" IoU > threshold."""
    left, right = ctx.unsqueeze(corners, [-2]), ctx.unsqueeze(corners, [-3])
    low = ctx.op("Max", [_part(ctx, left, 0, 2), _part(ctx, right, 0, 2)])
    high = ctx.op("Min", [_part(ctx, left, 2, 4), _part(ctx, right, 2, 4)])
    sides = ctx.op("Max", [ctx.op("Add", [ctx.op("Sub", [high, low]), ctx.scalar(1.0)]),
                           ctx.scalar(0.0)])
    inter = ctx.op("Mul", [_part(ctx, sides, 0, 1), _part(ctx, sides, 1, 2)])
    inter = ctx.squeeze(inter, [-1])
    edges = ctx.op("Add", [ctx.op("Sub", [_part(ctx, corners, 2, 4), _part(ctx, corners, 0, 2)]),
                           ctx.scalar(1.0)])
    area = ctx.squeeze(ctx.op("Mul", [_part(ctx, edges, 0, 1), _part(ctx, edges, 1, 2)]), [-1])
    union = ctx.op("Sub", [ctx.op("Add", [ctx.unsqueeze(area, [-1]),
                                          ctx.unsqueeze(area, [-2])]), inter])
    overlap = ctx.op("Div", [inter, union])
    hits = ctx.op("Greater", [overlap, ctx.scalar(float(ctx.params.threshold))])
    later = np.triu(np.ones((picked, picked), bool), 1)  # a box suppresses only later ones
    return ctx.op("And", [hits, ctx.builder.const(later, f"{ctx.hint}_later")])


def _cyclic_survivors(ctx: NodeContext, kept: str, picked: int) -> str:
    """``(N, post)`` candidate indices: the survivors in order, repeated cyclically."""
    rank = np.arange(picked, 0, -1, dtype=np.float32)  # earlier candidates first
    keys = ctx.op("Where", [kept, ctx.builder.const(rank, f"{ctx.hint}_rank"),
                            ctx.builder.const(np.float32(0), f"{ctx.hint}_zero")])
    _, order = ctx.op("TopK", [keys, ctx.ints([picked])], outputs=2, axis=1)
    survivors = ctx.op("ReduceSum", [ctx.cast(kept, np.int64), ctx.ints([1])], keepdims=1)
    slots = ctx.ints(np.arange(ctx.params.rpn_post_nms_top_n))
    # The first candidate always survives, so the count is at least one.
    return ctx.op("GatherElements", [order, ctx.op("Mod", [slots, survivors])], axis=1)


@converts("_contrib_Proposal", "_contrib_MultiProposal")
def proposal(ctx: NodeContext) -> str | list[str]:
    params = ctx.params
    boxes, scores = _scored_boxes(ctx)
    total = ctx.in_shapes[0][2] * ctx.in_shapes[0][3] * (ctx.in_shapes[0][1] // 2)
    top_n = params.rpn_pre_nms_top_n
    picked = total if top_n <= 0 else min(top_n, total)
    _, order = ctx.op("TopK", [scores, ctx.ints([picked])], outputs=2, axis=1)
    boxes = ctx.op("GatherND", [boxes, ctx.unsqueeze(order, [-1])], batch_dims=1)
    scores = ctx.op("GatherElements", [scores, order], axis=1)
    everyone = ctx.op("Expand", [ctx.builder.const(np.ones((1, picked), bool),
                                                   f"{ctx.hint}_alive"),
                                 ctx.op("Shape", [order])])
    kept = _greedy(ctx, _suppresses(ctx, boxes, picked), everyone, picked)
    picks = _cyclic_survivors(ctx, kept, picked)
    boxes = ctx.op("GatherND", [boxes, ctx.unsqueeze(picks, [-1])], batch_dims=1)
    scores = ctx.op("GatherElements", [scores, picks], axis=1)
    rois = ctx.op("Concat", [_batch_column(ctx, picks), boxes], axis=-1)
    rois = ctx.op("Reshape", [rois, ctx.ints([-1, 5])])
    if not params.output_score:
        return rois
    return [rois, ctx.op("Reshape", [scores, ctx.ints([-1, 1])])]


def _batch_column(ctx: NodeContext, picks: str) -> str:
    """``(N, post, 1)``: each row's image index, in the input's dtype."""
    shape = ctx.op("Shape", [picks])
    batch = ctx.op("Squeeze", [_part(ctx, shape, 0, 1, axis=0), ctx.ints([0])])
    index = ctx.op("Range", [ctx.builder.const(np.int64(0), f"{ctx.hint}_start"), batch,
                             ctx.builder.const(np.int64(1), f"{ctx.hint}_step")])
    index = ctx.cast(ctx.op("Reshape", [index, ctx.ints([-1, 1, 1])]), ctx.in_dtypes[0])
    return ctx.op("Expand", [index, ctx.op("Concat", [shape, ctx.ints([1])], axis=0)])
