"""Vision models with the Gluon model zoo's structure and names: ResNet v1/v2, MobileNet v2.

Parameter and node names match MXNet's (``resnetv10_stage1_conv0_weight``,
``mobilenetv20_features_linearbottleneck0_conv0_weight``), so weights exported from MXNet's zoo
load with ``load_parameters``. No pretrained weights are downloaded: ``pretrained=True`` raises.

Example:
    >>> net = get_model("resnet18_v1", classes=10); net.initialize(); net.hybridize()
"""

from __future__ import annotations

from typing import Any

from engine.gluon.hybrid import HybridBlock
from engine.gluon.nn import (
    Activation,
    BatchNorm,
    Conv2D,
    Dense,
    Flatten,
    GlobalAvgPool2D,
    HybridSequential,
    MaxPool2D,
)


def _conv3x3(channels: int, stride: int, in_channels: int) -> Conv2D:
    return Conv2D(channels, 3, stride, 1, use_bias=False, in_channels=in_channels)


class BasicBlockV1(HybridBlock):
    """Two 3x3 convolutions with a residual connection (post-activation)."""

    def __init__(self, channels: int, stride: int, downsample: bool = False,
                 in_channels: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.body = HybridSequential(prefix="")
        self.body.add(_conv3x3(channels, stride, in_channels), BatchNorm(), Activation("relu"),
                      _conv3x3(channels, 1, channels), BatchNorm())
        self.downsample = _projection(channels, stride, in_channels) if downsample else None

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        residual = self.downsample(x) if self.downsample is not None else x
        return F.Activation(residual + self.body(x), act_type="relu")


class BottleneckV1(HybridBlock):
    """1x1-3x3-1x1 bottleneck with a residual connection (post-activation)."""

    def __init__(self, channels: int, stride: int, downsample: bool = False,
                 in_channels: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        quarter = channels // 4
        self.body = HybridSequential(prefix="")
        self.body.add(Conv2D(quarter, 1, stride), BatchNorm(), Activation("relu"),
                      _conv3x3(quarter, 1, quarter), BatchNorm(), Activation("relu"),
                      Conv2D(channels, 1, 1), BatchNorm())
        self.downsample = _projection(channels, stride, in_channels) if downsample else None

    hybrid_forward = BasicBlockV1.hybrid_forward


def _projection(channels: int, stride: int, in_channels: int) -> HybridSequential:
    projection = HybridSequential(prefix="")
    projection.add(Conv2D(channels, 1, stride, use_bias=False, in_channels=in_channels),
                   BatchNorm())
    return projection


class BasicBlockV2(HybridBlock):
    """Pre-activation basic block."""

    def __init__(self, channels: int, stride: int, downsample: bool = False,
                 in_channels: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bn1 = BatchNorm()
        self.conv1 = _conv3x3(channels, stride, in_channels)
        self.bn2 = BatchNorm()
        self.conv2 = _conv3x3(channels, 1, channels)
        self.downsample = (Conv2D(channels, 1, stride, use_bias=False, in_channels=in_channels)
                           if downsample else None)

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        residual = x
        x = F.Activation(self.bn1(x), act_type="relu")
        if self.downsample is not None:
            residual = self.downsample(x)
        x = F.Activation(self.bn2(self.conv1(x)), act_type="relu")
        return self.conv2(x) + residual


class BottleneckV2(HybridBlock):
    """Pre-activation bottleneck block."""

    def __init__(self, channels: int, stride: int, downsample: bool = False,
                 in_channels: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        quarter = channels // 4
        self.bn1 = BatchNorm()
        self.conv1 = Conv2D(quarter, 1, 1, use_bias=False)
        self.bn2 = BatchNorm()
        self.conv2 = _conv3x3(quarter, stride, quarter)
        self.bn3 = BatchNorm()
        self.conv3 = Conv2D(channels, 1, 1, use_bias=False)
        self.downsample = (Conv2D(channels, 1, stride, use_bias=False, in_channels=in_channels)
                           if downsample else None)

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        residual = x
        x = F.Activation(self.bn1(x), act_type="relu")
        if self.downsample is not None:
            residual = self.downsample(x)
        x = F.Activation(self.bn2(self.conv1(x)), act_type="relu")
        x = F.Activation(self.bn3(self.conv2(x)), act_type="relu")
        return self.conv3(x) + residual


def _make_stage(block: type[HybridBlock], layers: int, channels: int, stride: int, index: int,
                in_channels: int) -> HybridSequential:
    stage = HybridSequential(prefix=f"stage{index}_")
    with stage.name_scope():
        stage.add(block(channels, stride, channels != in_channels, in_channels=in_channels,
                        prefix=""))
        for _ in range(layers - 1):
            stage.add(block(channels, 1, False, in_channels=channels, prefix=""))
    return stage


class ResNetV1(HybridBlock):
    """ResNet v1 (He et al., 2015)."""

    def __init__(self, block: type[HybridBlock], layers: list[int], channels: list[int],
                 classes: int = 1000, thumbnail: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = HybridSequential(prefix="")
            _stem(self.features, channels[0], thumbnail)
            for index, count in enumerate(layers):
                self.features.add(_make_stage(block, count, channels[index + 1],
                                              1 if index == 0 else 2, index + 1,
                                              channels[index]))
            self.features.add(GlobalAvgPool2D())
            self.output = Dense(classes, in_units=channels[-1])

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        return self.output(self.features(x))


class ResNetV2(HybridBlock):
    """ResNet v2 (pre-activation, He et al., 2016)."""

    def __init__(self, block: type[HybridBlock], layers: list[int], channels: list[int],
                 classes: int = 1000, thumbnail: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = HybridSequential(prefix="")
            self.features.add(BatchNorm(scale=False, center=False))
            _stem(self.features, channels[0], thumbnail)
            in_channels = channels[0]
            for index, count in enumerate(layers):
                self.features.add(_make_stage(block, count, channels[index + 1],
                                              1 if index == 0 else 2, index + 1, in_channels))
                in_channels = channels[index + 1]
            self.features.add(BatchNorm(), Activation("relu"), GlobalAvgPool2D(), Flatten())
            self.output = Dense(classes, in_units=in_channels)

    hybrid_forward = ResNetV1.hybrid_forward


def _stem(features: HybridSequential, channels: int, thumbnail: bool) -> None:
    if thumbnail:
        features.add(_conv3x3(channels, 1, 0))
    else:
        features.add(Conv2D(channels, 7, 2, 3, use_bias=False), BatchNorm(), Activation("relu"),
                     MaxPool2D(3, 2, 1))


class RELU6(HybridBlock):
    """``clip(x, 0, 6)``."""

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        return F.clip(x, a_min=0, a_max=6, name="fwd")


def _add_conv(out: HybridSequential, channels: int = 1, kernel: int = 1, stride: int = 1,
              pad: int = 0, num_group: int = 1, active: bool = True, relu6: bool = False) -> None:
    out.add(Conv2D(channels, kernel, stride, pad, groups=num_group, use_bias=False),
            BatchNorm(scale=True))
    if active:
        out.add(RELU6() if relu6 else Activation("relu"))


class LinearBottleneck(HybridBlock):
    """MobileNet v2's inverted residual: expand 1x1, depthwise 3x3, project 1x1."""

    def __init__(self, in_channels: int, channels: int, t: int, stride: int,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.use_shortcut = stride == 1 and in_channels == channels
        with self.name_scope():
            self.out = HybridSequential()
            _add_conv(self.out, in_channels * t, relu6=True)
            _add_conv(self.out, in_channels * t, kernel=3, stride=stride, pad=1,
                      num_group=in_channels * t, relu6=True)
            _add_conv(self.out, channels, active=False, relu6=True)

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        out = self.out(x)
        return F.elemwise_add(out, x) if self.use_shortcut else out


class MobileNetV2(HybridBlock):
    """MobileNet v2 (Sandler et al., 2018) with a width ``multiplier``."""

    def __init__(self, multiplier: float = 1.0, classes: int = 1000, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        scale = [int(width * multiplier) for width in
                 [32, 16] + [24] * 2 + [32] * 3 + [64] * 4 + [96] * 3 + [160] * 3 + [320]]
        expansions = [1] + [6] * 16
        strides = [1, 2] * 2 + [1, 1, 2] + [1] * 6 + [2] + [1] * 3
        with self.name_scope():
            self.features = HybridSequential(prefix="features_")
            with self.features.name_scope():
                _add_conv(self.features, int(32 * multiplier), kernel=3, stride=2, pad=1,
                          relu6=True)
                for in_c, out_c, t, stride in zip(scale[:-1], scale[1:], expansions, strides):
                    self.features.add(LinearBottleneck(in_c, out_c, t, stride))
                last = int(1280 * multiplier) if multiplier > 1.0 else 1280
                _add_conv(self.features, last, relu6=True)
                self.features.add(GlobalAvgPool2D())
            self.output = HybridSequential(prefix="output_")
            with self.output.name_scope():
                self.output.add(Conv2D(classes, 1, use_bias=False, prefix="pred_"), Flatten())

    hybrid_forward = ResNetV1.hybrid_forward


RESNET_SPEC = {18: ("basic", [2, 2, 2, 2], [64, 64, 128, 256, 512]),
               34: ("basic", [3, 4, 6, 3], [64, 64, 128, 256, 512]),
               50: ("bottle", [3, 4, 6, 3], [64, 256, 512, 1024, 2048]),
               101: ("bottle", [3, 4, 23, 3], [64, 256, 512, 1024, 2048]),
               152: ("bottle", [3, 8, 36, 3], [64, 256, 512, 1024, 2048])}
_BLOCKS = {(1, "basic"): BasicBlockV1, (1, "bottle"): BottleneckV1,
           (2, "basic"): BasicBlockV2, (2, "bottle"): BottleneckV2}


def get_resnet(version: int, num_layers: int, pretrained: bool = False,
               **kwargs: Any) -> HybridBlock:
    """ResNet v``version`` with ``num_layers`` layers (18, 34, 50, 101, 152)."""
    _no_pretrained(pretrained)
    if num_layers not in RESNET_SPEC or version not in (1, 2):
        raise ValueError(f"no ResNet v{version} with {num_layers} layers; layers are "
                         f"{', '.join(map(str, RESNET_SPEC))} and versions 1, 2")
    kind, layers, channels = RESNET_SPEC[num_layers]
    network = ResNetV1 if version == 1 else ResNetV2
    return network(_BLOCKS[(version, kind)], layers, channels, **kwargs)


def get_mobilenet_v2(multiplier: float, pretrained: bool = False, **kwargs: Any) -> HybridBlock:
    """MobileNet v2 with width ``multiplier``."""
    _no_pretrained(pretrained)
    return MobileNetV2(multiplier, **kwargs)


def _no_pretrained(pretrained: bool) -> None:
    if pretrained:
        raise ValueError("pretrained weights are not bundled; build the model and call "
                         "load_parameters() with MXNet's .params file")


_MODELS: dict[str, Any] = {
    **{f"resnet{n}_v{v}": (lambda v=v, n=n, **kw: get_resnet(v, n, **kw))
       for v in (1, 2) for n in RESNET_SPEC},
    **{f"mobilenetv2_{m}": (lambda m=m, **kw: get_mobilenet_v2(float(m), **kw))
       for m in ("1.0", "0.75", "0.5", "0.25")}}


def get_model(name: str, **kwargs: Any) -> HybridBlock:
    """A model by its zoo name (``resnet18_v1``, ``resnet50_v2``, ``mobilenetv2_1.0``, ...)."""
    key = name.lower()
    if key not in _MODELS:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(sorted(_MODELS))}")
    return _MODELS[key](**kwargs)


__all__ = ["MobileNetV2", "ResNetV1", "ResNetV2", "get_mobilenet_v2", "get_model",
           "get_resnet"]
