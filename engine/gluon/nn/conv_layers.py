"""Convolution and pooling layers: ``Conv1D/2D/3D``, ``Conv2DTranspose``, ``MaxPool*``,
``AvgPool*``, ``GlobalMaxPool*``, ``GlobalAvgPool*`` — with MXNet 1.9's node attributes."""

from __future__ import annotations

from typing import Any

from engine.gluon.hybrid import HybridBlock
from engine.gluon.nn.activations import Activation


def _tuple(value: Any, count: int) -> tuple[int, ...]:
    return (int(value),) * count if isinstance(value, int) else tuple(int(v) for v in value)


class _Conv(HybridBlock):
    """Shared convolution/deconvolution layer (weight shape from layout, groups and kernel)."""

    def __init__(self, channels: int, kernel_size: Any, strides: Any, padding: Any,
                 dilation: Any, groups: int, layout: str, in_channels: int = 0,
                 activation: str | None = None, use_bias: bool = True,
                 weight_initializer: Any = None, bias_initializer: Any = "zeros",
                 op_name: str = "Convolution", adj: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        dims = len(layout) - 2
        kernel = _tuple(kernel_size, dims)
        self._op_name = op_name
        self._kwargs: dict[str, Any] = {
            "kernel": kernel, "stride": _tuple(strides, dims), "dilate": _tuple(dilation, dims),
            "pad": _tuple(padding, dims), "num_filter": channels, "num_group": groups,
            "no_bias": not use_bias, "layout": layout}
        if adj is not None:
            self._kwargs["adj"] = _tuple(adj, dims)
        if op_name == "Deconvolution":
            weight_shape = (in_channels, channels // groups, *kernel)
        elif layout.index("C") == 1:
            weight_shape = (channels, in_channels // groups, *kernel)
        else:
            weight_shape = (channels, *kernel, in_channels // groups)
        with self.name_scope():
            self.weight = self.params.get("weight", shape=weight_shape, init=weight_initializer,
                                          allow_deferred_init=True)
            self.bias = (self.params.get("bias", shape=(channels,), init=bias_initializer,
                                         allow_deferred_init=True) if use_bias else None)
            self.act = Activation(activation, prefix=activation + "_") if activation else None

    def _alias(self) -> str:
        return "conv"

    def hybrid_forward(self, F: Any, x: Any, weight: Any, bias: Any = None) -> Any:  # noqa: N803
        op = getattr(F, self._op_name)
        if bias is None:
            out = op(x, weight, name="fwd", **self._kwargs)
        else:
            out = op(x, weight, bias, name="fwd", **self._kwargs)
        return self.act(out) if self.act is not None else out


class Conv1D(_Conv):
    """1-D convolution over ``NCW`` data."""

    def __init__(self, channels: int, kernel_size: Any, strides: Any = 1, padding: Any = 0,
                 dilation: Any = 1, groups: int = 1, layout: str = "NCW", activation: Any = None,
                 use_bias: bool = True, weight_initializer: Any = None,
                 bias_initializer: Any = "zeros", in_channels: int = 0, **kwargs: Any) -> None:
        super().__init__(channels, kernel_size, strides, padding, dilation, groups, layout,
                         in_channels, activation, use_bias, weight_initializer,
                         bias_initializer, **kwargs)


class Conv2D(_Conv):
    """2-D convolution over ``NCHW`` (or ``NHWC``) data."""

    def __init__(self, channels: int, kernel_size: Any, strides: Any = (1, 1),
                 padding: Any = (0, 0), dilation: Any = (1, 1), groups: int = 1,
                 layout: str = "NCHW", activation: Any = None, use_bias: bool = True,
                 weight_initializer: Any = None, bias_initializer: Any = "zeros",
                 in_channels: int = 0, **kwargs: Any) -> None:
        super().__init__(channels, kernel_size, strides, padding, dilation, groups, layout,
                         in_channels, activation, use_bias, weight_initializer,
                         bias_initializer, **kwargs)


class Conv3D(_Conv):
    """3-D convolution over ``NCDHW`` data."""

    def __init__(self, channels: int, kernel_size: Any, strides: Any = (1, 1, 1),
                 padding: Any = (0, 0, 0), dilation: Any = (1, 1, 1), groups: int = 1,
                 layout: str = "NCDHW", activation: Any = None, use_bias: bool = True,
                 weight_initializer: Any = None, bias_initializer: Any = "zeros",
                 in_channels: int = 0, **kwargs: Any) -> None:
        super().__init__(channels, kernel_size, strides, padding, dilation, groups, layout,
                         in_channels, activation, use_bias, weight_initializer,
                         bias_initializer, **kwargs)


class Conv2DTranspose(_Conv):
    """2-D transposed convolution (``Deconvolution``)."""

    def __init__(self, channels: int, kernel_size: Any, strides: Any = (1, 1),
                 padding: Any = (0, 0), output_padding: Any = (0, 0), dilation: Any = (1, 1),
                 groups: int = 1, layout: str = "NCHW", activation: Any = None,
                 use_bias: bool = True, weight_initializer: Any = None,
                 bias_initializer: Any = "zeros", in_channels: int = 0, **kwargs: Any) -> None:
        super().__init__(channels, kernel_size, strides, padding, dilation, groups, layout,
                         in_channels, activation, use_bias, weight_initializer,
                         bias_initializer, op_name="Deconvolution", adj=output_padding,
                         **kwargs)
        self.outpad = _tuple(output_padding, 2)


class _Pooling(HybridBlock):
    """Shared pooling layer."""

    def __init__(self, pool_size: Any, strides: Any, padding: Any, ceil_mode: bool,
                 global_pool: bool, pool_type: str, layout: str,
                 count_include_pad: bool | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        dims = len(layout) - 2
        kernel = _tuple(pool_size, dims)
        self._kwargs: dict[str, Any] = {
            "kernel": kernel, "stride": kernel if strides is None else _tuple(strides, dims),
            "pad": _tuple(padding, dims), "global_pool": global_pool, "pool_type": pool_type,
            "layout": layout, "pooling_convention": "full" if ceil_mode else "valid"}
        if count_include_pad is not None:
            self._kwargs["count_include_pad"] = count_include_pad

    def _alias(self) -> str:
        return "pool"

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        return F.Pooling(x, name="fwd", **self._kwargs)


def _pool_class(name: str, dims: int, pool_type: str, layout: str) -> type[_Pooling]:
    def __init__(self: _Pooling, pool_size: Any = (2,) * dims, strides: Any = None,
                 padding: Any = 0, layout: str = layout, ceil_mode: bool = False,
                 count_include_pad: bool = True, **kwargs: Any) -> None:
        _Pooling.__init__(self, pool_size, strides, padding, ceil_mode, False, pool_type,
                          layout, count_include_pad if pool_type == "avg" else None, **kwargs)

    doc = f"{dims}-D {pool_type} pooling over ``{layout}`` data."
    return type(name, (_Pooling,), {"__init__": __init__, "__doc__": doc})


def _global_class(name: str, dims: int, pool_type: str, layout: str) -> type[_Pooling]:
    def __init__(self: _Pooling, layout: str = layout, **kwargs: Any) -> None:
        _Pooling.__init__(self, (1,) * dims, None, 0, True, True, pool_type, layout, **kwargs)

    doc = f"Global {pool_type} pooling over the spatial axes of ``{layout}`` data."
    return type(name, (_Pooling,), {"__init__": __init__, "__doc__": doc})


MaxPool1D = _pool_class("MaxPool1D", 1, "max", "NCW")
MaxPool2D = _pool_class("MaxPool2D", 2, "max", "NCHW")
MaxPool3D = _pool_class("MaxPool3D", 3, "max", "NCDHW")
AvgPool1D = _pool_class("AvgPool1D", 1, "avg", "NCW")
AvgPool2D = _pool_class("AvgPool2D", 2, "avg", "NCHW")
AvgPool3D = _pool_class("AvgPool3D", 3, "avg", "NCDHW")
GlobalMaxPool1D = _global_class("GlobalMaxPool1D", 1, "max", "NCW")
GlobalMaxPool2D = _global_class("GlobalMaxPool2D", 2, "max", "NCHW")
GlobalMaxPool3D = _global_class("GlobalMaxPool3D", 3, "max", "NCDHW")
GlobalAvgPool1D = _global_class("GlobalAvgPool1D", 1, "avg", "NCW")
GlobalAvgPool2D = _global_class("GlobalAvgPool2D", 2, "avg", "NCHW")
GlobalAvgPool3D = _global_class("GlobalAvgPool3D", 3, "avg", "NCDHW")
