"""Converters for layers: convolution, pooling, dense, normalisation, activations, softmax."""

from __future__ import annotations

import math

import numpy as np

from engine.onnx.context import NodeContext, converts, normalize_axis

CHANNEL_FIRST = (None, "NCW", "NCHW", "NCDHW")
ACTIVATIONS = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "softrelu": "Softplus",
               "softsign": "Softsign"}
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_LAMBDA = 1.0507009873554804934193349852946


def _spatial(value: tuple, count: int, default: int) -> list[int]:
    return [int(v) for v in value] if value else [default] * count


def _channel_first(ctx: NodeContext) -> None:
    if ctx.params.get("layout") not in CHANNEL_FIRST:
        raise ctx.fail(f"layout {ctx.params.layout!r} is not supported; ONNX is channel-first "
                       "(export the model with layout NCHW)")


def _window(ctx: NodeContext, spatial: int) -> dict:
    params = ctx.params
    pad = _spatial(params.pad, spatial, 0)
    return {"kernel_shape": [int(k) for k in params.kernel], "pads": pad + pad,
            "strides": _spatial(params.stride, spatial, 1)}


@converts("Convolution")
def convolution(ctx: NodeContext) -> str:
    _channel_first(ctx)
    spatial = len(ctx.params.kernel)
    inputs = ctx.inputs[:2] if ctx.params.no_bias else ctx.inputs[:3]
    return ctx.op("Conv", inputs, group=int(ctx.params.num_group),
                  dilations=_spatial(ctx.params.dilate, spatial, 1), **_window(ctx, spatial))


@converts("Deconvolution")
def deconvolution(ctx: NodeContext) -> str:
    _channel_first(ctx)
    spatial = len(ctx.params.kernel)
    window = _window(ctx, spatial)
    dilate = _spatial(ctx.params.dilate, spatial, 1)
    adj = _spatial(ctx.params.adj, spatial, 0)
    if ctx.params.target_shape and any(ctx.params.target_shape):
        pads, adj = _target_pads(ctx, window, dilate, adj)
        window["pads"] = pads + pads
    inputs = ctx.inputs[:2] if ctx.params.no_bias else ctx.inputs[:3]
    return ctx.op("ConvTranspose", inputs, group=int(ctx.params.num_group), dilations=dilate,
                  output_padding=adj, **window)


def _target_pads(ctx: NodeContext, window: dict, dilate: list[int],
                 adj: list[int]) -> tuple[list[int], list[int]]:
    """MXNet's ``target_shape``: the padding (and extra row) that give exactly that size."""
    pads, adj = list(window["pads"][:len(adj)]), list(adj)
    sizes = ctx.in_shapes[0][2:]
    for axis, want in enumerate(ctx.params.target_shape):
        if want:
            kernel, stride = window["kernel_shape"][axis], window["strides"][axis]
            total = (sizes[axis] - 1) * stride + dilate[axis] * (kernel - 1) + 1 - want
            pads[axis], adj[axis] = (total + 1) // 2, total % 2
    return pads, adj


@converts("Pooling")
def pooling(ctx: NodeContext) -> str:
    if ctx.params.layout in CHANNEL_FIRST:
        return _pooling(ctx, ctx.inputs[0])
    if ctx.params.layout not in ("NWC", "NHWC", "NDHWC"):
        raise ctx.fail(f"layout {ctx.params.layout!r} is not supported")
    # ONNX pools channel-first: move the channels to axis 1 and back.
    rank = ctx.rank()
    first = ctx.op("Transpose", [ctx.inputs[0]], perm=[0, rank - 1, *range(1, rank - 1)])
    pooled = _pooling(ctx, first, channels_last=True)
    return ctx.op("Transpose", [pooled], perm=[0, *range(2, rank), 1])


