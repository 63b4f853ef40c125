"""Tiny instances of the model families MXNet users serve, built from GluonCV and GluonNLP.

Where a library constructor fixes full widths (a ResNet-50 backbone, 64-channel stems) the model
is assembled from the same library's blocks at small widths instead; each builder's docstring
says which. Nothing here downloads weights.
"""

from __future__ import annotations

from collections import OrderedDict

import mxnet as mx
import numpy as np
from gluoncv.model_zoo.center_net import CenterNet
from gluoncv.model_zoo.deeplabv3 import _ASPP
from gluoncv.model_zoo.fastscnn import FastSCNN
from gluoncv.model_zoo.fcn import _FCNHead
from gluoncv.model_zoo.mobilenetv3 import _MobileNetV3
from gluoncv.model_zoo.rcnn.faster_rcnn import FasterRCNN
from gluoncv.model_zoo.resnest import Bottleneck as SplatBottleneck
from gluoncv.model_zoo.resnetv1b import BasicBlockV1b, BottleneckV1b
from gluoncv.model_zoo.resnext import Block as ResNextBlock
from gluoncv.model_zoo.simple_pose.simple_pose_resnet import SimplePoseResNet
from gluoncv.model_zoo.yolo.yolo3 import YOLOV3
from mxnet.gluon import nn
from mxnet.gluon.model_zoo.vision.resnet import BasicBlockV1

Batches = list[dict[str, np.ndarray]]


def conv_bn_relu(channels: int, strides: int = 1) -> nn.HybridSequential:
    """3x3 convolution, BatchNorm, ReLU."""
    block = nn.HybridSequential(prefix="")
    block.add(nn.Conv2D(channels, 3, strides=strides, padding=1, use_bias=False),
              nn.BatchNorm(), nn.Activation("relu"))
    return block


class Classifier(mx.gluon.HybridBlock):
    """stem -> residual blocks -> global average pool -> Dense: a frame for GluonCV's blocks."""

    def __init__(self, stem: nn.HybridBlock, blocks: list[nn.HybridBlock], classes: int = 5,
                 **kwargs: object) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.stem = stem
            self.blocks = nn.HybridSequential(prefix="")
            self.blocks.add(*blocks)
            self.pool = nn.GlobalAvgPool2D()
            self.flat = nn.Flatten()
            self.output = nn.Dense(classes)

    def hybrid_forward(self, F, x):  # noqa: N803 (Gluon's signature)
        return self.output(self.flat(self.pool(self.blocks(self.stem(x)))))


def downsample(channels: int, strides: int, avg_down: bool) -> nn.HybridSequential:
    """ResNet shortcut: 1x1 strided conv (v1b) or avg-pool then 1x1 conv (v1d's avg_down)."""
    block = nn.HybridSequential(prefix="")
    if avg_down:
        block.add(nn.AvgPool2D(pool_size=strides, strides=strides, ceil_mode=True,
                               count_include_pad=False))
        strides = 1
    block.add(nn.Conv2D(channels, 1, strides=strides, use_bias=False), nn.BatchNorm())
    return block


def build_resnet_v1b() -> mx.gluon.HybridBlock:
    """GluonCV's BasicBlockV1b and BottleneckV1b (ResNetV1b fixes 64..512 widths)."""
    norm = {"norm_layer": nn.BatchNorm}
    return Classifier(conv_bn_relu(8, strides=2), [
        BasicBlockV1b(8, **norm),
        BottleneckV1b(4, strides=2, downsample=downsample(16, 2, False), **norm)])


def build_resnet_v1_wide() -> mx.gluon.HybridBlock:
    """MXNet's model zoo BasicBlockV1 at ResNet-18's first width (64 channels), 32x32 and 16x16:
    the widths from which the engine runs 3x3 convolutions as Winograd."""
    return Classifier(conv_bn_relu(64), [
        BasicBlockV1(64, 1, in_channels=64),
        BasicBlockV1(64, 2, downsample=True, in_channels=64)])


def build_resnet_v1d() -> mx.gluon.HybridBlock:
    """v1d: a deep three-conv stem and avg_down shortcuts, with GluonCV's V1b blocks."""
    norm = {"norm_layer": nn.BatchNorm}
    stem = nn.HybridSequential(prefix="")
    stem.add(conv_bn_relu(4, strides=2), conv_bn_relu(4), conv_bn_relu(8),
             nn.MaxPool2D(3, 2, 1))
    return Classifier(stem, [
        BasicBlockV1b(8, **norm),
        BottleneckV1b(4, strides=2, downsample=downsample(16, 2, True), **norm)])


def build_se_resnext() -> mx.gluon.HybridBlock:
    """GluonCV's ResNeXt Block with use_se (cardinality 4, squeeze-excitation)."""
    return Classifier(conv_bn_relu(16, strides=2), [
        ResNextBlock(4, 4, 16, 1, downsample=False, use_se=True),
        ResNextBlock(8, 4, 16, 2, downsample=True, use_se=True, avg_down=True)])


