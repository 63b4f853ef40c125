"""int8/uint8 values rescaled per channel into uint8 over a calibrated range: a BatchNorm with
the relu after it (``_quantized_batch_norm_relu``, ResNet v2's pre-activation) and a relu
alone (``_quantized_relu``, after a residual sum the int8 graph writes signed). Our ops, not
MXNet's: its ``quantize_net`` runs both in float between a dequantize and a quantize; here the
integers are scaled and shifted once into the next layer's uint8 steps, the uint8 saturation
at 0 being the relu. Bound in a plan, each is `kernels.int8_affine`'s pass inside the
channels-last hand-off (`handoff`), or none at all where the fused convolution writing its
data writes its output too (`handoff.Rescale`: ResNet v2's residual product)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.kernels import int8_affine
from engine.ops.dtypes import FLOAT32, UINT8
from engine.ops.nn import norm
from engine.ops.quantized import handoff, integer, ranges
from engine.ops.quantized.layers import batchnorm_into, batchnorm_shapes, batchnorm_terms
from engine.ops.quantized.ranges import CALIB_PARAMS, F32, INT8, RANGE_OUTPUTS
from engine.ops.registry import Attrs, OpDef, register

BATCHNORM_RELU_OP = "_quantized_batch_norm_relu"
RELU_OP = "_quantized_relu"

Terms = Callable[[Any, Any], tuple[np.ndarray, np.ndarray]]  # (min, max) -> (scale, shift)


class _Int8Rescale:
    """A bound rescale on `int8_affine`'s pass, its per-channel terms made once per data
    range. In a plan it takes its data's hand-off and offers its output's; where both are
    there it asks its data's writer to write its output too (`handoff.ask_rescaled`), and
    runs no pass in a run where the writer did."""

    def __init__(self, attrs: Attrs, data: np.ndarray, data_range: tuple[Any, Any],
                 terms: Terms, targets: tuple[Any, ...], workspace: Any, path: str) -> None:
        self.data, self.data_range, self.terms, self.targets = data, data_range, terms, targets
        self.path = path
        self.scale = np.zeros(data.shape[1], np.float32)
        self.shift = np.zeros(data.shape[1], np.float32)
        self.out_range = ranges.range_pair(attrs.min_calib_range, attrs.max_calib_range)
        self.data_handoff = handoff.take(workspace, data)
        self.out_handoff = handoff.offer(workspace, targets[0])
        self.asked = None if self.out_handoff is None else handoff.ask_rescaled(
            workspace, self.data_handoff, handoff.Rescale(terms, targets[0], self.out_handoff),
            len(targets))
        self._key: Any = None
        self._jobs: dict[tuple[bool, bool], Any] = {}
        # the data's range as memoryviews (items read without NumPy's indexing) and the
        # output range's bytes: in a plan's run each NumPy call costs microseconds cold
        self._range_views = tuple(memoryview(np.asarray(value).reshape(-1))
                                  for value in data_range)
        self._range_writers = tuple(ranges.constant_writer(target, value) for target, value
                                    in zip(targets[1:3], self.out_range, strict=True))

    def __call__(self) -> None:
        written = None if self.asked is None else self.asked.written
        if written is None or written != self._key:
            low, high = self.data_range
            key = (self._range_views[0][0], self._range_views[1][0])
            if key != self._key:
                self.scale[:], self.shift[:] = self.terms(low, high)
                self._key = key
        out_laid = self.out_handoff is not None and self.out_handoff.taken
        # the writer wrote the output (channels-last: only where out_laid) for the data's
        # range it wrote (the range these terms are for, whenever they are the last made)
        if written is not None and written == self._key:
            integer.PATHS["int8_rescaled_by_writer"] += 1
        else:
            layouts = (self.data_handoff is not None and self.data_handoff.laid, out_laid)
            if layouts not in self._jobs:
                self._jobs[layouts] = int8_affine.affine_job(self.data, self.scale,
                                                             self.shift, self.targets[0],
                                                             *layouts)
            self._jobs[layouts]()
            integer.PATHS[self.path] += 1
        if self.out_handoff is not None:
            self.out_handoff.laid = out_laid
            integer.PATHS["int8_channels_last_handoff"] += out_laid
        for write in self._range_writers:
            write()


def _steps(rescale: _Int8Rescale) -> list[Any]:
    """The plan's steps for ``rescale``: itself, or none where its data's writer granted its
    ask and runs it at the end of the writer's own step (`handoff.Rescale.follow`)."""
    asked = rescale.asked
    if asked is None or rescale.data_handoff is None or not rescale.data_handoff.runs_follower:
        return [rescale]
    asked.follow = rescale
    return []


def _bindable(xp: Any, attrs: Attrs, data: Any, target: Any) -> bool:
    """Whether a node runs on the pass: on the CPU, calibrated, 4-D int8/uint8 data into a
    uint8 output, both contiguous."""
    return (xp is np and int8_affine.available() and ranges.has_calib(attrs)
            and data.ndim == 4 and data.dtype in (INT8, UINT8) and target.dtype == UINT8
            and data.flags.c_contiguous and target.flags.c_contiguous)