def _pooling(ctx: NodeContext, data: str, channels_last: bool = False) -> str:
    params = ctx.params
    if params.pooling_convention == "same":
        raise ctx.fail("pooling_convention='same' has no ONNX equivalent")
    if params.global_pool:
        return _global_pooling(ctx, data, channels_last)
    window = _window(ctx, ctx.rank() - 2)
    ceil_mode = int(params.pooling_convention == "full")
    if params.pool_type == "max":
        return ctx.op("MaxPool", [data], ceil_mode=ceil_mode, **window)
    if params.pool_type == "lp":
        if ceil_mode:  # LpPool has ceil_mode from opset 18
            window["ceil_mode"] = ceil_mode
        return ctx.op("LpPool", [data], p=int(params.p_value), **window)
    include = params.count_include_pad is None or params.count_include_pad
    if params.pool_type == "sum":  # a sum is the mean over the whole window times its size
        mean = ctx.op("AveragePool", [data], ceil_mode=ceil_mode, count_include_pad=1, **window)
        return ctx.op("Mul", [mean, ctx.scalar(math.prod(window["kernel_shape"]))])
    return ctx.op("AveragePool", [data], ceil_mode=ceil_mode, count_include_pad=int(include),
                  **window)


def _global_pooling(ctx: NodeContext, data: str, channels_last: bool) -> str:
    kind = ctx.params.pool_type
    if kind == "max":
        return ctx.op("GlobalMaxPool", [data])
    if kind == "lp":
        return ctx.op("GlobalLpPool", [data], p=int(ctx.params.p_value))
    mean = ctx.op("GlobalAveragePool", [data])
    if kind == "avg":
        return mean
    spatial = ctx.in_shapes[0][1:-1] if channels_last else ctx.in_shapes[0][2:]
    return ctx.op("Mul", [mean, ctx.scalar(math.prod(spatial))])


@converts("FullyConnected")
def fully_connected(ctx: NodeContext) -> str:
    data, weight = ctx.inputs[:2]
    bias = [] if ctx.params.no_bias else [ctx.inputs[2]]
    if ctx.params.flatten:
        if ctx.rank() != 2:
            data = ctx.op("Flatten", [data], axis=1)
        return ctx.op("Gemm", [data, weight, *bias], transB=1)
    if ctx.constants[1] is not None:
        transposed = ctx.builder.const(ctx.constants[1].T, f"{ctx.hint}_weight_t")
    else:
        transposed = ctx.op("Transpose", [weight], perm=[1, 0])
    product = ctx.op("MatMul", [data, transposed])
    return ctx.op("Add", [product, *bias]) if bias else product


def _along_axis(ctx: NodeContext, values: np.ndarray, axis: int, hint: str) -> str:
    """A constant shaped to broadcast along ``axis`` of input 0."""
    shape = [1] * ctx.rank()
    shape[axis] = -1
    return ctx.builder.const(values.reshape(shape).astype(ctx.in_dtypes[0]), f"{ctx.hint}_{hint}")


@converts("BatchNorm")
def batch_norm(ctx: NodeContext) -> str | list[str]:
    params = ctx.params
    gamma, beta, mean, var = (ctx.constant(k, name).astype(np.float64) for k, name in
                              enumerate(("gamma", "beta", "moving_mean", "moving_var"), 1))
    if params.fix_gamma:
        gamma = np.ones_like(gamma)
    # Inference BatchNorm is one multiply-add per channel, on any axis.
    scale = gamma / np.sqrt(var + params.eps)
    axis = normalize_axis(params.get("axis", 1), ctx.rank())  # v1/Sync variants: channels
    scaled = ctx.op("Mul", [ctx.inputs[0], _along_axis(ctx, scale, axis, "scale")])
    output = ctx.op("Add", [scaled, _along_axis(ctx, beta - mean * scale, axis, "shift")])
    if not params.output_mean_var:
        return output
    # At inference MXNet's extra outputs are the moving mean and 1 / sqrt(moving_var + eps).
    dtype = ctx.in_dtypes[3]
    return [output, ctx.builder.const(mean.astype(dtype), f"{ctx.hint}_mean"),
            ctx.builder.const((1 / np.sqrt(var + params.eps)).astype(dtype), f"{ctx.hint}_var")]


@converts("InstanceNorm")
def instance_norm(ctx: NodeContext) -> str:
    return ctx.op("InstanceNormalization", ctx.inputs[:3], epsilon=float(ctx.params.eps))


