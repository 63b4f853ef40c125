"""Converters for legacy (v1) layers, adaptive pooling, ROI ops, crops, samplers and image ops."""

from __future__ import annotations

import numpy as np

from engine.onnx.context import NodeContext, converts
from engine.onnx.convert_nn import batch_norm, convolution, pooling
from engine.onnx.convert_tensor import INT_MAX
from engine.ops.nn.adaptive_pool import averaging_matrix


@converts("Convolution_v1")
def convolution_v1(ctx: NodeContext) -> str:
    return convolution(ctx)  # the same attributes as Convolution


@converts("Pooling_v1")
def pooling_v1(ctx: NodeContext) -> str:
    return pooling(ctx)


@converts("BatchNorm_v1", "_contrib_SyncBatchNorm")
def batch_norm_variant(ctx: NodeContext) -> str | list[str]:
    return batch_norm(ctx)  # inference: per-device statistics do not apply


@converts("_contrib_BatchNormWithReLU")
def batch_norm_relu(ctx: NodeContext) -> str:
    normalized = batch_norm(ctx)
    return ctx.op("Relu", [normalized if isinstance(normalized, str) else normalized[0]])


@converts("_contrib_AdaptiveAvgPooling2D")
def adaptive_avg_pooling(ctx: NodeContext) -> str:
    # Both paths bake the input's height and width in, so they must not follow the batch.
    height, width = ctx.static_dim(0, 2), ctx.static_dim(0, 3)
    out_height, out_width = ctx.out_shapes[0][2:]
    if height % out_height == 0 and width % out_width == 0:
        kernel = [height // out_height, width // out_width]
        return ctx.op("AveragePool", [ctx.inputs[0]], kernel_shape=kernel, strides=kernel)
    # Uneven, overlapping bins: rows @ data @ cols.T, the engine kernel's own formulation.
    dtype = ctx.in_dtypes[0]
    rows = ctx.builder.const(averaging_matrix(height, out_height, dtype), f"{ctx.hint}_rows")
    cols = ctx.builder.const(averaging_matrix(width, out_width, dtype).T, f"{ctx.hint}_cols")
    return ctx.op("MatMul", [ctx.op("MatMul", [rows, ctx.inputs[0]]), cols])


@converts("_contrib_ROIAlign")
def roi_align(ctx: NodeContext) -> str:
    params = ctx.params
    if params.position_sensitive:
        raise ctx.fail("position_sensitive=True has no ONNX RoiAlign equivalent")
    rois = ctx.inputs[1]
    batch = ctx.squeeze(ctx.cast(_columns(ctx, rois, 0, 1), np.int64), [1])
    # aligned=True shifts by half a pixel (ONNX half_pixel); False keeps MXNet's legacy
    # coordinates, with ROI sizes of at least one pixel (ONNX output_half_pixel).
    mode = "half_pixel" if params.aligned else "output_half_pixel"
    height, width = (int(size) for size in params.pooled_size)
    return ctx.op("RoiAlign", [ctx.inputs[0], _columns(ctx, rois, 1, 5), batch], mode="avg",
                  output_height=height, output_width=width,
                  sampling_ratio=max(int(params.sample_ratio), 0),
                  spatial_scale=float(params.spatial_scale),
                  coordinate_transformation_mode=mode)


def _columns(ctx: NodeContext, data: str, start: int, stop: int) -> str:
    return ctx.op("Slice", [data, ctx.ints([start]), ctx.ints([stop]), ctx.ints([1])])


@converts("ROIPooling")
def roi_pooling(ctx: NodeContext) -> str:
    return ctx.op("MaxRoiPool", ctx.inputs[:2],
                  pooled_shape=[int(size) for size in ctx.params.pooled_size],
                  spatial_scale=float(ctx.params.spatial_scale))


@converts("Crop")
def crop(ctx: NodeContext) -> str:
    sizes = ctx.out_shapes[0][2:]
    if ctx.params.center_crop:
        starts = [(whole - size) // 2 for whole, size in zip(ctx.in_shapes[0][2:], sizes)]
    else:
        starts = [int(offset) for offset in ctx.params.offset]
    ends = [start + size for start, size in zip(starts, sizes)]
    return ctx.op("Slice", [ctx.inputs[0], ctx.ints(starts), ctx.ints(ends), ctx.ints([2, 3])])


def _by_kernel(ctx: NodeContext, *inputs: np.ndarray) -> np.ndarray:
    """The op's own kernel run on export-time arrays (for outputs fixed by shapes alone)."""
    return np.asarray(ctx.node.opdef.kernel(np, ctx.params, *inputs))


@converts("_contrib_MultiBoxPrior")
def multibox_prior(ctx: NodeContext) -> str:
    # The anchors depend only on the feature map's size, which the export fixes.
    anchors = _by_kernel(ctx, np.zeros(ctx.in_shapes[0], ctx.in_dtypes[0]))
    return ctx.op("Identity", [ctx.builder.const(anchors, f"{ctx.hint}_anchors")])


@converts("BilinearSampler")
def bilinear_sampler(ctx: NodeContext) -> str:
    return _sample(ctx, ctx.inputs[0], ctx.inputs[1])


def _sample(ctx: NodeContext, data: str, grid: str) -> str:
    # MXNet's grid is (N, 2, h, w) in [-1, 1] with the corners at -1 and 1, zero outside.
    mode = "linear" if ctx.builder.opset >= 20 else "bilinear"
    return ctx.op("GridSample", [data, ctx.op("Transpose", [grid], perm=[0, 2, 3, 1])],
                  mode=mode, padding_mode="zeros", align_corners=1)


def _affine_grid(ctx: NodeContext, theta: str, height: int, width: int) -> str:
    ys, xs = np.meshgrid(np.linspace(-1, 1, height), np.linspace(-1, 1, width), indexing="ij")
    target = np.stack([xs.ravel(), ys.ravel(), np.ones(xs.size)]).astype(ctx.in_dtypes[0])
    source = ctx.op("MatMul", [ctx.op("Reshape", [theta, ctx.ints([-1, 2, 3])]),
                               ctx.builder.const(target, f"{ctx.hint}_target")])
    return ctx.op("Reshape", [source, ctx.ints([-1, 2, height, width])])


@converts("GridGenerator")
def grid_generator(ctx: NodeContext) -> str:
    height, width = ctx.out_shapes[0][2:]
    if ctx.params.transform_type == "affine":
        return _affine_grid(ctx, ctx.inputs[0], height, width)
    ys, xs = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    dtype = ctx.in_dtypes[0]
    base = ctx.builder.const(np.stack([xs, ys]).astype(dtype), f"{ctx.hint}_base")
    scale = ctx.builder.const(np.array([(width - 1) / 2, (height - 1) / 2], dtype).reshape(
        2, 1, 1), f"{ctx.hint}_scale")
    moved = ctx.op("Div", [ctx.op("Add", [base, ctx.inputs[0]]), scale])
    return ctx.op("Sub", [moved, ctx.scalar(1.0)])


@converts("SpatialTransformer")
def spatial_transformer(ctx: NodeContext) -> str:
    height, width = ctx.out_shapes[0][2:]
    return _sample(ctx, ctx.inputs[0], _affine_grid(ctx, ctx.inputs[1], height, width))


@converts("_image_to_tensor")
def image_to_tensor(ctx: NodeContext) -> str:
    rank = ctx.rank()
    scaled = ctx.op("Div", [ctx.cast(ctx.inputs[0], np.float32),
                            ctx.builder.const(np.float32(255.0), "full_scale")])
    perm = [2, 0, 1] if rank == 3 else [0, 3, 1, 2]
    return ctx.op("Transpose", [scaled], perm=perm)


@converts("_image_normalize")
def image_normalize(ctx: NodeContext) -> str:
    channels = ctx.in_shapes[0][-3]
    shape = (channels, 1, 1)

    def per_channel(values: tuple, hint: str) -> str:
        array = np.asarray(values, ctx.in_dtypes[0])
        array = np.broadcast_to(array, (channels,)) if array.size == 1 else array[:channels]
        return ctx.builder.const(array.reshape(shape), f"{ctx.hint}_{hint}")

    centred = ctx.op("Sub", [ctx.inputs[0], per_channel(ctx.params.mean, "mean")])
    return ctx.op("Div", [centred, per_channel(ctx.params.std, "std")])


@converts("_image_flip_left_right", "_image_flip_top_bottom")
def image_flip(ctx: NodeContext) -> str:
    axis = ctx.rank() - (2 if ctx.op_name == "_image_flip_left_right" else 3)
    return ctx.op("Slice", [ctx.inputs[0], ctx.ints([-1]), ctx.ints([-INT_MAX]), ctx.ints([axis]),
                            ctx.ints([-1])])


@converts("_image_crop")
def image_crop(ctx: NodeContext) -> str:
    params, rank = ctx.params, ctx.rank()
    starts = [int(params.y), int(params.x)]
    ends = [starts[0] + int(params.height), starts[1] + int(params.width)]
    return ctx.op("Slice", [ctx.inputs[0], ctx.ints(starts), ctx.ints(ends),
                            ctx.ints([rank - 3, rank - 2])])


@converts("_image_adjust_lighting")
def adjust_lighting(ctx: NodeContext) -> str:
    # A fixed RGB shift from the alpha weights: read it off the kernel applied to zeros.
    channels = ctx.in_shapes[0][-1]
    shift = _by_kernel(ctx, np.zeros((1, 1, channels), ctx.in_dtypes[0])).reshape(channels)
    return ctx.op("Add", [ctx.inputs[0], ctx.builder.const(shift, f"{ctx.hint}_shift")])


@converts("Correlation")
def correlation(ctx: NodeContext) -> str:
    # One channel per displacement (row-major over the grid): the window mean, over kernel
    # positions and channels, of data1 times (or minus) data2 shifted by that displacement.
    params = ctx.params
    reach, kernel, pad = (int(params.max_displacement), int(params.kernel_size),
                          int(params.pad_size))
    pads = ctx.ints([0, 0, pad, pad, 0, 0, pad, pad])
    first, second = (ctx.op("Pad", [name, pads]) for name in ctx.inputs[:2])
    height, width = (size + 2 * pad for size in ctx.in_shapes[0][2:])
    centre = _window_crop(ctx, first, reach, reach, height, width, reach)
    radius = reach // int(params.stride2)
    shifts = [k * int(params.stride2) for k in range(-radius, radius + 1)]
    channels = [_displaced(ctx, centre, _window_crop(ctx, second, reach + dy, reach + dx,
                                                     height, width, reach), kernel)
                for dy in shifts for dx in shifts]
    return ctx.op("Concat", channels, axis=1)


def _window_crop(ctx: NodeContext, data: str, top: int, left: int, height: int, width: int,
                 reach: int) -> str:
    """The ``(height - 2 reach, width - 2 reach)`` region of ``data`` from (top, left)."""
    ends = [top + height - 2 * reach, left + width - 2 * reach]
    return ctx.op("Slice", [data, ctx.ints([top, left]), ctx.ints(ends), ctx.ints([2, 3])])


def _displaced(ctx: NodeContext, centre: str, shifted: str, kernel: int) -> str:
    if ctx.params.is_multiply:
        paired = ctx.op("Mul", [centre, shifted])
    else:
        paired = ctx.op("Abs", [ctx.op("Sub", [centre, shifted])])
    stride = int(ctx.params.stride1)
    pooled = ctx.op("AveragePool", [paired], kernel_shape=[kernel, kernel],
                    strides=[stride, stride])
    return ctx.reduce("ReduceMean", pooled, [1], True)
