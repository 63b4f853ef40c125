"""Convolution, Deconvolution and UpSampling over 1, 2 or 3 channels-first spatial axes.

Convolution is one GEMM over an im2col patch array (a batched matmul over groups); a 1x1 unpadded
convolution skips im2col, and a depthwise one sums strided views times per-channel weights.
Deconvolution is the transposed GEMM followed by a scatter-add (col2im) over kernel positions.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.kernels import conv_bind, depthwise_bind, winograd_bind
from engine.kernels.im2col import (
    Ints,
    conv_out_sizes,
    finish,
    im2col,
    kernel_offsets,
    output_buffer,
    pad_spatial,
    spatial_param,
    split_view,
    window,
)
from engine.ops.attrs import (
    choice,
    optional,
    parse_bool,
    parse_int,
    parse_int_tuple,
    parse_str,
)
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import merge

ShapeResult = tuple[list[MaybeShape], list[MaybeShape]]

PATCH_BYTES = conv_bind.PATCH_BYTES  # the im2col patch array is built this many bytes at a time
CHANNELS_FIRST = ("NCW", "NCHW", "NCDHW")
CHANNELS_LAST = ("NWC", "NHWC", "NDHWC")


def parse_conv_layout(value: Any) -> str | None:
    """A channels-first layout name, or None; channels-last layouts are refused clearly."""
    if value is None or (isinstance(value, str) and value.strip() == "None"):
        return None
    text = parse_str(value).strip()
    if text in CHANNELS_LAST:
        raise ValueError(f"layout {text!r} is not supported; only the channels-first layouts "
                         f"{', '.join(CHANNELS_FIRST)} are (transpose the data to channels-first)")
    if text not in CHANNELS_FIRST:
        raise ValueError(f"expected one of {', '.join(CHANNELS_FIRST)}; got {text!r}")
    return text


def _common_params(no_bias: bool, workspace: int) -> tuple[Param, ...]:
    return (
        Param("kernel", parse_int_tuple),
        Param("stride", parse_int_tuple, ()),
        Param("dilate", parse_int_tuple, ()),
        Param("pad", parse_int_tuple, ()),
        Param("num_filter", parse_int),
        Param("num_group", parse_int, 1),
        Param("workspace", parse_int, workspace),
        Param("no_bias", parse_bool, no_bias),
        Param("cudnn_tune", optional(choice("off", "limited_workspace", "fastest")), None),
        Param("cudnn_off", parse_bool, False),
        Param("layout", parse_conv_layout, None),
    )


def _inputs(attrs: Attrs) -> tuple[str, ...]:
    return ("data", "weight") if attrs.no_bias else ("data", "weight", "bias")


def _geometry(attrs: Attrs, op: str) -> tuple[Ints, Ints, Ints, Ints]:
    """(kernel, stride, dilate, pad), each with one value per spatial axis."""
    kernel = attrs.kernel
    ndim = len(kernel)
    if not 1 <= ndim <= 3 or min(kernel) < 1:
        raise ShapeError(f"{op}: kernel={kernel} must have 1, 2 or 3 positive sizes")
    if attrs.layout is not None and len(attrs.layout) != ndim + 2:
        raise ShapeError(f"{op}: layout {attrs.layout!r} does not fit kernel {kernel} "
                         f"({ndim} spatial axes)")
    stride = spatial_param(attrs.stride, ndim, 1, "stride", op)
    dilate = spatial_param(attrs.dilate, ndim, 1, "dilate", op)
    pad = spatial_param(attrs.pad, ndim, 0, "pad", op)
    if min(stride) < 1 or min(dilate) < 1 or min(pad) < 0:
        raise ShapeError(f"{op}: stride {stride} and dilate {dilate} must be positive and "
                         f"pad {pad} non-negative")
    return kernel, stride, dilate, pad


def _check_rank(shape: MaybeShape, ndim: int, op: str, what: str) -> MaybeShape:
    if shape is not None and len(shape) != ndim + 2:
        raise ShapeError(f"{op}: input {what!r} has shape {tuple(shape)}; expected {ndim + 2} "
                         f"dimensions (N, C, {ndim} spatial) to match the kernel")
    return shape


def _check_groups(op: str, channels: int, filters: int, group: int) -> None:
    if group < 1 or (channels and channels % group) or filters % group:
        raise ShapeError(f"{op}: num_group={group} must divide both the input channels "
                         f"({channels or 'unknown'}) and num_filter ({filters})")


def _merge(op: str, what: str, given: MaybeShape, expected: MaybeShape, why: str) -> MaybeShape:
    try:
        return merge(given, expected)
    except ShapeError:
        raise ShapeError(f"{op}: input {what!r} has shape {tuple(given or ())}; expected "
                         f"{tuple(expected or ())} ({why}; 0 = any)") from None


def _with_bias(attrs: Attrs, op: str, result: list[MaybeShape],
               shapes: list[MaybeShape]) -> list[MaybeShape]:
    if not attrs.no_bias:
        result.append(_merge(op, "bias", shapes[2], (attrs.num_filter,), "one per filter"))
    return result


def _check_out(op: str, data: MaybeShape, out: Ints) -> None:
    if data is not None and any(size and dim <= 0 for size, dim in zip(data[2:], out, strict=True)):
        raise ShapeError(f"{op}: input 'data' {tuple(data)} is too small for the kernel, "
                         f"stride, dilate and pad; the output would be {out}")


def _conv_infer_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    kernel, stride, dilate, pad = _geometry(attrs, "Convolution")
    ndim, group, filters = len(kernel), attrs.num_group, attrs.num_filter
    data = _check_rank(shapes[0], ndim, "Convolution", "data")
    weight = _check_rank(shapes[1], ndim, "Convolution", "weight")
    channels = data[1] if data is not None else 0
    if not channels and weight is not None and weight[1]:
        channels = weight[1] * group
    _check_groups("Convolution", channels, filters, group)
    weight = _merge("Convolution", "weight", weight, (filters, channels // group, *kernel),
                    "(num_filter, channels / num_group, *kernel)")
    out: MaybeShape = None
    if data is not None:
        data = (data[0], channels, *data[2:])
        spatial = conv_out_sizes(data[2:], kernel, stride, dilate, pad)
        _check_out("Convolution", data, spatial)
        out = (data[0], filters, *spatial)
    return _with_bias(attrs, "Convolution", [data, weight], shapes), [out]


def _check_weight(op: str, weight: Any, expected: Ints) -> None:
    if tuple(weight.shape) != tuple(expected):
        raise ShapeError(f"{op}: input 'weight' has shape {tuple(weight.shape)}; expected "
                         f"{tuple(expected)} for the data and attributes")


def _add_bias(result: Any, bias: Any) -> None:
    if bias is not None:
        result += bias.reshape((1, -1) + (1,) * (result.ndim - 2))


def _convolution(xp: Any, attrs: Attrs, data: Any, weight: Any, bias: Any = None,
                 out: Any = None) -> Any:
    kernel, stride, dilate, pad = _geometry(attrs, "Convolution")
    _check_rank(tuple(data.shape), len(kernel), "Convolution", "data")
    batch, channels = data.shape[:2]
    group, filters = attrs.num_group, attrs.num_filter
    _check_groups("Convolution", channels, filters, group)
    _check_weight("Convolution", weight, (filters, channels // group, *kernel))
    size = conv_out_sizes(data.shape[2:], kernel, stride, dilate, pad)
    result = output_buffer(xp, out, (batch, filters, *size), data.dtype)
    if group > 1 and group == channels:
        _depthwise(xp, data, weight, kernel, stride, dilate, pad, size, result)
    elif max(kernel) == 1 and not any(pad):
        strided = data if max(stride) == 1 else window(data, (0,) * len(kernel), stride, size)
        _grouped_matmul(xp, strided, weight, group, result)
    else:
        # Bound the patch array (and keep it nearer the cache) by taking samples in chunks.
        per_sample = channels * math.prod(kernel) * math.prod(size) * data.itemsize
        chunk = max(1, PATCH_BYTES // max(per_sample, 1))
        for start in range(0, batch, chunk):
            part = slice(start, start + chunk)
            padded = pad_spatial(xp, data[part], pad, pad)
            _grouped_matmul(xp, im2col(xp, padded, kernel, stride, dilate, size), weight, group,
                            result[part])
    _add_bias(result, bias)
    return finish(xp, out, result)


def _conv_scratch(attrs: Attrs, shapes: list[Ints], dtype: Any) -> int:
    """Plan scratch bytes of the bound convolution: patches of one chunk (or channel block), or
    Winograd's regions where it may apply (whether it does depends on the weight)."""
    geometry = _geometry(attrs, "Convolution")
    data = tuple(shapes[0])
    itemsize = np.dtype(dtype).itemsize
    if depthwise_bind.applies(attrs.num_group, data[1], attrs.num_filter):
        return depthwise_bind.scratch_bytes(data, geometry, itemsize)
    if attrs.num_group != 1:
        return 0
    size = conv_out_sizes(data[2:], *geometry)
    need = conv_bind.scratch_bytes(data, attrs.num_filter, size, geometry, itemsize)
    if winograd_bind.fits(data, attrs.num_filter, geometry):
        need = max(need, winograd_bind.scratch_bytes(data, attrs.num_filter, geometry, itemsize))
    return need


