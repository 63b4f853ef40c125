"""BatchNorm under other names: ``_contrib_SyncBatchNorm`` (GluonCV exports of models trained
across devices) and ``_contrib_BatchNormWithReLU`` (BatchNorm followed by ReLU).

At inference both are BatchNorm with the moving statistics, so each record delegates to
BatchNorm's; SyncBatchNorm has no ``axis`` (channels are axis 1) and adds ``ndev``/``key``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from engine.ops.attrs import parse_int, parse_str
from engine.ops.nn.norm import BATCH_NORM, BATCH_NORM_STATISTICS, batchnorm_pass
from engine.ops.registry import Attrs, Param, register


def on_channel_axis(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function(attrs, ...)`` called with BatchNorm's attributes: axis 1 and the defaults."""
    defaults = {"axis": 1, "cudnn_off": False, "min_calib_range": None, "max_calib_range": None}

    def adapted(attrs: Attrs, *args: Any) -> Any:
        return function(Attrs({**defaults, **attrs}), *args)

    return adapted


def _sync_kernel(xp: Any, attrs: Attrs, *inputs: Any) -> Any:
    return on_channel_axis(lambda bn_attrs: BATCH_NORM.kernel(xp, bn_attrs, *inputs))(attrs)


def _visible(attrs: Attrs) -> int:
    return 3 if attrs.output_mean_var else 1


register(replace(
    BATCH_NORM,
    name="_contrib_SyncBatchNorm",
    aliases=(),
    params=(
        *BATCH_NORM_STATISTICS,
        Param("ndev", parse_int, 1),
        Param("key", parse_str),
    ),
    outputs=on_channel_axis(BATCH_NORM.outputs),
    hidden_outputs=on_channel_axis(BATCH_NORM.hidden_outputs),
    infer_shape=on_channel_axis(BATCH_NORM.infer_shape),
    infer_dtype=on_channel_axis(BATCH_NORM.infer_dtype),
    kernel=_sync_kernel,
    bind=None,
    doc="Cross-device BatchNorm; at inference, BatchNorm on axis 1 with the moving statistics.",
))


def _with_relu_kernel(xp: Any, attrs: Attrs, *inputs: Any) -> Any:
    result = BATCH_NORM.kernel(xp, attrs, *inputs)
    if isinstance(result, tuple):
        return (xp.maximum(result[0], 0), *result[1:])
    return xp.maximum(result, 0)


def _with_relu_bind(xp: Any, attrs: Attrs, inputs: list[Any], out: Any,
                    workspace: Any = None) -> list:
    """BatchNorm's compiled pass with the ReLU as its clamp where it applies, else the
    kernel."""
    call = batchnorm_pass(xp, attrs, inputs, out, workspace)
    if call is not None:
        return [call.clamped(out.dtype.type(0), out.dtype.type(np.inf))]
    return [partial(BATCH_NORM_WITH_RELU.compute, xp, attrs, inputs, out)]


BATCH_NORM_WITH_RELU = register(replace(
    BATCH_NORM,
    name="_contrib_BatchNormWithReLU",
    aliases=(),
    hidden_outputs=lambda attrs: 4 - _visible(attrs),
    kernel=_with_relu_kernel,
    bind=_with_relu_bind,
    doc="BatchNorm (moving statistics) followed by ReLU on the normalised output.",
))
