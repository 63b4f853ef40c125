"""Activation operators: Activation, LeakyReLU, the softmax family, loss heads and Dropout.

Kernels are written against ``xp`` (numpy or cupy) and avoid overflow warnings: sigmoid, softrelu
and elu are evaluated in forms that never exponentiate a large positive number.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import (
    choice,
    optional,
    parse_bool,
    parse_dtype,
    parse_float,
    parse_int,
    parse_int_tuple,
)
from engine.ops.math.stable_functions import erf, sigmoid, softrelu
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import merge, normalize_axis

ShapeResult = tuple[list[MaybeShape], list[MaybeShape]]
DTypeResult = tuple[list["np.dtype | None"], list["np.dtype | None"]]

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_LAMBDA = 1.0507009873554804934193349852946
def _floating(x: Any) -> Any:
    # Integer inputs compute in float32, as MXNet's float kernels would after a cast.
    return x if x.dtype.kind in "fc" else x.astype(np.float32)


# --- Activation ------------------------------------------------------------------------------

_ACTIVATIONS: dict[str, Any] = {
    "relu": lambda xp, x: xp.maximum(x, 0),
    "sigmoid": sigmoid,
    "log_sigmoid": lambda xp, x: -softrelu(xp, -x),
    "mish": lambda xp, x: x * xp.tanh(softrelu(xp, x)),
    "tanh": lambda xp, x: xp.tanh(x),
    "softrelu": softrelu,
    "softsign": lambda xp, x: x / (1 + xp.abs(x)),
}


def _same_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    return shapes, [shapes[0]]


# C expressions of each act_type over the input ``a``, for fused GPU kernels.
_ACTIVATION_EXPRESSIONS = {
    "relu": "(a > 0 ? a : 0)",
    "sigmoid": "1 / (1 + exp(-a))",
    "log_sigmoid": "-log1p(exp(-a))",
    "mish": "a * tanh(log1p(exp(a)))",
    "tanh": "tanh(a)",
    "softrelu": "log1p(exp(a))",
    "softsign": "a / (1 + fabs(a))",
}


def _activation_kernel(xp: Any, attrs: Attrs, data: Any, out: Any = None) -> Any:
    if attrs.act_type == "relu" and data.dtype.kind == "f":
        return xp.maximum(data, 0, out=out)  # the common case, written straight into ``out``
    result = _ACTIVATIONS[attrs.act_type](xp, _floating(data)).astype(data.dtype, copy=False)
    if out is None:
        return result
    xp.copyto(out, result)
    return out


# NumPy's float `clip` loop is vectorised and its `maximum`-with-a-scalar loop is not (a
# 64×56×56 ReLU: 35 vs 82 µs), but `clip` costs ~3 µs more per call: it wins past this size.
CLIP_RELU_MIN_SIZE = 4096


def _activation_bind(xp: Any, attrs: Attrs, inputs: list[Any], out: Any) -> list:
    data = inputs[0]
    if attrs.act_type == "relu" and data.dtype.kind == "f":
        zero = data.dtype.type(0)
        if data.size >= CLIP_RELU_MIN_SIZE:
            return [partial(xp.clip, data, zero, data.dtype.type("inf"), out=out)]
        return [partial(xp.maximum, data, zero, out=out)]
    return [partial(_activation_kernel, xp, attrs, data, out=out)]


ACTIVATION = register(OpDef(
    name="Activation",
    aliases=("_npx_activation",),
    params=(Param("act_type", choice(*_ACTIVATIONS)),),
    infer_shape=_same_shape,
    kernel=_activation_kernel,
    elementwise=lambda attrs: _ACTIVATION_EXPRESSIONS[attrs.act_type],
    inplace=True,
    writes_out=True,
    bind=_activation_bind,
    doc="Elementwise activation chosen by act_type (relu, sigmoid, tanh, softrelu, softsign...).",
))


# --- LeakyReLU -------------------------------------------------------------------------------

def _leaky_inputs(attrs: Attrs) -> tuple[str, ...]:
    return ("data", "gamma") if attrs.act_type == "prelu" else ("data",)


def _leaky_outputs(attrs: Attrs) -> tuple[str, ...]:
    return ("output", "mask") if attrs.act_type == "rrelu" else ("output",)


def _leaky_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    data = shapes[0]
    outputs = [data, data] if attrs.act_type == "rrelu" else [data]
    if attrs.act_type != "prelu":
        return shapes, outputs
    gamma = shapes[1]
    if gamma is None and data is not None:
        if len(data) < 2:
            raise ShapeError(f"LeakyReLU prelu: data must have a channel axis 1; got {data}")
        gamma = (data[1],)
    return [data, gamma], outputs


def _leaky_dtype(attrs: Attrs, dtypes: list[np.dtype | None]) -> DTypeResult:
    known = next((dtype for dtype in dtypes if dtype is not None), None)
    inputs = [known if dtype is None else dtype for dtype in dtypes]
    return inputs, [inputs[0]] * len(_leaky_outputs(attrs))


def _prelu_gamma(gamma: Any, ndim: int) -> Any:
    if gamma.size == 1 or ndim < 2:
        return gamma.reshape(())
    shape = [1] * ndim
    shape[1] = -1
    return gamma.reshape(shape)


def _leaky_kernel(xp: Any, attrs: Attrs, data: Any, gamma: Any = None) -> Any:
    x = _floating(data)
    kind = attrs.act_type
    if kind == "leaky":
        y = xp.where(x > 0, x, x * x.dtype.type(attrs.slope))
    elif kind == "prelu":
        y = xp.where(x > 0, x, x * _prelu_gamma(gamma, x.ndim).astype(x.dtype, copy=False))
    elif kind == "elu":
        y = xp.where(x > 0, x, x.dtype.type(attrs.slope) * xp.expm1(xp.minimum(x, 0)))
    elif kind == "selu":
        negative = x.dtype.type(SELU_ALPHA) * xp.expm1(xp.minimum(x, 0))
        y = x.dtype.type(SELU_LAMBDA) * xp.where(x > 0, x, negative)
    elif kind == "gelu":
        y = x * x.dtype.type(0.5) * (1 + erf(xp, x * x.dtype.type(1 / math.sqrt(2.0))))
    else:  # rrelu at inference: the mean slope; the mask output is undefined, we give the slope.
        slope = x.dtype.type((attrs.lower_bound + attrs.upper_bound) / 2)
        y = xp.where(x > 0, x, x * slope)
        return y.astype(data.dtype, copy=False), xp.full(data.shape, slope, dtype=data.dtype)
    return y.astype(data.dtype, copy=False)


LEAKY_RELU = register(OpDef(
    name="LeakyReLU",
    params=(
        Param("act_type", choice("leaky", "prelu", "elu", "selu", "gelu", "rrelu"), "leaky"),
        Param("slope", parse_float, 0.25),
        Param("lower_bound", parse_float, 0.125),
        Param("upper_bound", parse_float, 0.334),
    ),
    inputs=_leaky_inputs,
    outputs=_leaky_outputs,
    infer_shape=_leaky_shape,
    infer_dtype=_leaky_dtype,
    kernel=_leaky_kernel,
    doc="Leaky ReLU family: leaky, prelu (gamma over axis 1), elu (alpha=slope), selu, gelu, "
        "rrelu (mean slope at inference).",
))


# --- softmax, log_softmax, softmin -----------------------------------------------------------

def _softmax_inputs(attrs: Attrs) -> tuple[str, ...]:
    return ("data", "length") if attrs.use_length else ("data",)


def _softmax_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    data = shapes[0]
    if data is not None:
        normalize_axis(attrs.axis, len(data), "softmax axis")
    if not attrs.use_length:
        return shapes, [data]
    length = shapes[1]
    if data is not None:
        axis = normalize_axis(attrs.axis, len(data), "softmax axis")
        length = merge(length, (*data[:axis], *data[axis + 1:]), "softmax length")
    return [data, length], [data]


def _softmax_dtype(attrs: Attrs, dtypes: list[np.dtype | None]) -> DTypeResult:
    data = dtypes[0]
    inputs = list(dtypes)
    if attrs.use_length and inputs[1] is None:
        inputs[1] = np.dtype(np.int32)
    out = attrs.dtype if attrs.dtype is not None else data
    return inputs, [out]


def _valid_mask(xp: Any, data_shape: tuple[int, ...], axis: int, length: Any) -> Any:
    """Boolean mask, True where the position along ``axis`` is below the row's length."""
    positions = xp.arange(data_shape[axis]).reshape(
        [-1 if dim == axis else 1 for dim in range(len(data_shape))])
    return positions < xp.expand_dims(length.astype(np.int64), axis)


