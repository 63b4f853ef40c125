"""Normalisation operators: BatchNorm, LayerNorm, InstanceNorm, GroupNorm, L2Normalization, LRN.

Inference semantics follow MXNet 1.9.1 (see the conformance README): BatchNorm always uses the
moving statistics, and the optional mean/var outputs are MXNet's inference values.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.kernels import batchnorm_kernel
from engine.ops.attrs import choice, optional, parse_bool, parse_float, parse_int
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import merge, normalize_axis

ShapeResult = tuple[list[MaybeShape], list[MaybeShape]]
DTypeResult = tuple[list["np.dtype | None"], list["np.dtype | None"]]


def _param_dtype(data: np.dtype | None) -> np.dtype | None:
    # MXNet keeps normalisation parameters in float32 when the data is float16.
    if data is not None and np.dtype(data) == np.float16:
        return np.dtype(np.float32)
    return data


def _norm_dtype(count: int) -> Any:
    """Dtype inference: parameters follow the data (float32 for float16 data); ``count`` outputs."""

    def infer(attrs: Attrs, dtypes: list[np.dtype | None]) -> DTypeResult:
        data = dtypes[0]
        if data is None:
            data = next((dtype for dtype in dtypes[1:] if dtype is not None), None)
        param = _param_dtype(data)
        inputs = [data] + [param if dtype is None else dtype for dtype in dtypes[1:]]
        visible = count(attrs) if callable(count) else count
        return inputs, [data] + [param] * (visible - 1)

    return infer


def _channel_shapes(shapes: list[MaybeShape], axis: int, what: str) -> ShapeResult:
    """Data plus per-channel parameters of shape ``(C,)`` where C is ``data.shape[axis]``."""
    data = shapes[0]
    channels = 0
    if data is not None:
        axis = normalize_axis(axis, len(data), f"{what} axis")
        channels = data[axis]
    for index, shape in enumerate(shapes[1:], start=1):
        channels = merge(shape, (channels,), f"{what} input {index} (per-channel)")[0]
    params: list[MaybeShape] = [(channels,)] * (len(shapes) - 1)
    if data is not None and channels and not data[axis]:
        data = (*data[:axis], channels, *data[axis + 1:])
    return [data, *params], [data]


def _along(vector: Any, ndim: int, axis: int) -> Any:
    """A 1-D per-channel vector reshaped to broadcast against ``ndim``-D data on ``axis``."""
    shape = [1] * ndim
    shape[axis] = -1
    return vector.reshape(shape)


# --- BatchNorm -------------------------------------------------------------------------------

def _bn_outputs(attrs: Attrs) -> tuple[str, ...]:
    return ("output", "mean", "var") if attrs.output_mean_var else ("output",)


def _stats_hidden(attrs: Attrs) -> int:
    """Outputs MXNet keeps hidden: the two statistics, unless ``output_mean_var`` shows them."""
    return 0 if attrs.output_mean_var else 2


def _stats_visible(attrs: Attrs) -> int:
    """Visible outputs: the result, and the two statistics with ``output_mean_var``."""
    return 3 if attrs.output_mean_var else 1


def _bn_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    inputs, outputs = _channel_shapes(shapes, attrs.axis, "BatchNorm")
    if attrs.output_mean_var:
        outputs += [inputs[1], inputs[1]]
    return inputs, outputs


def _bn_kernel(xp: Any, attrs: Attrs, data: Any, gamma: Any, beta: Any, moving_mean: Any,
               moving_var: Any) -> Any:
    axis = normalize_axis(attrs.axis, data.ndim, "BatchNorm axis")
    inv_std = 1.0 / xp.sqrt(moving_var + moving_var.dtype.type(attrs.eps))
    scale = inv_std if attrs.fix_gamma else gamma * inv_std
    shift = beta - moving_mean * scale
    compute = xp.result_type(data.dtype, scale.dtype)
    output = (data.astype(compute, copy=False) * _along(scale, data.ndim, axis)
              + _along(shift, data.ndim, axis)).astype(data.dtype, copy=False)
    if attrs.output_mean_var:
        return output, moving_mean.copy(), inv_std.astype(moving_var.dtype, copy=False)
    return output


def batchnorm_pass(xp: Any, attrs: Attrs, inputs: list[Any], out: Any,
                   workspace: Any = None) -> batchnorm_kernel.BatchNormCall | None:
    """BatchNorm on the CPU as one compiled pass (`batchnorm_kernel`), which a clamp after it
    folds into; None where it does not apply (a GPU, the statistics as outputs, another axis,
    arrays the kernel does not take). With the plan's ``workspace``, a pass that may hand its
    output to bf16 products as their pairs."""
    if xp is not np or attrs.output_mean_var or inputs[0].ndim < 2 \
            or normalize_axis(attrs.axis, inputs[0].ndim, "BatchNorm axis") != 1:
        return None
    return batchnorm_kernel.bind(*inputs, attrs.eps, attrs.fix_gamma, out, workspace)


def _bn_bind(xp: Any, attrs: Attrs, inputs: list[Any], out: Any, workspace: Any = None) -> list:
    call = batchnorm_pass(xp, attrs, inputs, out, workspace)
    return [call] if call is not None else [partial(BATCH_NORM.compute, xp, attrs, inputs, out)]


# What BatchNorm shares with its legacy and synchronised variants (batchnorm_variants, legacy_v1).
BATCH_NORM_STATISTICS = (
    Param("eps", parse_float, 1e-3),
    Param("momentum", parse_float, 0.9),
    Param("fix_gamma", parse_bool, True),
    Param("use_global_stats", parse_bool, False),
    Param("output_mean_var", parse_bool, False),
)

BATCH_NORM = register(OpDef(
    name="BatchNorm",
    aliases=("_npx_batch_norm",),
    params=(
        *BATCH_NORM_STATISTICS,
        Param("axis", parse_int, 1),
        Param("cudnn_off", parse_bool, False),
        Param("min_calib_range", optional(parse_float), None),
        Param("max_calib_range", optional(parse_float), None),
    ),
    inputs=("data", "gamma", "beta", "moving_mean", "moving_var"),
    aux=("moving_mean", "moving_var"),
    outputs=_bn_outputs,
    hidden_outputs=_stats_hidden,
    infer_shape=_bn_shape,
    infer_dtype=_norm_dtype(_stats_visible),
    kernel=_bn_kernel,
    bind=_bn_bind,
    scratch=lambda attrs, shapes, dtype: 0,  # none, but the bind takes the plan's workspace
    doc="Batch normalisation with the moving statistics (inference); fix_gamma ignores gamma.",
))


# --- LayerNorm -------------------------------------------------------------------------------

def _mean_var_outputs(attrs: Attrs) -> tuple[str, ...]:
    return ("output", "mean", "std") if attrs.output_mean_var else ("output",)


def _ln_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    inputs, outputs = _channel_shapes(shapes, attrs.axis, "LayerNorm")
    data = inputs[0]
    if attrs.output_mean_var:
        stats: MaybeShape = None
        if data is not None:
            axis = normalize_axis(attrs.axis, len(data), "LayerNorm axis")
            stats = (*data[:axis], 1, *data[axis + 1:])
        outputs += [stats, stats]
    return inputs, outputs


def _ln_kernel(xp: Any, attrs: Attrs, data: Any, gamma: Any, beta: Any) -> Any:
    axis = normalize_axis(attrs.axis, data.ndim, "LayerNorm axis")
    mean = data.mean(axis=axis, keepdims=True)
    centred = data - mean
    std = xp.sqrt((centred * centred).mean(axis=axis, keepdims=True) + data.dtype.type(attrs.eps))
    output = centred / std * _along(gamma, data.ndim, axis) + _along(beta, data.ndim, axis)
    output = output.astype(data.dtype, copy=False)
    return (output, mean, std) if attrs.output_mean_var else output


LAYER_NORM = register(OpDef(
    name="LayerNorm",
    aliases=("_npx_layer_norm",),
    params=(
        Param("axis", parse_int, -1),
        Param("eps", parse_float, 1e-5),
        Param("output_mean_var", parse_bool, False),
    ),
    inputs=("data", "gamma", "beta"),
    outputs=_mean_var_outputs,
    hidden_outputs=_stats_hidden,
    infer_shape=_ln_shape,
    infer_dtype=_norm_dtype(_stats_visible),
    kernel=_ln_kernel,
    doc="Layer normalisation over one axis; output_mean_var adds the mean and sqrt(var + eps).",
))


# --- InstanceNorm and GroupNorm --------------------------------------------------------------

def _instance_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    if shapes[0] is not None and len(shapes[0]) < 3:
        raise ShapeError(f"InstanceNorm: data must have at least 3 dims (N, C, ...); "
                         f"got {shapes[0]}")
    return _channel_shapes(shapes, 1, "InstanceNorm")


def _instance_kernel(xp: Any, attrs: Attrs, data: Any, gamma: Any, beta: Any) -> Any:
    axes = tuple(range(2, data.ndim))
    mean = data.mean(axis=axes, keepdims=True)
    centred = data - mean
    var = (centred * centred).mean(axis=axes, keepdims=True)
    output = centred / xp.sqrt(var + data.dtype.type(attrs.eps))
    output = output * _along(gamma, data.ndim, 1) + _along(beta, data.ndim, 1)
    return output.astype(data.dtype, copy=False)


INSTANCE_NORM = register(OpDef(
    name="InstanceNorm",
    params=(Param("eps", parse_float, 1e-3),),
    inputs=("data", "gamma", "beta"),
    hidden_outputs=2,
    infer_shape=_instance_shape,
    infer_dtype=_norm_dtype(1),
    kernel=_instance_kernel,
    doc="Instance normalisation: each (sample, channel) over its spatial axes.",
))


def _group_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    inputs, outputs = _channel_shapes(shapes, 1, "GroupNorm")
    data = inputs[0]
    if data is not None and data[1] and data[1] % attrs.num_groups:
        raise ShapeError(f"GroupNorm: channels {data[1]} are not divisible by num_groups "
                         f"{attrs.num_groups}")
    if attrs.output_mean_var:
        stats = None if data is None else (data[0], attrs.num_groups)
        outputs += [stats, stats]
    return inputs, outputs


def _group_kernel(xp: Any, attrs: Attrs, data: Any, gamma: Any, beta: Any) -> Any:
    batch, groups = data.shape[0], attrs.num_groups
    grouped = data.reshape(batch, groups, -1)
    mean = grouped.mean(axis=2, keepdims=True)
    centred = grouped - mean
    std = xp.sqrt((centred * centred).mean(axis=2, keepdims=True) + data.dtype.type(attrs.eps))
    output = (centred / std).reshape(data.shape)
    output = output * _along(gamma, data.ndim, 1) + _along(beta, data.ndim, 1)
    output = output.astype(data.dtype, copy=False)
    if attrs.output_mean_var:
        return output, mean.reshape(batch, groups), std.reshape(batch, groups)
    return output


GROUP_NORM = register(OpDef(
    name="GroupNorm",
    aliases=("_npx_group_norm",),
    params=(
        Param("num_groups", parse_int, 1),
        Param("eps", parse_float, 1e-5),
        Param("output_mean_var", parse_bool, False),
    ),
    inputs=("data", "gamma", "beta"),
    outputs=_mean_var_outputs,
    hidden_outputs=_stats_hidden,
    infer_shape=_group_shape,
    infer_dtype=_norm_dtype(_stats_visible),
    kernel=_group_kernel,
    doc="Group normalisation: channels split into num_groups, each normalised per sample.",
))


# --- L2Normalization and LRN -----------------------------------------------------------------

def _l2_axes(mode: str, ndim: int) -> tuple[int, ...]:
    if mode == "instance":
        return tuple(range(1, ndim))
    if mode == "channel":
        return (1,)
    return tuple(range(2, ndim))


def _l2_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    data = shapes[0]
    least = 2 if attrs.mode == "instance" else 3
    if data is not None and len(data) < least:
        raise ShapeError(f"L2Normalization mode {attrs.mode!r}: data needs at least {least} dims; "
                         f"got {data}")
    return shapes, [data]


def _l2_kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    axes = _l2_axes(attrs.mode, data.ndim)
    norm = xp.sqrt((data * data).sum(axis=axes, keepdims=True) + data.dtype.type(attrs.eps))
    return (data / norm).astype(data.dtype, copy=False)


L2_NORMALIZATION = register(OpDef(
    name="L2Normalization",
    params=(
        Param("eps", parse_float, 1e-10),
        Param("mode", choice("instance", "channel", "spatial"), "instance"),
    ),
    hidden_outputs=1,
    infer_shape=_l2_shape,
    kernel=_l2_kernel,
    doc="Divide by the L2 norm (eps inside the square root) per instance, channel or position.",
))


def _lrn_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    data = shapes[0]
    if data is not None and len(data) < 3:
        raise ShapeError(f"LRN: data must have at least 3 dims (N, C, ...); got {data}")
    return shapes, [data]


def _lrn_kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    channels, half = data.shape[1], attrs.nsize // 2
    pad = xp.zeros((data.shape[0], half, *data.shape[2:]), dtype=data.dtype)
    padded = xp.concatenate([pad, data * data, pad], axis=1)
    # Sum over the window offsets (nsize slices), never over channels one by one.
    window = padded[:, :channels].copy()
    for offset in range(1, 2 * half + 1):
        window += padded[:, offset:offset + channels]
    base = data.dtype.type(attrs.knorm) + data.dtype.type(attrs.alpha / attrs.nsize) * window
    return (data / base ** data.dtype.type(attrs.beta)).astype(data.dtype, copy=False)


LRN = register(OpDef(
    name="LRN",
    params=(
        Param("alpha", parse_float, 1e-4),
        Param("beta", parse_float, 0.75),
        Param("knorm", parse_float, 2.0),
        Param("nsize", parse_int),
    ),
    hidden_outputs=1,
    infer_shape=_lrn_shape,
    kernel=_lrn_kernel,
    doc="Local response normalisation across a window of nsize channels.",
))
