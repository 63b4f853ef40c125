"""The conformance models' architectures, rebuilt with engine.gluon (see each meta.json)."""

from __future__ import annotations

from typing import Any

from engine.gluon import HybridBlock, nn, rnn


def seed_mlp() -> HybridBlock:
    """HybridSequential: Dense(256, relu), Dense(128, relu), Dense(2)."""
    net = nn.HybridSequential(prefix="seed_mlp_")
    with net.name_scope():
        net.add(nn.Dense(256, activation="relu"), nn.Dense(128, activation="relu"), nn.Dense(2))
    return net


class HybridNet(HybridBlock):
    """hidden Dense(10) -> F.relu -> output Dense(2)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.hidden = nn.Dense(10)
            self.output = nn.Dense(2)

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        return self.output(F.relu(self.hidden(x)))


def hybridnet() -> HybridBlock:
    """The seed's HybridNet."""
    return HybridNet(prefix="hybridnet_")


def lenet() -> HybridBlock:
    """[Conv2D(5)-BatchNorm-relu-MaxPool2D(2)] x2, Flatten, Dense 120/84/10."""
    net = nn.HybridSequential(prefix="lenet_")
    with net.name_scope():
        for channels in (6, 16):
            net.add(nn.Conv2D(channels, 5), nn.BatchNorm(), nn.Activation("relu"),
                    nn.MaxPool2D(2))
        net.add(nn.Flatten(), nn.Dense(120, activation="relu"), nn.Dense(84, activation="relu"),
                nn.Dense(10))
    return net


class BasicBlock(HybridBlock):
    """conv-BN-relu-conv-BN plus the (optionally projected) input, then relu."""

    def __init__(self, channels: int, stride: int, downsample: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.conv0 = nn.Conv2D(channels, 3, strides=stride, padding=1, use_bias=False)
            self.bn0 = nn.BatchNorm()
            self.conv1 = nn.Conv2D(channels, 3, padding=1, use_bias=False)
            self.bn1 = nn.BatchNorm()
            self.down = None
            if downsample:
                self.down = nn.HybridSequential(prefix="down_")
                with self.down.name_scope():
                    self.down.add(nn.Conv2D(channels, 1, strides=stride, use_bias=False),
                                  nn.BatchNorm())

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        residual = x
        x = F.Activation(self.bn0(self.conv0(x)), act_type="relu")
        x = self.bn1(self.conv1(x))
        if self.down is not None:
            residual = self.down(residual)
        return F.Activation(F.elemwise_add(x, residual), act_type="relu")


def resblock() -> HybridBlock:
    """Stem, two basic residual blocks, global average pool, Dense(10)."""
    net = nn.HybridSequential(prefix="resblock_")
    with net.name_scope():
        net.add(nn.Conv2D(16, 3, padding=1, use_bias=False), nn.BatchNorm(),
                nn.Activation("relu"), BasicBlock(16, 1, False, prefix="stage1_"),
                BasicBlock(32, 2, True, prefix="stage2_"), nn.GlobalAvgPool2D(), nn.Flatten(),
                nn.Dense(10))
    return net


def _branch(prefix: str, *layers: Any) -> nn.HybridSequential:
    branch = nn.HybridSequential(prefix=prefix)
    with branch.name_scope():
        branch.add(*[layer() for layer in layers])
    return branch


def concurrent_cnn() -> HybridBlock:
    """Stem, HybridConcurrent of five branches, ceil-mode max pool, global pool, Dense(5)."""
    net = nn.HybridSequential(prefix="concurrent_cnn_")
    with net.name_scope():
        net.add(nn.Conv2D(8, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"))
        mixed = nn.HybridConcurrent(axis=1, prefix="mixed_")
        with mixed.name_scope():
            mixed.add(_branch("b1x1_", lambda: nn.Conv2D(4, 1)),
                      _branch("b3x3_", lambda: nn.Conv2D(6, 3, padding=1), nn.BatchNorm,
                              lambda: nn.Activation("relu")),
                      _branch("bmax_", lambda: nn.MaxPool2D(3, strides=1, padding=1),
                              lambda: nn.Conv2D(4, 1)),
                      _branch("bavg_", lambda: nn.AvgPool2D(3, strides=1, padding=1,
                                                            count_include_pad=False),
                              nn.BatchNorm, lambda: nn.Conv2D(3, 1)),
                      nn.Identity())
        net.add(mixed, nn.MaxPool2D(2, ceil_mode=True), nn.GlobalAvgPool2D(), nn.Dense(5))
    return net


class MultiIO(HybridBlock):
    """Two inputs, two outputs; ``dense2`` is applied twice."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense0 = nn.Dense(6, activation="tanh")
            self.dense1 = nn.Dense(6)
            self.dense2 = nn.Dense(6, flatten=False)
            self.dense3 = nn.Dense(3)
            self.conv = nn.Conv2D(4, 3, padding=1)
            self.bn = nn.BatchNorm()

    def hybrid_forward(self, F: Any, x0: Any, x1: Any) -> Any:  # noqa: N803
        hidden = self.dense0(x0)
        first = self.dense2(hidden)
        features = self.dense1(F.relu(self.bn(self.conv(x1))))
        total = first + self.dense2(features)
        return (F.softmax(self.dense3(total), axis=-1),
                F.concat(hidden, F.sigmoid(features), dim=1))


def multi_io() -> HybridBlock:
    """The two-input, two-output model."""
    return MultiIO(prefix="multi_io_")


class TextLSTM(HybridBlock):
    """Embedding(50, 16) -> LSTM(32, NTC) -> last step -> Dense(3)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.embedding = nn.Embedding(50, 16)
            self.lstm = rnn.LSTM(32, layout="NTC")
            self.dense = nn.Dense(3)

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        out = self.lstm(self.embedding(x))
        return self.dense(F.slice_axis(out, axis=1, begin=-1, end=None))


def text_lstm() -> HybridBlock:
    """The LSTM text classifier."""
    return TextLSTM(prefix="text_lstm_")


BUILDERS = {"seed_mlp": seed_mlp, "hybridnet": hybridnet, "lenet": lenet,
            "resblock": resblock, "concurrent_cnn": concurrent_cnn, "multi_io": multi_io,
            "text_lstm": text_lstm}