@converts("LayerNorm")
def layer_norm(ctx: NodeContext) -> str | list[str]:
    params, rank = ctx.params, ctx.rank()
    axis = normalize_axis(params.axis, rank)
    if axis == rank - 1 and not params.output_mean_var:
        return ctx.op("LayerNormalization", ctx.inputs[:3], axis=-1,
                      epsilon=float(params.eps))
    data = ctx.inputs[0]
    mean = ctx.reduce("ReduceMean", data, [axis], True)
    centred = ctx.op("Sub", [data, mean])
    variance = ctx.reduce("ReduceMean", ctx.op("Mul", [centred, centred]), [axis], True)
    deviation = ctx.op("Sqrt", [ctx.op("Add", [variance, ctx.scalar(params.eps)])])
    normalized = ctx.op("Div", [centred, deviation])
    gamma, beta = (ctx.op("Reshape", [ctx.inputs[k], ctx.ints(
        [-1 if d == axis else 1 for d in range(rank)])]) for k in (1, 2))
    output = ctx.op("Add", [ctx.op("Mul", [normalized, gamma]), beta])
    return [output, mean, deviation] if params.output_mean_var else output


@converts("GroupNorm")
def group_norm(ctx: NodeContext) -> str:
    params, rank, data = ctx.params, ctx.rank(), ctx.inputs[0]
    if params.output_mean_var:
        raise ctx.fail("output_mean_var=True is not supported")
    # Normalise each (sample, group) over its channels and positions, then scale per channel.
    grouped = ctx.op("Reshape", [data, ctx.ints([0, int(params.num_groups), -1])])
    centred = ctx.op("Sub", [grouped, ctx.reduce("ReduceMean", grouped, [2], True)])
    variance = ctx.reduce("ReduceMean", ctx.op("Mul", [centred, centred]), [2], True)
    deviation = ctx.op("Sqrt", [ctx.op("Add", [variance, ctx.scalar(params.eps)])])
    normalized = ctx.op("Reshape", [ctx.op("Div", [centred, deviation]),
                                    ctx.op("Shape", [data])])
    gamma, beta = (ctx.op("Reshape", [ctx.inputs[k], ctx.ints([-1] + [1] * (rank - 2))])
                   for k in (1, 2))
    return ctx.op("Add", [ctx.op("Mul", [normalized, gamma]), beta])


@converts("L2Normalization")
def l2_normalization(ctx: NodeContext) -> str:
    rank, data = ctx.rank(), ctx.inputs[0]
    axes = {"instance": list(range(1, rank)), "channel": [1],
            "spatial": list(range(2, rank))}[ctx.params.mode]
    squares = ctx.reduce("ReduceSum", ctx.op("Mul", [data, data]), axes, True)
    norm = ctx.op("Sqrt", [ctx.op("Add", [squares, ctx.scalar(ctx.params.eps)])])
    return ctx.op("Div", [data, norm])


@converts("LRN")
def lrn(ctx: NodeContext) -> str:
    params = ctx.params
    return ctx.op("LRN", [ctx.inputs[0]], alpha=float(params.alpha), beta=float(params.beta),
                  bias=float(params.knorm), size=int(params.nsize))


@converts("Activation")
def activation(ctx: NodeContext) -> str:
    kind, data = ctx.params.act_type, ctx.inputs[0]
    if kind in ACTIVATIONS:
        return ctx.op(ACTIVATIONS[kind], [data])
    softplus = ctx.op("Softplus", [ctx.op("Neg", [data])] if kind == "log_sigmoid" else [data])
    if kind == "log_sigmoid":  # log(sigmoid(x)) = -softplus(-x)
        return ctx.op("Neg", [softplus])
    return ctx.op("Mul", [data, ctx.op("Tanh", [softplus])])  # mish


