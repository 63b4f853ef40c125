"""Converters for shape, slicing, joining, indexing and creation ops."""

from __future__ import annotations

import numpy as np

from engine.onnx.context import NodeContext, converts, normalize_axis

INT_MAX = np.iinfo(np.int64).max
IDENTITY = ("Dropout",)
CREATION = {"_zeros": 0.0, "_ones": 1.0, "_full": None, "_npi_zeros": 0.0, "_npi_ones": 1.0,
            "_npi_full": None}


@converts(*IDENTITY)
def identity(ctx: NodeContext) -> str:
    return ctx.op("Identity", [ctx.inputs[0]])  # inference: Dropout passes data through


@converts("Reshape", "_np_reshape", "_npx_reshape", "expand_dims", "squeeze")
def reshape(ctx: NodeContext) -> str:
    # MXNet's special codes (0, -1, -2, -3, -4, reverse) are resolved by shape inference: the
    # target is the inferred output shape, with the batch-following dimension left as -1.
    if ctx.params.get("order", "C") != "C":
        raise ctx.fail("only C order is supported")
    return ctx.op("Reshape", [ctx.inputs[0], ctx.out_shape_tensor(0, infer_one=True)])


@converts("Flatten")
def flatten(ctx: NodeContext) -> str:
    return ctx.op("Flatten", [ctx.inputs[0]], axis=1)


@converts("Cast", "amp_cast")
def cast(ctx: NodeContext) -> str:
    return ctx.cast(ctx.inputs[0], ctx.params.dtype)


@converts("transpose")
def transpose(ctx: NodeContext) -> str:
    axes = ctx.params.axes or tuple(reversed(range(ctx.rank())))
    return ctx.op("Transpose", [ctx.inputs[0]],
                  perm=[normalize_axis(a, ctx.rank()) for a in axes])


@converts("SwapAxis")
def swap_axis(ctx: NodeContext) -> str:
    perm = list(range(ctx.rank()))
    first, second = (normalize_axis(a, ctx.rank()) for a in (ctx.params.dim1, ctx.params.dim2))
    perm[first], perm[second] = perm[second], perm[first]
    return ctx.op("Transpose", [ctx.inputs[0]], perm=perm)


def _slice(ctx: NodeContext, data: str, starts: list, ends: list, axes: list,
           steps: list | None = None) -> str:
    inputs = [data, ctx.ints(starts), ctx.ints(ends), ctx.ints(axes)]
    return ctx.op("Slice", inputs + ([ctx.ints(steps)] if steps else []))


@converts("slice_axis")
def slice_axis(ctx: NodeContext) -> str:
    params = ctx.params
    end = INT_MAX if params.end is None else params.end
    return _slice(ctx, ctx.inputs[0], [params.begin], [end],
                  [normalize_axis(params.axis, ctx.rank())])


@converts("slice")
def slice_(ctx: NodeContext) -> str:
    params = ctx.params
    count = len(params.begin)
    steps = [1 if s is None else s for s in (params.step or (None,) * count)]
    starts = [(0 if step > 0 else -1) if b is None else b for b, step in zip(params.begin, steps)]
    ends = [(INT_MAX if step > 0 else -INT_MAX) if e is None else e
            for e, step in zip(params.end, steps)]
    return _slice(ctx, ctx.inputs[0], starts, ends, list(range(count)), steps)


