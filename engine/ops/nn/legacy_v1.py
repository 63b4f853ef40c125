"""MXNet's pre-1.0 operators ``Convolution_v1``, ``Pooling_v1`` and ``BatchNorm_v1``.

Old exports still name them. Their attributes are a subset of today's operators' and their
inference results match (checked against MXNet 1.9.1's own ``_v1`` kernels in
``tests/fixtures/mxnet_extra``), so each record is today's record under the old name, with
BatchNorm_v1 reading its channels from axis 1 as it has no ``axis`` attribute, and Pooling_v1
counting no hidden outputs.
"""

from __future__ import annotations

from dataclasses import replace

from engine.ops.nn.batchnorm_variants import on_channel_axis
from engine.ops.nn.conv import CONVOLUTION
from engine.ops.nn.norm import BATCH_NORM, BATCH_NORM_STATISTICS
from engine.ops.nn.pool import POOLING
from engine.ops.registry import register

register(replace(CONVOLUTION, name="Convolution_v1", aliases=(),
                 doc="Pre-1.0 Convolution: " + CONVOLUTION.doc))
# Pooling_v1 never had Pooling's hidden workspace output for max pooling.
register(replace(POOLING, name="Pooling_v1", aliases=(), hidden_outputs=0,
                 doc="Pre-1.0 Pooling: " + POOLING.doc))
register(replace(
    BATCH_NORM,
    name="BatchNorm_v1",
    aliases=(),
    params=BATCH_NORM_STATISTICS,
    outputs=on_channel_axis(BATCH_NORM.outputs),
    hidden_outputs=on_channel_axis(BATCH_NORM.hidden_outputs),
    infer_shape=on_channel_axis(BATCH_NORM.infer_shape),
    infer_dtype=on_channel_axis(BATCH_NORM.infer_dtype),
    kernel=lambda xp, attrs, *inputs: on_channel_axis(
        lambda bn_attrs: BATCH_NORM.kernel(xp, bn_attrs, *inputs))(attrs),
    bind=None,
    doc="Pre-1.0 BatchNorm (channels on axis 1) with the moving statistics.",
))