@converts("LeakyReLU")
def leaky_relu(ctx: NodeContext) -> str | list[str]:
    kind, data, slope = ctx.params.act_type, ctx.inputs[0], float(ctx.params.slope)
    if kind == "leaky":
        return ctx.op("LeakyRelu", [data], alpha=slope)
    if kind == "elu":
        return ctx.op("Elu", [data], alpha=slope)
    if kind == "selu":
        return ctx.op("Selu", [data], alpha=SELU_ALPHA, gamma=SELU_LAMBDA)
    if kind == "gelu":  # the exact (erf) form, as MXNet computes it
        halved = ctx.op("Mul", [data, ctx.scalar(0.5)])
        erf = ctx.op("Erf", [ctx.op("Mul", [data, ctx.scalar(1 / math.sqrt(2.0))])])
        return ctx.op("Mul", [halved, ctx.op("Add", [erf, ctx.scalar(1.0)])])
    if kind == "prelu":
        gamma = ctx.inputs[1]
        if ctx.rank() >= 2 and math.prod(ctx.in_shapes[1]) > 1:
            gamma = ctx.op("Reshape", [gamma, ctx.ints([-1] + [1] * (ctx.rank() - 2))])
        return ctx.op("PRelu", [data, gamma])
    # rrelu at inference: the mean slope; the mask output (undefined in MXNet) holds the slope.
    slope = (float(ctx.params.lower_bound) + float(ctx.params.upper_bound)) / 2
    return [ctx.op("LeakyRelu", [data], alpha=slope), fill_like(ctx, data, slope)]


def fill_like(ctx: NodeContext, data: str, value: float) -> str:
    """A tensor of ``data``'s shape and dtype filled with ``value``."""
    from onnx import helper

    fill = helper.make_tensor("value", helper.np_dtype_to_tensor_dtype(ctx.in_dtypes[0]), [1],
                              [value])
    return ctx.op("ConstantOfShape", [ctx.op("Shape", [data])], value=fill)


def _tempered(ctx: NodeContext) -> str:
    data = ctx.inputs[0]
    if ctx.op_name == "softmin":
        data = ctx.op("Neg", [data])
    temperature = ctx.params.get("temperature")
    if temperature is None or temperature == 1.0:
        return data
    return ctx.op("Div", [data, ctx.scalar(temperature)])


@converts("softmax", "log_softmax", "softmin")
def softmax(ctx: NodeContext) -> str:
    op_type = "LogSoftmax" if ctx.op_name == "log_softmax" else "Softmax"
    data = _tempered(ctx)
    if ctx.params.use_length:
        return _softmax_with_length(ctx, op_type, data)
    result = ctx.op(op_type, [data], axis=int(ctx.params.axis))
    if ctx.params.dtype is not None and np.dtype(ctx.params.dtype) != ctx.in_dtypes[0]:
        result = ctx.cast(result, ctx.params.dtype)
    return result


def _softmax_with_length(ctx: NodeContext, op_type: str, data: str) -> str:
    """Softmax over the first ``length`` entries along the axis; the rest are 0 (MXNet)."""
    axis = normalize_axis(ctx.params.axis, ctx.rank())
    shape = [1] * ctx.rank()
    shape[axis] = -1
    steps = ctx.builder.const(np.arange(ctx.static_dim(0, axis)).reshape(shape),
                              f"{ctx.hint}_steps", np.int64)
    length = ctx.unsqueeze(ctx.cast(ctx.inputs[1], np.int64), [axis])
    keep = ctx.op("Less", [steps, length])
    lowest = ctx.scalar(np.finfo(ctx.in_dtypes[0]).min)
    result = ctx.op(op_type, [ctx.op("Where", [keep, data, lowest])], axis=axis)
    return ctx.op("Where", [keep, result, ctx.scalar(0.0)])


@converts("SoftmaxActivation")
def softmax_activation(ctx: NodeContext) -> str:
    # Instance mode is a softmax over the last axis at any rank (MXNet's FlatTo2D keeps the
    # last axis as the row); channel mode over axis 1.
    axis = 1 if ctx.params.mode == "channel" else -1
    return ctx.op("Softmax", [ctx.inputs[0]], axis=axis)


@converts("SoftmaxOutput")
def softmax_output(ctx: NodeContext) -> str:
    params, data = ctx.params, ctx.inputs[0]
    if params.preserve_shape or ctx.rank() == 1:
        return ctx.op("Softmax", [data], axis=-1)
    if params.multi_output:
        return ctx.op("Softmax", [data], axis=1)
    # Over everything but the batch axis, then back to the input's shape.
    flat = ctx.op("Softmax", [ctx.op("Flatten", [data], axis=1)], axis=1)
    return flat if ctx.rank() == 2 else ctx.op("Reshape", [flat, ctx.out_shape_tensor(0, True)])