def _conv_bind(xp: Any, attrs: Attrs, inputs: list[Any], out: Any,
               workspace: Any = None) -> list[Any]:
    """Group-1 and depthwise convolutions on the CPU run in the plan's workspace (stride-1 3×3
    ones with constant weights as Winograd); others call the kernel."""
    if xp is not np:
        return _device_conv_bind(xp, attrs, inputs, out, workspace)
    data, weight = inputs[:2]
    depthwise = depthwise_bind.applies(attrs.num_group, data.shape[1], attrs.num_filter)
    need = _conv_scratch(attrs, [data.shape], data.dtype)
    usable = (xp is np and (attrs.num_group == 1 or depthwise) and out.flags.c_contiguous
              and workspace is not None and workspace.scratch.nbytes >= need)
    if not usable:
        return [partial(_convolution, xp, attrs, *inputs, out=out)]
    bias = inputs[2] if len(inputs) > 2 else None
    geometry = _geometry(attrs, "Convolution")
    if depthwise:
        bind = depthwise_bind.bind
    elif data.dtype == weight.dtype and winograd_bind.applies(data.shape, weight, geometry):
        bind = winograd_bind.bind
    else:
        bind = conv_bind.bind
    return bind(xp, data, weight, bias, out, geometry, workspace)


def _device_conv_bind(xp: Any, attrs: Attrs, inputs: list[Any], out: Any,
                      workspace: Any) -> list[Any]:
    """On a GPU: a cuDNN graph where the plan has cuDNN and it accepts the convolution, else
    (group 1) im2col and cuBLAS GEMM in the plan's workspace, else the kernel."""
    data, weight = inputs[:2]
    bias = inputs[2] if len(inputs) > 2 else None
    geometry = _geometry(attrs, "Convolution")
    convolutions = getattr(workspace, "convolutions", None)
    if convolutions is not None:
        calls = convolutions.bind(xp, data, weight, bias, out, geometry)
        if calls is not None:
            return calls
    if attrs.num_group == 1 and workspace is not None and out.flags.c_contiguous:
        size = out.shape[2:]
        need = conv_bind.scratch_bytes(data.shape, attrs.num_filter, size, geometry,
                                       data.itemsize)
        if workspace.scratch.nbytes >= need:
            return conv_bind.bind(xp, data, weight, bias, out, geometry, workspace)
    return [partial(_convolution, xp, attrs, *inputs, out=out)]


