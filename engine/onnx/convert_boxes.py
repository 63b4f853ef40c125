"""Converters for the detection box ops: ``box_decode``, ``box_iou`` and ``box_nms``.

``box_nms`` is written as MXNet computes it rather than with ONNX's NonMaxSuppression (which
has no class ids in the data, no candidate limit and a different output): the best ``topk``
valid records are sorted stably by score, their pairwise IoU is computed once, and a Loop
over the candidates applies the greedy suppression. Survivors come first, the rest is -1.
"""

from __future__ import annotations

import numpy as np

from engine.onnx.context import NodeContext, converts


def _part(ctx: NodeContext, data: str, start: int, stop: int, axis: int = -1) -> str:
    return ctx.op("Slice", [data, ctx.ints([start]), ctx.ints([stop]), ctx.ints([axis])])


def _to_corner(ctx: NodeContext, boxes: str) -> str:
    centre, half = _part(ctx, boxes, 0, 2), ctx.op("Div", [_part(ctx, boxes, 2, 4),
                                                            ctx.scalar(2.0)])
    return ctx.op("Concat", [ctx.op("Sub", [centre, half]), ctx.op("Add", [centre, half])],
                  axis=-1)


def _to_center(ctx: NodeContext, boxes: str) -> str:
    low = _part(ctx, boxes, 0, 2)
    size = ctx.op("Sub", [_part(ctx, boxes, 2, 4), low])
    centre = ctx.op("Add", [low, ctx.op("Div", [size, ctx.scalar(2.0)])])
    return ctx.op("Concat", [centre, size], axis=-1)


@converts("_contrib_box_decode")
def box_decode(ctx: NodeContext) -> str:
    params, data = ctx.params, ctx.inputs[0]
    anchors = ctx.inputs[1] if params.format == "center" else _to_center(ctx, ctx.inputs[1])
    stds = [ctx.scalar(params[f"std{k}"]) for k in range(4)]
    offset = [ctx.op("Mul", [_part(ctx, data, k, k + 1), stds[k]]) for k in range(4)]
    centre = [ctx.op("Add", [ctx.op("Mul", [offset[k], _part(ctx, anchors, k + 2, k + 3)]),
                             _part(ctx, anchors, k, k + 1)]) for k in range(2)]
    logs = offset[2:]
    if params.clip > 0:
        logs = [ctx.op("Min", [log, ctx.scalar(params.clip)]) for log in logs]
    half = [ctx.op("Div", [ctx.op("Mul", [ctx.op("Exp", [log]), _part(ctx, anchors, k + 2,
                                                                       k + 3)]),
                           ctx.scalar(2.0)]) for k, log in enumerate(logs)]
    return ctx.op("Concat", [ctx.op("Sub", [centre[0], half[0]]),
                             ctx.op("Sub", [centre[1], half[1]]),
                             ctx.op("Add", [centre[0], half[0]]),
                             ctx.op("Add", [centre[1], half[1]])], axis=-1)


def _areas(ctx: NodeContext, corners: str) -> str:
    sides = ctx.op("Sub", [_part(ctx, corners, 2, 4), _part(ctx, corners, 0, 2)])
    return ctx.reduce("ReduceProd", ctx.op("Relu", [sides]), [-1], False)


def pairwise_iou(ctx: NodeContext, lhs: str, rhs: str) -> str:
    """IoU of every corner box of ``lhs (..., n, 4)`` with every one of ``rhs (..., m, 4)``."""
    left, right = ctx.unsqueeze(lhs, [-2]), ctx.unsqueeze(rhs, [-3])
    low = ctx.op("Max", [_part(ctx, left, 0, 2), _part(ctx, right, 0, 2)])
    high = ctx.op("Min", [_part(ctx, left, 2, 4), _part(ctx, right, 2, 4)])
    overlap = ctx.reduce("ReduceProd", ctx.op("Relu", [ctx.op("Sub", [high, low])]), [-1],
                         False)
    union = ctx.op("Sub", [ctx.op("Add", [ctx.unsqueeze(_areas(ctx, lhs), [-1]),
                                          ctx.unsqueeze(_areas(ctx, rhs), [-2])]), overlap])
    positive = ctx.op("Greater", [union, ctx.scalar(0.0)])
    safe = ctx.op("Where", [positive, union, ctx.scalar(1.0)])
    return ctx.op("Where", [positive, ctx.op("Div", [overlap, safe]), ctx.scalar(0.0)])