def build_resnest() -> mx.gluon.HybridBlock:
    """GluonCV's ResNeSt Bottleneck with split attention (radix 2, avd)."""
    splat = {"norm_layer": nn.BatchNorm, "use_splat": True, "radix": 2, "avd": True,
             "cardinality": 1, "bottleneck_width": 64}
    return Classifier(conv_bn_relu(16, strides=2), [
        SplatBottleneck(4, in_channels=16, **splat),
        SplatBottleneck(8, strides=2, in_channels=16, downsample=downsample(32, 2, True),
                        **splat)])


def build_mobilenet_v3() -> mx.gluon.HybridBlock:
    """GluonCV's _MobileNetV3 with a short config (hard swish, SE, 5x5 depthwise)."""
    config = [  # kernel, expansion, channels, squeeze-excite, activation, stride
        [3, 16, 8, True, "relu", 2],
        [3, 24, 8, False, "relu", 1],
        [5, 32, 16, True, "hard_swish", 2],
        [3, 48, 16, True, "hard_swish", 1],
    ]
    return _MobileNetV3(config, cls_ch_squeeze=32, cls_ch_expand=64, multiplier=0.5,
                        classes=5)


def image_batches(size: int, sizes: tuple[int, ...] = (1, 2)):
    """A batch-maker: uniform images of size x size, one batch per batch size."""
    def make(rng: np.random.Generator) -> Batches:
        return [{"data": rng.uniform(-1, 1, (batch, 3, size, size)).astype(np.float32)}
                for batch in sizes]
    return make


def build_yolo3() -> mx.gluon.HybridBlock:
    """GluonCV's YOLOV3 (three scales, decoder, per-class NMS) on three conv-BN stages."""
    stages = [nn.HybridSequential(prefix="") for _ in range(3)]
    stages[0].add(conv_bn_relu(8, 2), conv_bn_relu(8, 2), conv_bn_relu(16, 2))
    stages[1].add(conv_bn_relu(16, 2))
    stages[2].add(conv_bn_relu(32, 2))
    anchors = [[4, 6, 8, 8, 6, 4], [12, 16, 16, 12, 20, 20], [24, 30, 40, 36, 60, 50]]
    return YOLOV3(stages, [16, 16, 16], anchors, [8, 16, 32], classes=["a", "b", "c"],
                  alloc_size=(16, 16), nms_thresh=0.45, nms_topk=50, post_nms=20)


def build_center_net() -> mx.gluon.HybridBlock:
    """GluonCV's CenterNet (heatmap max-pool NMS, top-k decoder) on a stride-4 backbone."""
    base = nn.HybridSequential(prefix="")
    base.add(conv_bn_relu(8, 2), conv_bn_relu(16, 2), conv_bn_relu(16))
    heads = OrderedDict([("heatmap", {"num_output": 3, "bias": -2.19}),
                         ("wh", {"num_output": 2}), ("reg", {"num_output": 2})])
    return CenterNet(base, heads, classes=["a", "b", "c"], head_conv_channel=8, scale=4.0,
                     topk=10)