def _softmax_core(xp: Any, attrs: Attrs, data: Any, length: Any, kind: str) -> Any:
    out_dtype = attrs.dtype if attrs.dtype is not None else data.dtype
    # Half precision accumulates in float32, as MXNet's softmax kernels do.
    compute = np.result_type(_floating(data).dtype, out_dtype, np.float32)
    x = data.astype(compute, copy=False)
    axis = normalize_axis(attrs.axis, x.ndim, "softmax axis")
    if kind == "softmin":
        x = -x
    if attrs.temperature is not None and attrs.temperature != 1.0:
        x = x / x.dtype.type(attrs.temperature)
    mask = None if length is None else _valid_mask(xp, x.shape, axis, length)
    if mask is not None:
        x = xp.where(mask, x, -xp.inf)
    peak = x.max(axis=axis, keepdims=True)
    if mask is not None:
        peak = xp.where(xp.isfinite(peak), peak, 0)
    shifted = x - peak
    exps = xp.exp(shifted)
    total = exps.sum(axis=axis, keepdims=True)
    if kind == "log_softmax":
        safe = xp.where(total > 0, total, 1)
        result = shifted - xp.log(safe)
    else:
        result = exps / xp.where(total > 0, total, 1)
    if mask is not None:
        result = xp.where(mask, result, 0)
    return result.astype(out_dtype, copy=False)