@converts("_contrib_box_iou")
def box_iou(ctx: NodeContext) -> str:
    flat = [ctx.op("Reshape", [boxes, ctx.ints([-1, 4])]) for boxes in ctx.inputs[:2]]
    if ctx.params.format == "center":
        flat = [_to_corner(ctx, boxes) for boxes in flat]
    return ctx.op("Reshape", [pairwise_iou(ctx, *flat), ctx.out_shape_tensor(0)])


@converts("_contrib_box_nms")
def box_nms(ctx: NodeContext) -> str:
    params = ctx.params
    count, width = ctx.in_shapes[0][-2:]
    records = ctx.op("Reshape", [ctx.inputs[0], ctx.ints([-1, count, width])])
    picked = count if params.topk <= 0 else min(int(params.topk), count)
    order, alive = _candidates(ctx, records, picked)
    rows = ctx.op("GatherND", [records, ctx.unsqueeze(order, [-1])], batch_dims=1)
    coords = _part(ctx, rows, params.coord_start, params.coord_start + 4)
    corners = _to_corner(ctx, coords) if params.in_format == "center" else coords
    suppresses = ctx.op("Greater", [pairwise_iou(ctx, corners, corners),
                                    ctx.scalar(params.overlap_thresh)])
    if params.id_index >= 0 and not params.force_suppress:
        classes = _part(ctx, rows, params.id_index, params.id_index + 1)
        same = ctx.op("Equal", [classes, ctx.op("Transpose", [classes], perm=[0, 2, 1])])
        suppresses = ctx.op("And", [suppresses, same])
    later = np.triu(np.ones((picked, picked), bool), 1)  # a box suppresses only later ones
    suppresses = ctx.op("And", [suppresses, ctx.builder.const(later, f"{ctx.hint}_later")])
    kept = _greedy(ctx, suppresses, alive, picked)
    if params.in_format != params.out_format:
        converted = (_to_center if params.out_format == "center" else _to_corner)(ctx, coords)
        rows = ctx.op("Concat", [_part(ctx, rows, 0, params.coord_start), converted,
                                 _part(ctx, rows, params.coord_start + 4, width)], axis=-1)
    result = _survivors_first(ctx, rows, kept, picked)
    if picked < count:
        result = ctx.op("Pad", [result, ctx.ints([0, 0, 0, 0, count - picked, 0]),
                                ctx.scalar(-1.0)])
    return ctx.op("Reshape", [result, ctx.op("Shape", [ctx.inputs[0]])])


def _candidates(ctx: NodeContext, records: str, picked: int) -> tuple[str, str]:
    """(indices of the best ``picked`` records by score, stably; whether each is valid)."""
    params = ctx.params
    scores = _part(ctx, records, params.score_index, params.score_index + 1)
    valid = ctx.op("Greater", [scores, ctx.scalar(params.valid_thresh)])
    if params.id_index >= 0 and params.background_id >= 0:
        classes = _part(ctx, records, params.id_index, params.id_index + 1)
        background = ctx.op("Equal", [classes, ctx.scalar(params.background_id)])
        valid = ctx.op("And", [valid, ctx.op("Not", [background])])
    # Invalid records sort last; TopK breaks ties by the lower index, as a stable sort does.
    keys = ctx.op("Where", [valid, scores, ctx.scalar(-np.inf)])
    _, order = ctx.op("TopK", [ctx.squeeze(keys, [2]), ctx.ints([picked])], outputs=2, axis=1)
    alive = ctx.op("GatherElements", [ctx.squeeze(valid, [2]), order], axis=1)
    return order, alive