class Segmenter(mx.gluon.HybridBlock):
    """Backbone, a GluonCV head, bilinear upsampling to the input size (as SegBaseModel)."""

    def __init__(self, head: nn.HybridBlock, size: int, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.size = size
        with self.name_scope():
            self.backbone = nn.HybridSequential(prefix="")
            self.backbone.add(conv_bn_relu(8, 2), conv_bn_relu(16, 2), conv_bn_relu(16))
            self.head = head

    def hybrid_forward(self, F, x):  # noqa: N803 (Gluon's signature)
        logits = self.head(self.backbone(x))
        return F.contrib.BilinearResize2D(logits, height=self.size, width=self.size)


class DeepLabHead(mx.gluon.HybridBlock):
    """GluonCV's ASPP (atrous rates, image pooling branch) and a 1x1 classifier."""

    def __init__(self, classes: int, **kwargs: object) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.aspp = _ASPP(16, [2, 4, 6], nn.BatchNorm, None, height=8, width=8)
            self.classify = nn.Conv2D(classes, 1)

    def hybrid_forward(self, F, x):  # noqa: N803 (Gluon's signature)
        return self.classify(self.aspp(x))


def build_fcn() -> mx.gluon.HybridBlock:
    """GluonCV's _FCNHead (FCN has a ResNet-50 backbone built in) plus a 1x1 classifier."""
    head = nn.HybridSequential(prefix="")
    head.add(_FCNHead(16, 4))
    return Segmenter(head, 32)


def build_deeplab() -> mx.gluon.HybridBlock:
    """DeepLabV3's ASPP head from GluonCV on the tiny backbone (32x32 input)."""
    return Segmenter(DeepLabHead(4), 32)


def build_fast_scnn() -> mx.gluon.HybridBlock:
    """GluonCV's FastSCNN itself, 64x64 input, 4 classes, no auxiliary head."""
    return FastSCNN(4, aux=False, height=64, width=64)


def build_simple_pose() -> mx.gluon.HybridBlock:
    """GluonCV's SimplePoseResNet, narrow deconvs; its ResNet-18 is swapped for a tiny one."""
    net = SimplePoseResNet(base_name="resnet18_v1b", num_joints=4, num_deconv_layers=2,
                           num_deconv_filters=(8, 8), num_deconv_kernels=(4, 4))
    tiny = nn.HybridSequential(prefix="tinyresnet_")
    tiny.add(conv_bn_relu(8, 2), conv_bn_relu(16, 2), conv_bn_relu(16, 2))
    net.resnet = tiny
    return net


def build_faster_rcnn() -> mx.gluon.HybridBlock:
    """GluonCV's FasterRCNN (RPN proposals, ROIAlign, per-class NMS), stride-16 tiny backbone.

    Its graph fixes the batch size (``per_device_batch_size``) to 1, as GluonCV's exports do.
    """
    features = nn.HybridSequential(prefix="")
    features.add(conv_bn_relu(8, 2), conv_bn_relu(8, 2), conv_bn_relu(16, 2),
                 conv_bn_relu(16, 2))
    top = nn.HybridSequential(prefix="")
    top.add(conv_bn_relu(16))
    return FasterRCNN(features, top, classes=["a", "b", "c"], short=64, max_size=64,
                      roi_mode="align", roi_size=(4, 4), strides=16, clip=None, rpn_channel=16,
                      base_size=16, scales=(1, 2), ratios=(0.5, 1, 2), alloc_size=(8, 8),
                      rpn_nms_thresh=0.7, rpn_test_pre_nms=40, rpn_test_post_nms=12,
                      rpn_min_size=1, nms_thresh=0.5, nms_topk=40, post_nms=10,
                      per_device_batch_size=1, minimal_opset=True)


ROIS = 8  # proposals kept per image


class ClassicRCNN(mx.gluon.HybridBlock):
    """Faster R-CNN as MXNet's own example builds it (``example/rcnn``): an RPN whose
    ``contrib.Proposal`` turns anchor scores and deltas into ROIs, ``ROIPooling``, and class and
    box heads. Inputs: images and ``im_info`` (height, width, scale) per image. MultiProposal
    (Proposal's batched form) writes ROIS rows per image; the outputs are split per image."""

    def __init__(self, classes: int = 4, anchors: int = 6, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.anchors = anchors
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            self.features.add(conv_bn_relu(8, 2), conv_bn_relu(16, 2), conv_bn_relu(16, 2))
            self.rpn = nn.Conv2D(16, 3, padding=1, activation="relu")
            self.rpn_score = nn.Conv2D(2 * anchors, 1)
            self.rpn_deltas = nn.Conv2D(4 * anchors, 1)
            self.hidden = nn.Dense(16, activation="relu")
            self.class_score = nn.Dense(classes)
            self.box_deltas = nn.Dense(4 * classes)

    def hybrid_forward(self, F, data, im_info):  # noqa: N803 (Gluon's signature)
        feature = self.features(data)
        rpn = self.rpn(feature)
        score = F.reshape(self.rpn_score(rpn), (0, 2, -1, 0))
        probability = F.reshape(F.softmax(score, axis=1), (0, 2 * self.anchors, -1, 0))
        rois = F.contrib.MultiProposal(probability, self.rpn_deltas(rpn), im_info,
                                       feature_stride=8, scales=(2, 4), ratios=(0.5, 1, 2),
                                       rpn_pre_nms_top_n=60, rpn_post_nms_top_n=ROIS,
                                       threshold=0.7, rpn_min_size=4)
        pooled = F.ROIPooling(feature, rois, pooled_size=(3, 3), spatial_scale=0.125)
        hidden = self.hidden(pooled)
        # rows are image after image: (images, ROIS, ...), batch first as servers need
        return [F.reshape(value, (-4, -1, ROIS, -2)) for value in (
            rois, F.softmax(self.class_score(hidden)), self.box_deltas(hidden))]


def build_classic_rcnn() -> mx.gluon.HybridBlock:
    return ClassicRCNN()


def rcnn_batches(rng: np.random.Generator) -> Batches:
    """48x48 images (data0) and their im_info (data1; Gluon's export names the inputs so),
    a batch of one and a batch of two whose second image is cropped to 40x44."""
    return [{"data0": rng.uniform(-1, 1, (len(infos), 3, 48, 48)).astype(np.float32),
             "data1": np.array(infos, np.float32)}
            for infos in ([[48, 48, 1.0]], [[48, 48, 1.0], [40, 44, 1.0]])]
