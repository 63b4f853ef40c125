"""Tiny hand-built graphs for the compiler tests."""

from __future__ import annotations

import numpy as np

from engine.graph.ir import Entry, Graph, make_node

RNG = np.random.default_rng(7)


def variable(name: str):
    return make_node("null", name)


def conv_bn_relu(channels: int = 4) -> tuple[Graph, dict[str, np.ndarray]]:
    """data → Convolution(3x3, pad 1) → BatchNorm → relu → FullyConnected, with constants."""
    nodes = [
        variable("data"), variable("w"), variable("b"),
        make_node("Convolution", "conv", {"kernel": "(3, 3)", "pad": "(1, 1)",
                                          "num_filter": str(channels)},
                  (Entry(0), Entry(1), Entry(2))),
        variable("gamma"), variable("beta"), variable("mean"), variable("var"),
        make_node("BatchNorm", "bn", {"fix_gamma": "False", "eps": "1e-05"},
                  (Entry(3), Entry(4), Entry(5), Entry(6), Entry(7))),
        make_node("relu", "relu", {}, (Entry(8),)),
        variable("fw"), variable("fb"),
        make_node("FullyConnected", "fc", {"num_hidden": "3"}, (Entry(9), Entry(10), Entry(11))),
    ]
    constants = {
        "w": RNG.normal(size=(channels, 2, 3, 3)).astype(np.float32),
        "b": RNG.normal(size=channels).astype(np.float32),
        "gamma": RNG.uniform(0.5, 1.5, channels).astype(np.float32),
        "beta": RNG.normal(size=channels).astype(np.float32),
        "mean": RNG.normal(size=channels).astype(np.float32),
        "var": RNG.uniform(0.5, 2, channels).astype(np.float32),
        "fw": RNG.normal(size=(3, channels * 25)).astype(np.float32),
        "fb": RNG.normal(size=3).astype(np.float32),
    }
    return Graph(tuple(nodes), (Entry(12),), constants=constants), constants


def mlp(widths: tuple[int, ...] = (512, 256, 128, 2)) -> tuple[Graph, dict[str, np.ndarray]]:
    """The seed MLP's shape: FullyConnected + relu layers, as Gluon exports Dense(relu)."""
    nodes = [variable("data")]
    constants = {}
    current = Entry(0)
    for layer, (fan_in, fan_out) in enumerate(zip(widths, widths[1:])):
        weight, bias = f"fc{layer}_weight", f"fc{layer}_bias"
        constants[weight] = RNG.normal(size=(fan_out, fan_in)).astype(np.float32) / fan_in ** .5
        constants[bias] = RNG.normal(size=fan_out).astype(np.float32)
        nodes += [variable(weight), variable(bias)]
        nodes.append(make_node("FullyConnected", f"fc{layer}", {"num_hidden": str(fan_out)},
                               (current, Entry(len(nodes) - 2), Entry(len(nodes) - 1))))
        current = Entry(len(nodes) - 1)
        if layer < len(widths) - 2:
            nodes.append(make_node("relu", f"relu{layer}", {}, (current,)))
            current = Entry(len(nodes) - 1)
    return Graph(tuple(nodes), (current,), constants=constants), constants