def _softmax_params() -> tuple[Param, ...]:
    return (
        Param("axis", parse_int, -1),
        Param("temperature", optional(parse_float), None),
        Param("dtype", optional(parse_dtype), None),
        Param("use_length", optional(parse_bool), False),
    )


def _register_softmax(name: str, kind: str, aliases: tuple[str, ...], doc: str) -> OpDef:
    def kernel(xp: Any, attrs: Attrs, data: Any, length: Any = None) -> Any:
        return _softmax_core(xp, attrs, data, length, kind)

    return register(OpDef(
        name=name, aliases=aliases, params=_softmax_params(), inputs=_softmax_inputs,
        infer_shape=_softmax_shape, infer_dtype=_softmax_dtype, kernel=kernel, doc=doc))


SOFTMAX = _register_softmax(
    "softmax", "softmax", ("_npx_softmax",),
    "Softmax along axis (logits divided by temperature); use_length zeroes positions >= length.")
LOG_SOFTMAX = _register_softmax(
    "log_softmax", "log_softmax", ("_npx_log_softmax",), "Log of softmax along axis.")
SOFTMIN = _register_softmax("softmin", "softmin", (), "Softmax of the negated input along axis.")


def _plain_softmax(xp: Any, x: Any, axis: int) -> Any:
    shifted = x - x.max(axis=axis, keepdims=True)
    exps = xp.exp(shifted)
    return exps / exps.sum(axis=axis, keepdims=True)


def _softmax_activation_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    data = shapes[0]
    if attrs.mode == "channel" and data is not None and len(data) < 3:
        raise ShapeError(f"SoftmaxActivation mode='channel' needs data with at least 3 axes "
                         f"(batch, channel, positions...); got shape {data}")
    return shapes, [data]


def _softmax_activation_kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    # MXNet views the data as a matrix of (everything but the last axis, the last axis) in
    # instance mode (its FlatTo2D), so each row of the last axis is one softmax, whatever the
    # rank; channel mode softmaxes over axis 1 at every position.
    x = _floating(data)
    axis = 1 if attrs.mode == "channel" else x.ndim - 1
    return _plain_softmax(xp, x, axis).astype(data.dtype, copy=False)


SOFTMAX_ACTIVATION = register(OpDef(
    name="SoftmaxActivation",
    params=(Param("mode", choice("instance", "channel"), "instance"),),
    infer_shape=_softmax_activation_shape,
    kernel=_softmax_activation_kernel,
    doc="Softmax over the last axis (instance) or over channels, axis 1 (channel).",
))