@converts("SliceChannel")
def slice_channel(ctx: NodeContext) -> list[str]:
    params = ctx.params
    axis = normalize_axis(params.axis, ctx.rank())
    count = int(params.num_outputs)
    sizes = ctx.ints([ctx.static_dim(0, axis) // count] * count)
    parts = ctx.op("Split", [ctx.inputs[0], sizes], outputs=count, axis=axis)
    parts = parts if count > 1 else [parts]
    if params.squeeze_axis:
        parts = [ctx.squeeze(part, [axis]) for part in parts]
    return parts


@converts("Concat", "_rnn_param_concat")
def concat(ctx: NodeContext) -> str:
    return ctx.op("Concat", ctx.inputs, axis=normalize_axis(ctx.params.dim, ctx.rank()))


@converts("stack")
def stack(ctx: NodeContext) -> str:
    axis = normalize_axis(ctx.params.axis, ctx.rank() + 1)
    return ctx.op("Concat", [ctx.unsqueeze(name, [axis]) for name in ctx.inputs], axis=axis)


@converts("Embedding")
def embedding(ctx: NodeContext) -> str:
    indices = _clipped(ctx, ctx.cast(ctx.inputs[0], np.int64), ctx.in_shapes[1][0])
    return ctx.op("Gather", [ctx.inputs[1], indices], axis=0)


def _clipped(ctx: NodeContext, indices: str, size: int) -> str:
    # MXNet clips out-of-range indices; ONNX Gather would fail on them.
    return ctx.op("Clip", [indices, ctx.builder.const(np.int64(0), "zero"),
                           ctx.builder.const(np.int64(size - 1), "last")])


@converts("take")
def take(ctx: NodeContext) -> str:
    axis = normalize_axis(ctx.params.axis, ctx.rank())
    size = ctx.static_dim(0, axis)
    indices = ctx.cast(ctx.inputs[1], np.int64)
    if ctx.params.mode == "wrap":
        indices = ctx.op("Mod", [indices, ctx.ints([size])])
    else:  # clip (and raise, which cannot raise at inference)
        indices = _clipped(ctx, indices, size)
    return ctx.op("Gather", [ctx.inputs[0], indices], axis=axis)


@converts("one_hot")
def one_hot(ctx: NodeContext) -> str:
    params = ctx.params
    values = ctx.builder.const(np.asarray([params.off_value, params.on_value], params.dtype),
                               f"{ctx.hint}_values")
    indices = ctx.cast(ctx.inputs[0], np.int64)
    encoded = ctx.op("OneHot", [indices, ctx.ints([params.depth]), values], axis=-1)
    return encoded


@converts("topk")
def topk(ctx: NodeContext) -> str | list[str]:
    params = ctx.params
    axis = normalize_axis(params.axis, ctx.rank())
    if params.ret_typ == "mask":
        raise ctx.fail("ret_typ='mask' is not supported")
    values, indices = ctx.op("TopK", [ctx.inputs[0], ctx.ints([params.k])], outputs=2,
                             axis=axis, largest=int(not params.is_ascend))
    indices = ctx.cast(indices, params.dtype)
    return {"value": values, "indices": indices, "both": [values, indices]}[params.ret_typ]


@converts("sort")
def sort(ctx: NodeContext) -> str:
    axis = normalize_axis(ctx.params.axis, ctx.rank())
    values, _ = ctx.op("TopK", [ctx.inputs[0], ctx.ints([ctx.static_dim(0, axis)])], outputs=2,
                       axis=axis, largest=int(not ctx.params.is_ascend))
    return values


@converts("tile")
def tile(ctx: NodeContext) -> str:
    reps, data, rank = list(ctx.params.reps), ctx.inputs[0], ctx.rank()
    if len(reps) > rank:  # MXNet prepends 1s to the data's shape
        data = ctx.unsqueeze(data, list(range(len(reps) - rank)))
    reps = [1] * (rank - len(reps)) + reps
    return ctx.op("Tile", [data, ctx.ints(reps)])


@converts("repeat")
def repeat(ctx: NodeContext) -> str:
    data, axis = ctx.inputs[0], ctx.params.axis
    if axis is None:
        data, axis = ctx.op("Reshape", [data, ctx.ints([-1])]), 0
    axis = normalize_axis(axis, ctx.rank() if ctx.params.axis is not None else 1)
    rank = ctx.rank() if ctx.params.axis is not None else 1
    # Each element gets a new axis after ``axis``, tiled ``repeats`` times, then merged back.
    spread = ctx.unsqueeze(data, [axis + 1])
    reps = [1] * (rank + 1)
    reps[axis + 1] = int(ctx.params.repeats)
    tiled = ctx.op("Tile", [spread, ctx.ints(reps)])
    return ctx.op("Reshape", [tiled, ctx.out_shape_tensor(0, infer_one=True)])


@converts("broadcast_to", "broadcast_axis")
def broadcast_to(ctx: NodeContext) -> str:
    return ctx.op("Expand", [ctx.inputs[0], ctx.out_shape_tensor(0)])


@converts("broadcast_like")
def broadcast_like(ctx: NodeContext) -> str:
    if ctx.params.lhs_axes is not None or ctx.params.rhs_axes is not None:
        return ctx.op("Expand", [ctx.inputs[0], ctx.out_shape_tensor(0)])
    return ctx.op("Expand", [ctx.inputs[0], ctx.op("Shape", [ctx.inputs[1]])])


@converts("Pad")
def pad(ctx: NodeContext) -> str:
    widths = list(ctx.params.pad_width)
    pads = widths[0::2] + widths[1::2]
    inputs = [ctx.inputs[0], ctx.ints(pads)]
    if ctx.params.mode == "constant":
        inputs.append(ctx.scalar(ctx.params.constant_value))
    return ctx.op("Pad", inputs, mode=ctx.params.mode)


def _fill(ctx: NodeContext, shape: str, value: float, dtype: np.dtype) -> str:
    from onnx import helper

    fill = helper.make_tensor("value", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [1],
                              [value])
    return ctx.op("ConstantOfShape", [shape], value=fill)


@converts("zeros_like", "ones_like", "_npi_full_like")
def full_like(ctx: NodeContext) -> str:
    value = {"zeros_like": 0.0, "ones_like": 1.0}.get(ctx.op_name)
    value = ctx.params.fill_value if value is None else value
    return _fill(ctx, ctx.op("Shape", [ctx.inputs[0]]), value, ctx.out_dtypes[0])


@converts(*CREATION)
def creation(ctx: NodeContext) -> str:
    # Only creation ops whose shape follows the batch reach here; the rest are folded.
    value = CREATION[ctx.op_name]
    value = ctx.params.value if value is None else value
    return _fill(ctx, ctx.out_shape_tensor(0), value, ctx.params.dtype)


@converts("UpSampling")
def upsampling(ctx: NodeContext) -> str:
    scale = int(ctx.params.scale)
    if ctx.params.sample_type == "bilinear":
        # MXNet's bilinear UpSampling is a depthwise deconvolution with the given weight.
        size, pad = 2 * scale - scale % 2, scale // 2
        return ctx.op("ConvTranspose", ctx.inputs[:2], group=ctx.in_shapes[0][1],
                      kernel_shape=[size, size], strides=[scale, scale], pads=[pad] * 4)
    height, width = ctx.out_shapes[0][2:]
    scaled = [_nearest(ctx, name, height / shape[2], width / shape[3])
              for name, shape in zip(ctx.inputs, ctx.in_shapes)]
    if len(scaled) == 1:
        return scaled[0]
    if ctx.params.multi_input_mode == "sum":
        return ctx.op("Sum", scaled)
    return ctx.op("Concat", scaled, axis=1)


def _nearest(ctx: NodeContext, data: str, height_scale: float, width_scale: float) -> str:
    scales = ctx.builder.const(np.asarray([1, 1, height_scale, width_scale], np.float32),
                               "scales")
    return ctx.op("Resize", [data, "", scales], mode="nearest", nearest_mode="floor",
                  coordinate_transformation_mode="asymmetric")


@converts("_contrib_BilinearResize2D")
def bilinear_resize(ctx: NodeContext) -> str:
    if not ctx.params.align_corners:
        raise ctx.fail("align_corners=False is not supported")
    sizes = ctx.out_shape_tensor(0)
    return ctx.op("Resize", [ctx.inputs[0], "", "", sizes], mode="linear",
                  coordinate_transformation_mode="align_corners")


@converts("SequenceLast", "SequenceMask", "SequenceReverse")
def sequence(ctx: NodeContext) -> str:
    data, axis = ctx.inputs[0], normalize_axis(ctx.params.axis, ctx.rank())
    if ctx.params.use_sequence_length:
        return SEQUENCE_WITH_LENGTHS[ctx.op_name](ctx, axis)
    if ctx.op_name == "SequenceMask":
        return ctx.op("Identity", [data])  # no lengths: nothing is masked
    if ctx.op_name == "SequenceReverse":
        return _slice(ctx, data, [-1], [-INT_MAX], [axis], [-1])
    return ctx.op("Gather", [data, ctx.builder.const(np.int64(-1), "last")], axis=axis)


def _lengths(ctx: NodeContext, axis: int, minus_one: bool = False) -> str:
    """The lengths as int64 shaped to broadcast against the data (batch is the other of 0, 1)."""
    lengths = ctx.cast(ctx.inputs[1], np.int64)
    if minus_one:
        lengths = ctx.op("Sub", [lengths, ctx.ints([1])])
    shape = [1] * ctx.rank()
    shape[1 - axis] = -1
    return ctx.op("Reshape", [lengths, ctx.ints(shape)])


def _sequence_mask(ctx: NodeContext, axis: int) -> str:
    steps = np.arange(ctx.static_dim(0, axis), dtype=np.int64)
    shape = [1] * ctx.rank()
    shape[axis] = -1
    steps_name = ctx.builder.const(steps.reshape(shape), f"{ctx.hint}_steps")
    keep = ctx.op("Less", [steps_name, _lengths(ctx, axis)])
    return ctx.op("Where", [keep, ctx.inputs[0], ctx.scalar(ctx.params.value)])


def _sequence_last(ctx: NodeContext, axis: int) -> str:
    shape, other = list(ctx.in_shapes[0]), ctx.in_other[0]
    shape[axis] = 1
    other = None if other is None else tuple(1 if k == axis else d for k, d in enumerate(other))
    target = ctx.builder.shape_tensor(tuple(shape), other, ctx.hint)
    index = ctx.op("Expand", [_lengths(ctx, axis, minus_one=True), target])
    picked = ctx.op("GatherElements", [ctx.inputs[0], index], axis=axis)
    return ctx.squeeze(picked, [axis])


def _sequence_reverse(ctx: NodeContext, axis: int) -> str:
    return ctx.op("ReverseSequence", [ctx.inputs[0], ctx.cast(ctx.inputs[1], np.int64)],
                  batch_axis=1 - axis, time_axis=axis)


SEQUENCE_WITH_LENGTHS = {"SequenceLast": _sequence_last, "SequenceMask": _sequence_mask,
                         "SequenceReverse": _sequence_reverse}


@converts("depth_to_space", "space_to_depth")
def depth_space(ctx: NodeContext) -> str:
    if ctx.op_name == "depth_to_space":  # MXNet's channel order is ONNX's DCR mode
        return ctx.op("DepthToSpace", [ctx.inputs[0]], blocksize=int(ctx.params.block_size),
                      mode="DCR")
    return ctx.op("SpaceToDepth", [ctx.inputs[0]], blocksize=int(ctx.params.block_size))


@converts("reverse")
def reverse(ctx: NodeContext) -> str:
    axis = ctx.params.axis
    axes = [normalize_axis(a, ctx.rank()) for a in (axis if isinstance(axis, tuple) else (axis,))]
    count = len(axes)
    return _slice(ctx, ctx.inputs[0], [-1] * count, [-INT_MAX] * count, axes, [-1] * count)


@converts("argsort")
def argsort(ctx: NodeContext) -> str:
    axis = normalize_axis(ctx.params.axis, ctx.rank())
    _, indices = ctx.op("TopK", [ctx.inputs[0], ctx.ints([ctx.static_dim(0, axis)])], outputs=2,
                        axis=axis, largest=int(not ctx.params.is_ascend))
    return ctx.cast(indices, ctx.params.dtype)


@converts("pick")
def pick(ctx: NodeContext) -> str:
    params, rank = ctx.params, ctx.rank()
    axis = normalize_axis(params.axis, rank)
    index = ctx.cast(ctx.inputs[1], np.int64)
    size = ctx.static_dim(0, axis)
    if params.mode == "wrap":
        index = ctx.op("Mod", [index, ctx.ints([size])])
    else:
        index = _clipped(ctx, index, size)
    if ctx.rank(1) < rank:  # the index lacks the picked axis
        index = ctx.unsqueeze(index, [axis])
    picked = ctx.op("GatherElements", [ctx.inputs[0], index], axis=axis)
    return picked if params.keepdims else ctx.squeeze(picked, [axis])


@converts("slice_like")
def slice_like(ctx: NodeContext) -> str:
    rank = ctx.rank()
    ends = ctx.out_shape_tensor(0)
    return ctx.op("Slice", [ctx.inputs[0], ctx.ints([0] * rank), ends,
                            ctx.ints(list(range(rank)))])


@converts("shape_array")
def shape_array(ctx: NodeContext) -> str:
    return ctx.op("Shape", [ctx.inputs[0]])


@converts("size_array")
def size_array(ctx: NodeContext) -> str:
    return ctx.op("Reshape", [ctx.op("Size", [ctx.inputs[0]]), ctx.ints([1])])