def _greedy(ctx: NodeContext, suppresses: str, alive: str, picked: int) -> str:
    """A Loop over the score-ordered candidates: each survivor removes what it suppresses."""
    from onnx import TensorProto, helper

    unique = ctx.builder.unique
    step, cond, state = unique("nms_step"), unique("nms_cond"), unique("nms_alive")
    row, own, hit = unique("nms_row"), unique("nms_own"), unique("nms_hit")
    axes, own_column, next_state = unique("nms_axes"), unique("nms_own_column"), unique("nms_next")
    cond_out = unique("nms_cond_out")
    body_nodes = [
        helper.make_node("Gather", [suppresses, step], [row], axis=1),
        helper.make_node("Gather", [state, step], [own], axis=1),
        helper.make_node("Constant", [], [axes], value=helper.make_tensor(
            "axes", TensorProto.INT64, [1], [1])),
        helper.make_node("Unsqueeze", [own, axes], [own_column]),
        helper.make_node("And", [row, own_column], [hit]),
        helper.make_node("Not", [hit], [hit + "_not"]),
        helper.make_node("And", [state, hit + "_not"], [next_state]),
        helper.make_node("Identity", [cond], [cond_out]),
    ]
    body = helper.make_graph(
        body_nodes, unique("nms_body"),
        [helper.make_tensor_value_info(step, TensorProto.INT64, []),
         helper.make_tensor_value_info(cond, TensorProto.BOOL, []),
         helper.make_tensor_value_info(state, TensorProto.BOOL, [None, picked])],
        [helper.make_tensor_value_info(cond_out, TensorProto.BOOL, []),
         helper.make_tensor_value_info(next_state, TensorProto.BOOL, [None, picked])])
    trips = ctx.builder.const(np.int64(picked), f"{ctx.hint}_trips")
    return ctx.op("Loop", [trips, "", alive], body=body)


def _survivors_first(ctx: NodeContext, rows: str, kept: str, picked: int) -> str:
    """The kept rows in their (score) order, then -1 rows."""
    rank = np.arange(picked, 0, -1, dtype=np.float32)  # earlier candidates first
    keys = ctx.op("Where", [kept, ctx.builder.const(rank, f"{ctx.hint}_rank"),
                            ctx.builder.const(np.float32(0), f"{ctx.hint}_zero")])
    _, order = ctx.op("TopK", [keys, ctx.ints([picked])], outputs=2, axis=1)
    ordered = ctx.op("GatherND", [rows, ctx.unsqueeze(order, [-1])], batch_dims=1)
    survives = ctx.unsqueeze(ctx.op("GatherElements", [kept, order], axis=1), [-1])
    return ctx.op("Where", [survives, ordered, ctx.scalar(-1.0)])


@converts("_contrib_box_encode")
def box_encode(ctx: NodeContext) -> list[str]:
    samples, matches, anchors, refs, means, stds = ctx.inputs[:6]
    shape = ctx.out_shape_tensor(0)  # (batch, anchors, 4)
    index = ctx.op("Expand", [ctx.unsqueeze(ctx.cast(matches, np.int64), [-1]), shape])
    matched = _to_center(ctx, ctx.op("GatherElements", [refs, index], axis=1))
    anchor = _to_center(ctx, anchors)
    sizes = _part(ctx, anchor, 2, 4)
    offsets = ctx.op("Div", [ctx.op("Sub", [_part(ctx, matched, 0, 2), _part(ctx, anchor, 0, 2)]),
                             sizes])
    scales = ctx.op("Log", [ctx.op("Div", [_part(ctx, matched, 2, 4), sizes])])
    targets = ctx.op("Div", [ctx.op("Sub", [ctx.op("Concat", [offsets, scales], axis=-1), means]),
                             stds])
    positive = ctx.unsqueeze(ctx.op("Greater", [samples, ctx.scalar(0.5)]), [-1])
    dtype = ctx.out_dtypes[0]
    zero = ctx.builder.const(np.asarray(0, dtype), f"{ctx.hint}_zero")
    masks = ctx.cast(ctx.op("Expand", [positive, shape]), dtype)
    return [ctx.op("Where", [positive, targets, zero]), masks]