# --- loss heads (inference forward only) -----------------------------------------------------

def _softmax_output_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    data, label = shapes
    if data is not None and label is None:
        if attrs.multi_output:
            label = (data[0], *data[2:])
        else:
            label = tuple(data[:-1])
    return [data, label], [data]


def _softmax_output_kernel(xp: Any, attrs: Attrs, data: Any, label: Any) -> Any:
    x = _floating(data)
    if attrs.preserve_shape:
        result = _plain_softmax(xp, x, x.ndim - 1)
    elif attrs.multi_output:
        result = _plain_softmax(xp, x, 1)
    else:
        result = _plain_softmax(xp, x.reshape(x.shape[0], -1), 1).reshape(x.shape)
    return result.astype(data.dtype, copy=False)


def _label_dtype(attrs: Attrs, dtypes: list[np.dtype | None]) -> DTypeResult:
    data, label = dtypes
    if data is None:
        data = label
    return [data, data if label is None else label], [data]


SOFTMAX_OUTPUT = register(OpDef(
    name="SoftmaxOutput",
    aliases=("Softmax",),
    params=(
        Param("grad_scale", parse_float, 1.0),
        Param("ignore_label", parse_float, -1.0),
        Param("multi_output", parse_bool, False),
        Param("use_ignore", parse_bool, False),
        Param("preserve_shape", parse_bool, False),
        Param("normalization", choice("null", "batch", "valid"), "null"),
        Param("out_grad", parse_bool, False),
        Param("smooth_alpha", parse_float, 0.0),
    ),
    inputs=("data", "label"),
    infer_shape=_softmax_output_shape,
    infer_dtype=_label_dtype,
    kernel=_softmax_output_kernel,
    doc="Softmax head: over (N, -1) by default, axis 1 with multi_output, the last axis with "
        "preserve_shape; the label is ignored at inference.",
))


def _regression_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    data, label = shapes
    if label is None:
        label = data
    return [data, label], [data]


def _register_regression(name: str, transform: Any, doc: str) -> OpDef:
    def kernel(xp: Any, attrs: Attrs, data: Any, label: Any) -> Any:
        return transform(xp, _floating(data)).astype(data.dtype, copy=False)

    return register(OpDef(
        name=name, params=(Param("grad_scale", parse_float, 1.0),), inputs=("data", "label"),
        infer_shape=_regression_shape, infer_dtype=_label_dtype, kernel=kernel, doc=doc))


LINEAR_REGRESSION_OUTPUT = _register_regression(
    "LinearRegressionOutput", lambda xp, x: x.copy(), "Identity at inference (L2 loss head).")
MAE_REGRESSION_OUTPUT = _register_regression(
    "MAERegressionOutput", lambda xp, x: x.copy(), "Identity at inference (L1 loss head).")
LOGISTIC_REGRESSION_OUTPUT = _register_regression(
    "LogisticRegressionOutput", sigmoid, "Sigmoid at inference (logistic loss head).")


# --- Dropout ---------------------------------------------------------------------------------

def _dropout_kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    if attrs.mode != "always" or attrs.p <= 0:
        return data.copy()
    # mode="always" drops even at inference; the mask is shared along ``axes``.
    shape = list(data.shape)
    for axis in attrs.axes:
        shape[normalize_axis(axis, data.ndim, "Dropout axes")] = 1
    keep = 1.0 - attrs.p
    mask = (xp.random.random_sample(tuple(shape)) < keep).astype(data.dtype)
    return (data * mask / data.dtype.type(keep)).astype(data.dtype, copy=False)


DROPOUT = register(OpDef(
    name="Dropout",
    aliases=("_npx_dropout",),
    params=(
        Param("p", parse_float, 0.5),
        Param("mode", choice("training", "always"), "training"),
        Param("axes", parse_int_tuple, ()),
        Param("cudnn_off", optional(parse_bool), False),
    ),
    hidden_outputs=1,
    infer_shape=_same_shape,
    kernel=_dropout_kernel,
    inplace=True,
    doc="Identity at inference (mode='training'); mode='always' drops with probability p.",
))