def _grouped_matmul(xp: Any, columns: Any, weight: Any, group: int, result: Any) -> None:
    """``result[n, g] = weight[g] @ columns[n, g]``: one GEMM per (sample, group), in BLAS."""
    batch, filters = result.shape[:2]
    positions = math.prod(result.shape[2:])
    matrix = weight.reshape(group, filters // group, -1)
    operand = columns.reshape(batch, group, matrix.shape[2], positions)
    xp.matmul(matrix, operand, out=result.reshape(batch, group, filters // group, positions))


def _depthwise(xp: Any, data: Any, weight: Any, kernel: Ints, stride: Ints, dilate: Ints,
               pad: Ints, size: Ints, result: Any) -> None:
    """One group per input channel: a sum over kernel positions of strided views times weights."""
    batch, channels = data.shape[:2]
    multiplier = result.shape[1] // channels
    padded = pad_spatial(xp, data, pad, pad)
    taps = weight.reshape(channels, multiplier, -1)
    ones = (1,) * len(kernel)
    target = result.reshape(batch, channels, multiplier, *size)
    scratch = xp.empty_like(target) if taps.shape[2] > 1 else None
    for index, offset in enumerate(kernel_offsets(kernel, dilate)):
        view = window(padded, offset, stride, size)[:, :, None]
        tap = taps[:, :, index].reshape(1, channels, multiplier, *ones)
        if index == 0:
            xp.multiply(view, tap, out=target)
        else:
            xp.multiply(view, tap, out=scratch)
            target += scratch


# -- Deconvolution -------------------------------------------------------------------------------


def _deconv_pad_adj(attrs: Attrs, kernel: Ints, stride: Ints, dilate: Ints, pad: Ints,
                    sizes: Ints) -> tuple[Ints, Ints]:
    """(pad, adj), where ``target_shape`` (if given) overrides both on its nonzero axes."""
    ndim = len(kernel)
    adj = spatial_param(attrs.adj, ndim, 0, "adj", "Deconvolution")
    target = attrs.target_shape
    if not target or not any(target):
        return pad, adj
    target = spatial_param(target, ndim, 0, "target_shape", "Deconvolution")
    pads, adjs = list(pad), list(adj)
    for axis, want in enumerate(target):
        size, k, s, d = sizes[axis], kernel[axis], stride[axis], dilate[axis]
        if not want or not size:
            continue
        total = (size - 1) * s + d * (k - 1) + 1 - want
        if total < 0:
            raise ShapeError(f"Deconvolution: target_shape {tuple(target)} is larger than the "
                             f"largest output ({want - total}) on spatial axis {axis}")
        pads[axis], adjs[axis] = (total + 1) // 2, total % 2
    return tuple(pads), tuple(adjs)


def _deconv_out_size(size: int, k: int, s: int, d: int, p: int, a: int) -> int:
    return (size - 1) * s + d * (k - 1) + 1 - 2 * p + a if size else 0


def _deconv_infer_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    kernel, stride, dilate, pad = _geometry(attrs, "Deconvolution")
    ndim, group, filters = len(kernel), attrs.num_group, attrs.num_filter
    data = _check_rank(shapes[0], ndim, "Deconvolution", "data")
    weight = _check_rank(shapes[1], ndim, "Deconvolution", "weight")
    channels = data[1] if data is not None else 0
    if not channels and weight is not None:
        channels = weight[0]
    _check_groups("Deconvolution", channels, filters, group)
    weight = _merge("Deconvolution", "weight", weight, (channels, filters // group, *kernel),
                    "(channels, num_filter / num_group, *kernel)")
    out: MaybeShape = None
    if data is not None:
        data = (data[0], channels, *data[2:])
        pads, adjs = _deconv_pad_adj(attrs, kernel, stride, dilate, pad, data[2:])
        spatial = tuple(map(_deconv_out_size, data[2:], kernel, stride, dilate, pads, adjs))
        _check_out("Deconvolution", data, spatial)
        out = (data[0], filters, *spatial)
    return _with_bias(attrs, "Deconvolution", [data, weight], shapes), [out]


def deconvolve(xp: Any, data: Any, weight: Any, group: int, geometry: tuple[Ints, ...],
               out: Any = None) -> Any:
    """Transposed convolution: weight ``(C, F / group, *k)``; geometry (k, s, d, pad, adj)."""
    kernel, stride, dilate, pad, adj = geometry
    batch, channels = data.shape[:2]
    sizes = data.shape[2:]
    filters = weight.shape[1] * group
    matrix = weight.reshape(group, channels // group, -1).transpose(0, 2, 1)
    operand = data.reshape(batch, group, channels // group, math.prod(sizes))
    columns = xp.matmul(matrix, operand).reshape(batch, filters, *kernel, *sizes)
    full = tuple(map(_deconv_out_size, sizes, kernel, stride, dilate, (0,) * len(kernel),
                     (0,) * len(kernel)))
    size = tuple(f - 2 * p + a for f, p, a in zip(full, pad, adj, strict=True))
    result = output_buffer(xp, out, (batch, filters, *size), data.dtype)
    extent = tuple(f + max(0, a - p) for f, p, a in zip(full, pad, adj, strict=True))
    direct = extent == size
    canvas = result if direct else xp.empty((batch, filters, *extent), dtype=result.dtype)
    canvas[...] = 0
    for index, offset in enumerate(kernel_offsets(kernel, dilate)):
        position = np.unravel_index(index, kernel)
        window(canvas, offset, stride, sizes)[...] += columns[(slice(None), slice(None),
                                                              *position)]
    if not direct:
        result[...] = canvas[(slice(None), slice(None),
                              *(slice(p, p + n) for p, n in zip(pad, size, strict=True)))]
    return result


def _deconvolution(xp: Any, attrs: Attrs, data: Any, weight: Any, bias: Any = None,
                   out: Any = None) -> Any:
    kernel, stride, dilate, pad = _geometry(attrs, "Deconvolution")
    _check_rank(tuple(data.shape), len(kernel), "Deconvolution", "data")
    channels, group, filters = data.shape[1], attrs.num_group, attrs.num_filter
    _check_groups("Deconvolution", channels, filters, group)
    _check_weight("Deconvolution", weight, (channels, filters // group, *kernel))
    pad, adj = _deconv_pad_adj(attrs, kernel, stride, dilate, pad, data.shape[2:])
    result = deconvolve(xp, data, weight, group, (kernel, stride, dilate, pad, adj), out)
    _add_bias(result, bias)
    return finish(xp, out, result)


CONVOLUTION = register(OpDef(
    name="Convolution",
    aliases=("_npx_convolution",),
    params=_common_params(no_bias=False, workspace=1024),
    inputs=_inputs,
    infer_shape=_conv_infer_shape,
    kernel=_convolution,
    writes_out=True,
    bind=_conv_bind,
    scratch=_conv_scratch,
    doc="N-D convolution (1-3 spatial axes, channels-first) with groups, dilation and padding.",
))

DECONVOLUTION = register(OpDef(
    name="Deconvolution",
    aliases=("_npx_deconvolution",),
    params=(*_common_params(no_bias=True, workspace=512),
            Param("adj", parse_int_tuple, ()),
            Param("target_shape", parse_int_tuple, ())),
    inputs=_inputs,
    infer_shape=_deconv_infer_shape,
    kernel=_deconvolution,
    writes_out=True,
    doc="Transposed convolution; weight is (C_in, num_filter / num_group, *kernel).",
))


# -- UpSampling ----------------------------------------------------------------------------------


def _upsampling_inputs(attrs: Attrs) -> tuple[str, ...]:
    if attrs.sample_type == "bilinear":
        return ("data", "weight")
    return tuple(f"arg{index}" for index in range(attrs.num_args))


def _bilinear_geometry(scale: int) -> tuple[Ints, ...]:
    """Kernel ``2s - s % 2``, stride ``s``, pad ``ceil((s - 1) / 2)``, as a 2-D deconvolution."""
    size, pad = 2 * scale - scale % 2, scale // 2
    return (size, size), (scale, scale), (1, 1), (pad, pad), (0, 0)


def _check_4d(shape: MaybeShape, what: str) -> MaybeShape:
    if shape is not None and len(shape) != 4:
        raise ShapeError(f"UpSampling: input {what!r} has shape {tuple(shape)}; expected 4 "
                         f"dimensions (N, C, H, W)")
    return shape


def _upsampling_infer_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    scale = attrs.scale
    if scale < 1:
        raise ShapeError(f"UpSampling: scale={scale} must be at least 1")
    names = _upsampling_inputs(attrs)
    shapes = [_check_4d(shape, name) for shape, name in zip(shapes, names, strict=True)]
    if attrs.sample_type == "bilinear":
        return _bilinear_upsampling_shape(attrs, shapes)
    first = shapes[0]
    if first is None:
        return shapes, [None]
    height, width = scale * first[2], scale * first[3]
    for name, shape in zip(names, shapes, strict=True):
        if shape is None or not (shape[2] and shape[3] and height and width):
            continue
        if height % shape[2] or width % shape[3]:
            raise ShapeError(f"UpSampling: input {name!r} {tuple(shape)} cannot be scaled to "
                             f"({height}, {width}), scale x the first input's size")
    if attrs.multi_input_mode == "sum":
        channels = 0
        for name, shape in zip(names, shapes, strict=True):
            if shape is not None:
                channels = _merge("UpSampling", name, (channels,), (shape[1],),
                                  "multi_input_mode='sum' needs equal channels")[0]
    else:
        known = all(shape is not None and shape[1] for shape in shapes)
        channels = sum(shape[1] for shape in shapes) if known else 0  # type: ignore[index]
    return shapes, [(first[0], channels, height, width)]


def _bilinear_upsampling_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    data, weight = shapes
    channels = data[1] if data is not None else 0
    channels = channels or attrs.num_filter or (weight[0] if weight is not None else 0)
    kernel, stride, dilate, pad, adj = _bilinear_geometry(attrs.scale)
    weight = _merge("UpSampling", "weight", weight, (channels, 1, *kernel),
                    "(channels, 1, 2*scale - scale%2, 2*scale - scale%2)")
    out: MaybeShape = None
    if data is not None:
        data = (data[0], channels, *data[2:])
        out = (data[0], channels, *map(_deconv_out_size, data[2:], kernel, stride, dilate, pad,
                                       adj))
    return [data, weight], [out]


def _upsampling(xp: Any, attrs: Attrs, *inputs: Any, out: Any = None) -> Any:
    if attrs.sample_type == "bilinear":
        data, weight = inputs
        _check_weight("UpSampling", weight,
                      (data.shape[1], 1, *_bilinear_geometry(attrs.scale)[0]))
        result = deconvolve(xp, data, weight, data.shape[1], _bilinear_geometry(attrs.scale), out)
        return finish(xp, out, result)
    first = inputs[0]
    height, width = attrs.scale * first.shape[2], attrs.scale * first.shape[3]
    concat = attrs.multi_input_mode != "sum"
    channels = sum(item.shape[1] for item in inputs) if concat else first.shape[1]
    result = output_buffer(xp, out, (first.shape[0], channels, height, width), first.dtype)
    start = 0
    for index, item in enumerate(inputs):
        target = result[:, start:start + item.shape[1]] if concat else result
        view = split_view(xp, target, (height // item.shape[2], width // item.shape[3]))
        source = item[:, :, :, None, :, None]
        if concat or index == 0:
            view[...] = source
        else:
            view += source
        start += item.shape[1]
    return finish(xp, out, result)


UPSAMPLING = register(OpDef(
    name="UpSampling",
    params=(
        Param("scale", parse_int),
        Param("num_filter", parse_int, 0),
        Param("sample_type", choice("nearest", "bilinear")),
        Param("multi_input_mode", choice("concat", "sum"), "concat"),
        Param("num_args", parse_int),
        Param("workspace", parse_int, 512),
    ),
    inputs=_upsampling_inputs,
    infer_shape=_upsampling_infer_shape,
    kernel=_upsampling,
    writes_out=True,
    doc="Nearest (several inputs, concatenated or summed) or bilinear (grouped deconvolution).",
))