def _batchnorm_relu_bind(xp: Any, attrs: Attrs, inputs: list[Any], out: Any,
                         workspace: Any = None) -> list[Any]:
    """On the CPU with constant statistics (a plan's parameters), one compiled pass in the
    hand-off's layouts; otherwise the kernel runs."""
    data, gamma, beta, mean, var, low, high = inputs
    targets = out if isinstance(out, tuple) else (out,)
    constant = all(not np.asarray(value).flags.writeable for value in (gamma, beta, mean, var))
    if not (constant and attrs.axis % 4 == 1 and _bindable(xp, attrs, data, targets[0])):
        return [partial(QUANTIZED_BATCHNORM_RELU.compute, xp, attrs, inputs, out)]
    return _steps(_Int8Rescale(attrs, data, (low, high), lambda low, high: batchnorm_terms(
        attrs, data.dtype, low, high, gamma, beta, mean, var, UINT8), targets, workspace,
        "int8_batchnorm_relu"))


QUANTIZED_BATCHNORM_RELU = register(OpDef(
    name=BATCHNORM_RELU_OP,
    params=norm.BATCH_NORM.params,  # which holds min_calib_range and max_calib_range
    inputs=("data", "gamma", "beta", "moving_mean", "moving_var", "min_data", "max_data"),
    outputs=RANGE_OUTPUTS,
    infer_shape=batchnorm_shapes,
    infer_dtype=lambda attrs, dtypes: ([dtypes[0], *[FLOAT32] * 6], [UINT8, FLOAT32, FLOAT32]),
    kernel=ranges.on_host(batchnorm_into(BATCHNORM_RELU_OP, UINT8)),
    bind=_batchnorm_relu_bind,
    scratch=lambda attrs, shapes, dtype: 0,  # none: declared for the plan's workspace
    uncapturable=ranges.ON_HOST,
    doc="Inference BatchNorm and the relu after it on int8/uint8 data, uint8 out over the "
        "relu's calibrated range (its saturation at 0 is the relu).",
))


def _relu_scale(attrs: Attrs, dtype: np.dtype, low: Any, high: Any) -> F32:
    """uint8 steps over the calibrated output range per step of ``dtype`` over the data's."""
    in_reach = ranges.max_abs(ranges.scalar(low), ranges.scalar(high))
    out_reach = ranges.max_abs(attrs.min_calib_range, attrs.max_calib_range)
    return F32(F32(in_reach / ranges.QUANTIZED_RANGE[np.dtype(dtype)])
               * F32(ranges.UINT8_RANGE / out_reach))


def _relu_kernel(xp: Any, attrs: Attrs, data: Any, low: Any, high: Any) -> Any:
    values = np.asarray(data)
    ranges.check_quantized(values, "data", RELU_OP)
    if not ranges.has_calib(attrs):
        raise ShapeError(f"{RELU_OP}: needs min_calib_range and max_calib_range (the uint8 "
                         "output's range)")
    # + 0.0 as the compiled pass adds its zero shift: -0.0 becomes 0.0, the same bytes
    result = values.astype(np.float32) * _relu_scale(attrs, values.dtype, low, high) + F32(0)
    return ranges.saturate_round(result, UINT8), *ranges.range_pair(attrs.min_calib_range,
                                                                    attrs.max_calib_range)


def _relu_bind(xp: Any, attrs: Attrs, inputs: list[Any], out: Any,
               workspace: Any = None) -> list[Any]:
    """On the CPU, one compiled pass (every channel one scale, no shift) in the hand-off's
    layouts; otherwise the kernel runs."""
    data, low, high = inputs
    targets = out if isinstance(out, tuple) else (out,)
    if not _bindable(xp, attrs, data, targets[0]):
        return [partial(QUANTIZED_RELU.compute, xp, attrs, inputs, out)]
    channels = data.shape[1]
    return _steps(_Int8Rescale(attrs, data, (low, high), lambda low, high: (
        np.full(channels, _relu_scale(attrs, data.dtype, low, high), np.float32),
        np.zeros(channels, np.float32)), targets, workspace, "int8_relu"))


QUANTIZED_RELU = register(OpDef(
    name=RELU_OP,
    params=CALIB_PARAMS,
    inputs=("data", "min_data", "max_data"),
    outputs=RANGE_OUTPUTS,
    infer_shape=lambda attrs, shapes: ([shapes[0], (1,), (1,)], [shapes[0], (1,), (1,)]),
    infer_dtype=lambda attrs, dtypes: ([dtypes[0], FLOAT32, FLOAT32], [UINT8, FLOAT32,
                                                                       FLOAT32]),
    kernel=ranges.on_host(_relu_kernel),
    bind=_relu_bind,
    scratch=lambda attrs, shapes, dtype: 0,  # none: declared for the plan's workspace
    uncapturable=ranges.ON_HOST,
    doc="relu on int8/uint8 data, uint8 out over the calibrated range (the saturation at 0 "
        "is the relu).",
))

handoff.register_reader(BATCHNORM_RELU_OP, lambda reader: (
    reader.position == 0 and reader.attrs.axis == 1 and ranges.has_calib(reader.attrs)))
handoff.register_reader(RELU_OP, lambda reader: (
    reader.position == 0 and ranges.has_calib(reader.attrs)))
