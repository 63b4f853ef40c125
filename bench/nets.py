"""Networks for benchmarks: the seed MLP, ResNet-18 v1, ResNet-50 v2 and MobileNet v2 built with
`engine.sym`.

Each builder returns a `Symbol` laid out as Gluon's model zoo lays it out (NCHW, BatchNorm with
``fix_gamma=False`` and eps 1e-5, ReLU6 as ``clip(0, 6)``). `random_params` fills every argument
and auxiliary state with random values scaled so activations stay finite through the depth, and
`torch_module` builds the same network in PyTorch from that one weight dict (torch is imported
lazily: it is a benchmark peer, not a project dependency).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine import sym
from engine.sym import Symbol

# MobileNet v2 (width 1.0): (expansion t, output channels, repeats, first stride) per stage.
MOBILENET_V2_STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
RESNET18_STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))  # (channels, first stride), 2 blocks


def mlp() -> Symbol:
    """The seed MLP: Dense 256-relu, Dense 128-relu, Dense 2 over a 512-wide input."""
    net = sym.var("data")
    for index, (width, act) in enumerate(((256, True), (128, True), (2, False))):
        net = sym.FullyConnected(net, num_hidden=width, name=f"dense{index}")
        if act:
            net = sym.Activation(net, act_type="relu", name=f"dense{index}_relu")
    return net


def _conv_bn(net: Symbol, name: str, channels: int, kernel: int, stride: int = 1,
             group: int = 1) -> Symbol:
    net = sym.Convolution(net, num_filter=channels, kernel=(kernel, kernel),
                          stride=(stride, stride), pad=(kernel // 2, kernel // 2),
                          num_group=group, no_bias=True, name=f"{name}_conv")
    return sym.BatchNorm(net, fix_gamma=False, eps=1e-5, name=f"{name}_bn")


def resnet18_v1(classes: int = 1000) -> Symbol:
    """ResNet-18 v1 (basic blocks, projection shortcut on stride or width change)."""
    net = sym.Activation(_conv_bn(sym.var("data"), "stem", 64, 7, 2), act_type="relu")
    net = sym.Pooling(net, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="max")
    in_channels = 64
    for stage, (channels, first_stride) in enumerate(RESNET18_STAGES):
        for block in range(2):
            stride = first_stride if block == 0 else 1
            name = f"stage{stage + 1}_block{block}"
            body = sym.Activation(_conv_bn(net, f"{name}_a", channels, 3, stride), act_type="relu")
            body = _conv_bn(body, f"{name}_b", channels, 3)
            shortcut = net
            if stride != 1 or in_channels != channels:
                shortcut = _conv_bn(net, f"{name}_down", channels, 1, stride)
            net = sym.Activation(body + shortcut, act_type="relu")
            in_channels = channels
    net = sym.Pooling(net, kernel=(1, 1), global_pool=True, pool_type="avg")
    return sym.FullyConnected(sym.Flatten(net), num_hidden=classes, name="output")


RESNET50_STAGES = ((256, 3, 1), (512, 4, 2), (1024, 6, 2), (2048, 3, 2))  # (out, blocks, stride)


def resnet50_v2(classes: int = 1000) -> Symbol:
    """ResNet-50 v2 (pre-activation bottlenecks: BN and ReLU before each convolution, the
    shortcut projected from the first block's activation on a stride or width change)."""
    net = sym.BatchNorm(sym.var("data"), fix_gamma=True, eps=1e-5, name="data_bn")
    net = sym.Convolution(net, num_filter=64, kernel=(7, 7), stride=(2, 2), pad=(3, 3),
                          no_bias=True, name="stem_conv")
    net = sym.Activation(sym.BatchNorm(net, fix_gamma=False, eps=1e-5, name="stem_bn"),
                         act_type="relu")
    net = sym.Pooling(net, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="max")
    in_channels = 64
    for stage, (channels, blocks, first_stride) in enumerate(RESNET50_STAGES):
        for block in range(blocks):
            stride = first_stride if block == 0 else 1
            name = f"stage{stage + 1}_block{block}"
            act = sym.Activation(sym.BatchNorm(net, fix_gamma=False, eps=1e-5,
                                               name=f"{name}_bn1"), act_type="relu")
            shortcut = net
            if stride != 1 or in_channels != channels:
                shortcut = sym.Convolution(act, num_filter=channels, kernel=(1, 1),
                                           stride=(stride, stride), no_bias=True,
                                           name=f"{name}_down")
            body = sym.Convolution(act, num_filter=channels // 4, kernel=(1, 1), no_bias=True,
                                   name=f"{name}_conv1")
            body = sym.Activation(_conv_bn_input(body, f"{name}_bn2"), act_type="relu")
            body = sym.Convolution(body, num_filter=channels // 4, kernel=(3, 3),
                                   stride=(stride, stride), pad=(1, 1), no_bias=True,
                                   name=f"{name}_conv2")
            body = sym.Activation(_conv_bn_input(body, f"{name}_bn3"), act_type="relu")
            body = sym.Convolution(body, num_filter=channels, kernel=(1, 1), no_bias=True,
                                   name=f"{name}_conv3")
            net = body + shortcut
            in_channels = channels
    net = sym.Activation(sym.BatchNorm(net, fix_gamma=False, eps=1e-5, name="last_bn"),
                         act_type="relu")
    net = sym.Pooling(net, kernel=(1, 1), global_pool=True, pool_type="avg")
    return sym.FullyConnected(sym.Flatten(net), num_hidden=classes, name="output")


def _conv_bn_input(net: Symbol, name: str) -> Symbol:
    return sym.BatchNorm(net, fix_gamma=False, eps=1e-5, name=name)


def _relu6(net: Symbol) -> Symbol:
    return sym.clip(net, a_min=0.0, a_max=6.0)


def mobilenet_v2(classes: int = 1000) -> Symbol:
    """MobileNet v2 width 1.0 as Gluon builds it (an expansion 1x1 conv even where t = 1)."""
    net = _relu6(_conv_bn(sym.var("data"), "stem", 32, 3, 2))
    in_channels = 32
    for stage, (expand, channels, repeats, first_stride) in enumerate(MOBILENET_V2_STAGES):
        for block in range(repeats):
            stride = first_stride if block == 0 else 1
            name = f"stage{stage}_block{block}"
            hidden = in_channels * expand
            body = _relu6(_conv_bn(net, f"{name}_expand", hidden, 1))
            body = _relu6(_conv_bn(body, f"{name}_dw", hidden, 3, stride, group=hidden))
            body = _conv_bn(body, f"{name}_project", channels, 1)
            net = body + net if stride == 1 and in_channels == channels else body
            in_channels = channels
    net = _relu6(_conv_bn(net, "last", 1280, 1))
    net = sym.Pooling(net, kernel=(1, 1), global_pool=True, pool_type="avg")
    net = sym.Convolution(net, num_filter=classes, kernel=(1, 1), no_bias=True, name="pred")
    return sym.Flatten(net)


def random_params(net: Symbol, data_shape: tuple[int, ...], seed: int = 0
                  ) -> dict[str, np.ndarray]:
    """Random float32 arguments and aux states: He-scaled weights, BatchNorm near identity."""
    rng = np.random.default_rng(seed)
    arg_shapes, _, aux_shapes = net.infer_shape(data=data_shape)
    shapes = {**dict(zip(net.list_arguments(), arg_shapes)),
              **dict(zip(net.list_auxiliary_states(), aux_shapes))}
    params = {}
    for name, shape in shapes.items():
        if name == "data":
            continue
        if name.endswith("_weight"):
            fan_in = int(np.prod(shape[1:]))
            value = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        elif name.endswith(("_gamma", "_moving_var")):
            value = rng.uniform(0.5, 1.5, shape)
        else:  # bias, beta, moving_mean
            value = rng.uniform(-0.1, 0.1, shape)
        params[name] = value.astype(np.float32)
    return params


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise SystemExit("this benchmark compares against PyTorch on the CPU, which is not a "
                         "project dependency; install it into the venv first: "
                         ".venv/bin/pip install torch==2.13.0") from None
    return torch


class _TorchBuilder:
    """Creates torch layers whose weights come from one MXNet-named parameter dict."""

    def __init__(self, params: dict[str, np.ndarray]) -> None:
        self.torch = _torch()
        self.params = params

    def tensor(self, name: str) -> Any:
        return self.torch.from_numpy(np.ascontiguousarray(self.params[name]))

    def conv_bn(self, name: str, stride: int = 1, group: int = 1) -> Any:
        nn = self.torch.nn
        weight = self.params[f"{name}_conv_weight"]
        conv = nn.Conv2d(weight.shape[1] * group, weight.shape[0], weight.shape[2], stride,
                         weight.shape[2] // 2, groups=group, bias=False)
        conv.weight.data = self.tensor(f"{name}_conv_weight")
        bn = nn.BatchNorm2d(weight.shape[0], eps=1e-5)
        for field, suffix in (("weight", "gamma"), ("bias", "beta"),
                              ("running_mean", "moving_mean"), ("running_var", "moving_var")):
            getattr(bn, field).data = self.tensor(f"{name}_bn_{suffix}")
        return nn.Sequential(conv, bn)

    def module(self, forward: Callable[..., Any], **children: Any) -> Any:
        """An nn.Module holding ``children`` whose forward is ``forward(self, x)``."""
        nn = self.torch.nn
        cls = type("Net", (nn.Module,), {"forward": forward})
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        for name, child in children.items():
            setattr(module, name, child)
        return module.eval()


def torch_resnet18_v1(params: dict[str, np.ndarray]) -> Any:
    """PyTorch ResNet-18 v1 with the weights of `resnet18_v1`'s ``params``."""
    build = _TorchBuilder(params)
    torch, nn = build.torch, build.torch.nn

    def block_forward(self: Any, x: Any) -> Any:
        body = self.b(torch.relu(self.a(x)))
        return torch.relu(body + (self.down(x) if self.down is not None else x))

    blocks = []
    in_channels = 64
    for stage, (channels, first_stride) in enumerate(RESNET18_STAGES):
        for block in range(2):
            stride = first_stride if block == 0 else 1
            name = f"stage{stage + 1}_block{block}"
            down = (build.conv_bn(f"{name}_down", stride)
                    if stride != 1 or in_channels != channels else None)
            blocks.append(build.module(block_forward, a=build.conv_bn(f"{name}_a", stride),
                                       b=build.conv_bn(f"{name}_b"), down=down))
            in_channels = channels
    output = nn.Linear(*params["output_weight"].shape[::-1])
    output.weight.data = build.tensor("output_weight")
    output.bias.data = build.tensor("output_bias")
    return nn.Sequential(build.conv_bn("stem", 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1), *blocks,
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), output).eval()


def torch_mobilenet_v2(params: dict[str, np.ndarray]) -> Any:
    """PyTorch MobileNet v2 with the weights of `mobilenet_v2`'s ``params``."""
    build = _TorchBuilder(params)
    nn = build.torch.nn

    def block_forward(self: Any, x: Any) -> Any:
        out = self.body(x)
        return out + x if self.residual else out

    layers = [build.conv_bn("stem", 2), nn.ReLU6()]
    in_channels = 32
    for stage, (expand, channels, repeats, first_stride) in enumerate(MOBILENET_V2_STAGES):
        for block in range(repeats):
            stride = first_stride if block == 0 else 1
            name = f"stage{stage}_block{block}"
            hidden = in_channels * expand
            body = nn.Sequential(build.conv_bn(f"{name}_expand"), nn.ReLU6(),
                                 build.conv_bn(f"{name}_dw", stride, hidden), nn.ReLU6(),
                                 build.conv_bn(f"{name}_project"))
            module = build.module(block_forward, body=body)
            module.residual = stride == 1 and in_channels == channels
            layers.append(module)
            in_channels = channels
    pred = nn.Conv2d(1280, params["pred_weight"].shape[0], 1, bias=False)
    pred.weight.data = build.tensor("pred_weight")
    layers += [build.conv_bn("last"), nn.ReLU6(), nn.AdaptiveAvgPool2d(1), pred, nn.Flatten()]
    return nn.Sequential(*layers).eval()
